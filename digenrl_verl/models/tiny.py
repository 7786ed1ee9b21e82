"""Tiny random diffusers model directories that load through the real `from_pretrained` path on CPU.

`build_tiny_model_dir(architecture, path, seed)` writes a complete diffusers directory (model_index.json,
every component via `save_pretrained`, tokenizers built in memory) from the architecture's
`ModelSpec.tiny_builder` (defined next to its adapter). The sizes are the smallest configs of each diffusers
class that still exercise every code path the adapter uses: every denoiser call takes milliseconds and a
directory is < 1 MB. Nothing is downloaded. The same (architecture, seed, size) always writes the same weights.
`ModelSpec.tiny_sampling` holds the matching small sampling settings: `load_adapter(path, **spec.tiny_sampling)`.

Sizes (`ModelSpec.tiny_sizes`):
  - "unit" (every architecture): the smallest configs, for unit tests.
  - "bench" (FLUX only): 2 double + 2 single blocks, 2 heads x 32 dims; 64 latent tokens at 128 px
    (load with height=width=128); big enough that attention and MLP costs dominate python overhead (TSP
    benchmark).

CLI: `python -m digenrl_verl.models.tiny <architecture> <path> [--seed N] [--size unit|bench]`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from digenrl_verl.models.spec import get_model_spec, list_architectures


def tiny_architectures() -> list[str]:
    """The registered architectures that have a tiny builder, sorted."""
    return [name for name in list_architectures() if get_model_spec(name).tiny_builder is not None]


def tiny_sizes() -> list[str]:
    """Every size some tiny builder accepts, sorted."""
    return sorted({size for name in tiny_architectures() for size in get_model_spec(name).tiny_sizes})


def build_tiny_model_dir(architecture: str, path: str | Path, seed: int = 0, size: str = "unit") -> Path:
    """Write a tiny random diffusers model directory for `architecture` (a model_index.json `_class_name`).

    Args:
        architecture: one of `tiny_architectures()`.
        path: target directory (created; existing files with the same names are overwritten).
        seed: weights are drawn under `torch.manual_seed(seed)` (the global RNG state is restored after).
        size: one of the architecture's `ModelSpec.tiny_sizes` ("unit", or "bench" for FluxPipeline).
    Returns:
        The directory path.
    """
    valid = tiny_architectures()
    if architecture not in valid:
        raise ValueError(f"build_tiny_model_dir: unknown architecture {architecture!r}; valid: {valid}")
    spec = get_model_spec(architecture)
    if size not in spec.tiny_sizes:
        raise ValueError(f"build_tiny_model_dir: size={size!r} is not available for {architecture}; "
                         f"valid: {list(spec.tiny_sizes)}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        parts = spec.tiny_builder(size)
        pipeline_cls = parts.pop("pipeline_cls")
        pipe = pipeline_cls(**parts)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m digenrl_verl.models.tiny", description=__doc__.split("\n")[0])
    parser.add_argument("architecture", choices=tiny_architectures())
    parser.add_argument("path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=tiny_sizes(), default="unit")
    args = parser.parse_args(argv)
    import digenrl_verl.platform.quiet  # noqa: F401  (the torchvision notice, diffusers' bars)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards"
    out = build_tiny_model_dir(args.architecture, args.path, seed=args.seed, size=args.size)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
