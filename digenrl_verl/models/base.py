"""The contract between model-agnostic diffusion math and a concrete diffusers architecture.

`diffusion/` (SDE steps, rollout, losses, TSP) talks to a model only through `DiffusionAdapter`.
Everything is expressed in σ ∈ [0, 1] (rectified flow: x_σ = (1−σ)·x0 + σ·ε, v ≈ ε − x0); the adapter
owns the conversion to what its transformer is fed (σ for FLUX, σ·1000 for the others), guidance
(CFG / true-CFG / embedded), latent packing and decoding.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Sequence

import torch
from torch import nn


@dataclass
class Conditioning:
    """Prompt conditioning for a batch, as the denoiser consumes it.

    Attributes:
        tensors: batch-first tensors, each of shape [B, ...] (prompt embeddings, masks, pooled
            embeddings, and their negative-prompt twins where the model uses CFG).
        shared: values that are the same for every row and are not indexed by the batch
            (e.g. FLUX `txt_ids`, Qwen-Image `img_shapes` template). Never batch-dependent.
    """

    tensors: dict[str, torch.Tensor]
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        sizes = {t.shape[0] for t in self.tensors.values()}
        if len(sizes) != 1:
            raise ValueError(f"Conditioning tensors disagree on the batch size: {sizes}")
        return sizes.pop()

    def index_select(self, index: torch.Tensor | Sequence[int]) -> "Conditioning":
        idx = torch.as_tensor(index, dtype=torch.long)
        tensors = {k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors.items()}
        return Conditioning(tensors, dict(self.shared))

    def repeat_interleave(self, repeats: int) -> "Conditioning":
        """Row i becomes rows i*repeats .. i*repeats+repeats-1 (how TSP stacks timesteps per sample)."""
        tensors = {k: v.repeat_interleave(repeats, dim=0) for k, v in self.tensors.items()}
        return Conditioning(tensors, dict(self.shared))

    def to(self, device: torch.device | str) -> "Conditioning":
        return Conditioning({k: v.to(device) for k, v in self.tensors.items()}, dict(self.shared))

    @staticmethod
    def cat(parts: Sequence["Conditioning"]) -> "Conditioning":
        if not parts:
            raise ValueError("Conditioning.cat needs at least one part")
        keys = parts[0].tensors.keys()
        return Conditioning({k: torch.cat([p.tensors[k] for p in parts], dim=0) for k in keys}, dict(parts[0].shared))


class DiffusionAdapter(abc.ABC):
    """One diffusers architecture seen through the σ-space interface the RL math needs.

    A subclass names the `_class_name` of the diffusers `model_index.json` it serves (`architecture`, e.g.
    "FluxPipeline") and is registered through a `ModelSpec` (`digenrl_verl.models.spec`). All returned tensors
    are fp32 unless noted.
    """

    architecture: ClassVar[str]  # the model_index.json `_class_name` this adapter serves
    is_video: ClassVar[bool] = False  # decode returns [B, T, 3, H, W] instead of [B, 3, H, W]
    transformer: nn.Module

    # -- prompts and latents -------------------------------------------------------------------
    @abc.abstractmethod
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Text encoders → conditioning for `velocity` (negative prompt included where guidance needs it)."""

    @abc.abstractmethod
    def latent_shape(self) -> tuple[int, ...]:
        """Per-sample shape of the latents `velocity` takes (packed for FLUX / Qwen-Image)."""

    def initial_noise(self, generators: Sequence[torch.Generator]) -> torch.Tensor:
        """x at σ=1: one standard normal draw per sample from its own generator, [B, *latent_shape]."""
        shape = self.latent_shape()
        return torch.stack([torch.randn(shape, generator=g, dtype=torch.float32) for g in generators])

    @abc.abstractmethod
    def sigmas(self, num_steps: int) -> torch.Tensor:
        """The sampling schedule σ_0=1 > … > σ_N=0 as fp32 [num_steps + 1] (shift applied as the model does)."""

    # -- the denoiser ---------------------------------------------------------------------------
    @abc.abstractmethod
    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Guided velocity v(x, σ) for a batch whose rows may sit at different σ.

        Args:
            x: latents [B, *latent_shape].
            sigma: fp32 [B], one σ per row (TSP stacks different timesteps of the same sample).
            cond: conditioning with batch size B.
        Returns:
            fp32 [B, *latent_shape], differentiable w.r.t. the trainable parameters.
        """

    @abc.abstractmethod
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Clean latents → uint8 images [B, 3, H, W] (videos: [B, T, 3, H, W])."""

    # -- training -------------------------------------------------------------------------------
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Within this context `velocity` is the frozen reference policy (LoRA disabled, or a frozen copy)."""
        raise NotImplementedError(f"{type(self).__name__} has no reference policy")
        yield  # pragma: no cover
