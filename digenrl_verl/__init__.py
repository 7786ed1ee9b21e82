"""digenrl_verl: disaggregated RL post-training of diffusion models on verl."""

__version__ = "0.1.0"
