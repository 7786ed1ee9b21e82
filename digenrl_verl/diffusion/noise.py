"""Deterministic per-sample randomness, so any worker that generates a sample draws the same trajectory.

A sample is identified by its `SampleKey` (global step, prompt uid, index within the group). Its seeds are
SHA-256 hashes of (base seed, stream, key) — stable across processes, Python versions and hosts, unlike
`hash()`. Three independent streams per sample:

* ``init``   — the initial noise x at σ=1 (with `init_same_noise`, keyed on (step, uid) only, so the whole
  group starts from the same noise, as DanceGRPO's `--init_same_noise` / Flow-GRPO's `same_latent`);
* ``sde``    — every SDE draw of the sample, in step order;
* ``select`` — the sample's timestep selection (window start, DanceGRPO permutation).

Separate streams keep each one independent of the others' consumption (e.g. a different window does not
shift the SDE noise). Determinism: for the same key, config and policy weights, the initial noise, every draw
and the selection are bit-identical wherever the sample is generated. The model forward, however, runs on a
batch: if a sample is generated next to different neighbours (different batch shape or order), kernels may
reduce in a different order, so its latents can differ by fp32 rounding (≈1e-7 relative per step). Generating
the same batch composition is bit-identical.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch

STREAMS = ("init", "sde", "select")


@dataclass(frozen=True)
class SampleKey:
    """Identity of one sample: global step, prompt uid (the GRPO group id) and index within the group."""

    step: int
    uid: str
    index: int


def sample_seed(base_seed: int, key: SampleKey, stream: str, *, shared_group: bool = False) -> int:
    """A 63-bit seed for `stream` of sample `key`; `shared_group` drops the index (same seed for the group)."""
    if stream not in STREAMS:
        raise ValueError(f"unknown noise stream {stream!r}; valid: {list(STREAMS)}")
    index = "*" if shared_group else str(int(key.index))
    text = f"digenrl/{stream}/{int(base_seed)}/{int(key.step)}/{key.uid}/{index}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") & ((1 << 63) - 1)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@dataclass
class SampleGenerators:
    """One generator per sample and stream; lists of length B, in batch order."""

    init: list[torch.Generator]
    sde: list[torch.Generator]
    select: list[torch.Generator]


def make_sample_generators(base_seed: int, keys: Sequence[SampleKey], *, init_same_noise: bool = False,
                           device: torch.device | str = "cpu") -> SampleGenerators:
    """Fresh generators for the samples `keys` (CPU by default: CPU draws are identical on every host)."""
    def gens(stream: str, shared: bool = False) -> list[torch.Generator]:
        return [make_generator(sample_seed(base_seed, k, stream, shared_group=shared), device) for k in keys]

    return SampleGenerators(init=gens("init", init_same_noise), sde=gens("sde"), select=gens("select"))
