"""A small real denoiser implementing DiffusionAdapter, for model-agnostic tests of diffusion/.

It is a genuine torch network (conv + FiLM on σ and a prompt embedding), trained for real in the learning
test; no math is mocked. Latents are images themselves: [3, 8, 8] in [-1, 1], decoded by 2× upsampling.
"""

from __future__ import annotations

import contextlib
import copy
import zlib
from typing import Iterator, Sequence

import pytest
import torch
from torch import nn

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
from digenrl_verl.models.base import Conditioning, DiffusionAdapter

torch.set_num_threads(1)


class TinyVelocityNet(nn.Module):
    def __init__(self, channels: int = 3, hidden: int = 16, emb_dim: int = 8) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(channels, hidden, 3, padding=1)
        self.film = nn.Linear(emb_dim + 8, 2 * hidden)
        self.conv_mid = nn.Conv2d(hidden, hidden, 3, padding=1)
        self.conv_out = nn.Conv2d(hidden, channels, 3, padding=1)
        self.register_buffer("freqs", torch.arange(1, 5, dtype=torch.float32) * torch.pi)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        ang = sigma[:, None] * self.freqs
        t = torch.cat([ang.sin(), ang.cos(), emb], dim=1)
        scale, shift = self.film(t).chunk(2, dim=1)
        h = torch.nn.functional.silu(self.conv_in(x))
        h = h * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
        h = torch.nn.functional.silu(self.conv_mid(h))
        return self.conv_out(h)


class TinyAdapter(DiffusionAdapter):
    architecture = "TinyTestPipeline"

    def __init__(self, seed: int = 0, shift: float = 3.0, emb_dim: int = 8, vocab: int = 64) -> None:
        torch.manual_seed(seed)
        self.transformer = TinyVelocityNet(emb_dim=emb_dim)
        self.text_encoder = nn.Embedding(vocab, emb_dim).requires_grad_(False)
        self._ref = copy.deepcopy(self.transformer).requires_grad_(False)
        self._use_ref = False
        self.shift = shift
        self.vocab = vocab

    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        rows = []
        for p in prompts:
            ids = torch.tensor([zlib.crc32(w.encode()) % self.vocab for w in p.lower().split()] or [0])
            rows.append(self.text_encoder(ids).mean(0))
        return Conditioning({"prompt_embeds": torch.stack(rows)})

    def latent_shape(self) -> tuple[int, ...]:
        return (3, 8, 8)

    def sigmas(self, num_steps: int) -> torch.Tensor:
        s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
        return (self.shift * s / (1 + (self.shift - 1) * s)).to(torch.float32)

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        net = self._ref if self._use_ref else self.transformer
        return net(x.float(), sigma.float(), cond.tensors["prompt_embeds"]).float()

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        img = torch.nn.functional.interpolate(x.float(), scale_factor=2, mode="nearest")
        return ((img.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        self._use_ref = True
        try:
            yield
        finally:
            self._use_ref = False


@pytest.fixture
def tiny_adapter() -> TinyAdapter:
    return TinyAdapter(seed=0)


@pytest.fixture
def make_tiny_adapter():
    return TinyAdapter


@pytest.fixture
def off_policy_rollout(tiny_adapter):
    """off_policy_rollout(scale) -> (cond, traj): 3 prompt groups x 2 samples sampled by `tiny_adapter` (SDE, 5
    steps), whose trainable weights then move by seeded noise of std `scale`, one "optimizer step" away from the
    sampling policy (the rows' ratios leave 1: what stale TCSS rows look like)."""

    def make(scale: float):
        cfg = RolloutConfig(num_inference_steps=5, sde_type="sde", noise_level=0.7)
        cond = tiny_adapter.encode_prompts(["a red cube", "a blue sphere", "a green cone"] * 2)
        traj = rollout(tiny_adapter, cond, [SampleKey(1, f"u{i % 3}", i // 3) for i in range(6)], cfg)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in tiny_adapter.trainable_parameters():
                p.add_(torch.randn(p.shape, generator=g) * scale)
        return cond, traj

    return make
