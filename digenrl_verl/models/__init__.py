"""Model adapters over diffusers classes, tiny builders, and the architecture registry."""
