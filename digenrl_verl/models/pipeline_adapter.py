"""Shared machinery of the diffusers-backed adapters: loading, config defaults, sigmas, decoding, training.

A `PipelineAdapter` owns one loaded diffusers pipeline (`self.pipeline`: text encoders, tokenizers, VAE,
scheduler) and the denoiser it trains (`self.transformer`: the pipeline's transformer, wrapped in a peft
model for LoRA). Subclasses (one module per architecture) implement prompt encoding, the guided velocity and
latent (un)packing the way their diffusers pipeline does; this module keeps everything they share.

Conventions (see `base.py`): σ ∈ [0, 1]; all returned tensors are fp32 (masks: int64); conditioning
tensors are stored fp32 and cast to the denoiser dtype inside `velocity`.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from digenrl_verl.models.base import Conditioning, DiffusionAdapter
from digenrl_verl.models.config import PIPELINE_KEY, LoraConfig, PipelineConfig
from digenrl_verl.models.lora import apply_lora, load_trainable_state, named_trainable_parameters, trainable_state
from digenrl_verl.models.spec import get_model_spec

logger = logging.getLogger(__name__)


def calculate_shift(image_seq_len: int, scheduler_config: Mapping[str, Any]) -> float:
    """The dynamic-shift exponent mu the FLUX / Qwen-Image pipelines derive from the image token count."""
    base_len = scheduler_config.get("base_image_seq_len", 256)
    max_len = scheduler_config.get("max_image_seq_len", 4096)
    base_shift = scheduler_config.get("base_shift", 0.5)
    max_shift = scheduler_config.get("max_shift", 1.15)
    slope = (max_shift - base_shift) / (max_len - base_len)
    return image_seq_len * slope + (base_shift - slope * base_len)


def to_uint8(pixels: torch.Tensor) -> torch.Tensor:
    """VAE output in [-1, 1] → uint8 in [0, 255], rounded as diffusers' `postprocess(output_type="np")`."""
    return ((pixels.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)


class PipelineAdapter(DiffusionAdapter):
    """Base of the five diffusers adapters; construct through `digenrl_verl.models.load_adapter`.

    Attributes:
        pipeline: the loaded diffusers pipeline (its `transformer` carries the LoRA layers, if any).
        transformer: what `velocity` calls: a peft model (LoRA) or the plain transformer (full fine-tune).
        denoiser: the underlying diffusers transformer module (for hooks and config), LoRA layers included.
        config: the resolved `PipelineConfig` (no None left except where the architecture has no such knob).
        lora: the `LoraConfig` the adapter was built with.
    """

    # What the transformer's `timestep` argument is, as a multiple of σ (the pipeline's convention).
    timestep_scale: ClassVar[float] = 1000.0
    # Pipeline knobs this architecture has (others must stay None / neutral).
    uses_guidance_scale: ClassVar[bool] = True
    uses_true_cfg_scale: ClassVar[bool] = False

    def __init__(
        self,
        pipeline: Any,
        *,
        config: PipelineConfig | None = None,
        lora: LoraConfig | None = None,
        keep_reference: bool = True,
        device: torch.device | str = "cpu",
        gradient_checkpointing: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.lora = lora or LoraConfig()
        self.device = torch.device(device)
        for component in pipeline.components.values():
            if isinstance(component, nn.Module):
                component.requires_grad_(False)
                component.eval()
        self.denoiser: nn.Module = pipeline.transformer
        self.transformer = apply_lora(self.denoiser, self.lora, self.architecture,
                                      get_model_spec(self.architecture).lora_targets, self._unused_modules())
        self._reference: nn.Module | None = None
        if not self.lora.enabled and keep_reference:
            self._reference = copy.deepcopy(self.denoiser).requires_grad_(False).to(self.device)
        if gradient_checkpointing:
            self.denoiser.enable_gradient_checkpointing()
        pipeline.to(self.device)
        pipeline.set_progress_bar_config(disable=True)
        self.dtype: torch.dtype = self.denoiser.dtype
        self.config = self._resolve_config(config or PipelineConfig())

    def _unused_modules(self) -> tuple[str, ...]:
        """Full names of denoiser modules whose outputs never reach the velocity (kept frozen)."""
        return self.unused_modules(self.denoiser)

    @classmethod
    def unused_modules(cls, denoiser: torch.nn.Module) -> tuple[str, ...]:
        """`_unused_modules` of an adapter over `denoiser` (a meta-device copy will do): what another engine
        leaves out of the trainable weights to hold the same set as this adapter's trainers."""
        return ()

    # -- configuration ------------------------------------------------------------------------------
    def _call_default(self, name: str) -> Any:
        params = inspect.signature(type(self.pipeline).__call__).parameters
        return params[name].default if name in params else None

    def _default_size(self) -> tuple[int, int]:
        size = self.pipeline.default_sample_size * self.pipeline.vae_scale_factor
        return size, size

    def _resolve_config(self, cfg: PipelineConfig) -> PipelineConfig:
        """Fill None fields with the pipeline's defaults, then validate for this architecture."""
        height, width = self._default_size()
        values = dict(
            height=cfg.height or height,
            width=cfg.width or width,
            num_inference_steps=cfg.num_inference_steps or self._call_default("num_inference_steps"),
            max_sequence_length=cfg.max_sequence_length or self._call_default("max_sequence_length"),
            guidance_scale=cfg.guidance_scale,
            true_cfg_scale=cfg.true_cfg_scale,
            num_frames=cfg.num_frames,
        )
        if self.uses_guidance_scale:
            if values["guidance_scale"] is None:
                values["guidance_scale"] = self._call_default("guidance_scale")
        elif values["guidance_scale"] is not None:
            logger.warning("%s: %s.guidance_scale=%s is ignored (the model has no guidance embedding)",
                           self.architecture, PIPELINE_KEY, values["guidance_scale"])
            values["guidance_scale"] = None
        if self.uses_true_cfg_scale:
            if values["true_cfg_scale"] is None:
                values["true_cfg_scale"] = self._call_default("true_cfg_scale")
        else:
            tcfg = values["true_cfg_scale"]
            if tcfg is not None and tcfg > 1 and tcfg != values["guidance_scale"]:
                raise ValueError(
                    f"{PIPELINE_KEY}.true_cfg_scale={tcfg} is not used by {self.architecture}; its CFG scale is "
                    f"{PIPELINE_KEY}.guidance_scale (now {values['guidance_scale']}). Set true_cfg_scale to 1.0/null."
                )
            values["true_cfg_scale"] = None
        if self.is_video:
            if values["num_frames"] is None:
                values["num_frames"] = self._call_default("num_frames")
        elif values["num_frames"] not in (None, 1):
            raise ValueError(f"{PIPELINE_KEY}.num_frames={values['num_frames']}: {self.architecture} makes images; "
                             "use 1 or null")
        else:
            values["num_frames"] = None
        resolved = PipelineConfig(negative_prompt=cfg.negative_prompt, host_sigmas=cfg.host_sigmas, **values)
        self._validate_config(resolved)
        return resolved

    def _validate_config(self, cfg: PipelineConfig) -> None:
        multiple = self._size_multiple()
        for name in ("height", "width"):
            value = getattr(cfg, name)
            if value % multiple:
                raise ValueError(f"{PIPELINE_KEY}.{name}={value} must be a multiple of {multiple} for "
                                 f"{self.architecture} (VAE compression x patch size)")

    def _size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor * 2

    # -- schedule -----------------------------------------------------------------------------------
    def _set_timesteps_kwargs(self, num_steps: int) -> dict[str, Any]:
        """Arguments the pipeline passes to `scheduler.set_timesteps` (sigmas / mu where it sets them)."""
        return {"num_inference_steps": num_steps}

    def sigmas(self, num_steps: int | None = None) -> torch.Tensor:
        """σ schedule [num_steps + 1] from a copy of the model's own scheduler, set up as the pipeline does."""
        num_steps = self.config.num_inference_steps if num_steps is None else num_steps
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
        host = dict(self.config.host_sigmas).get(num_steps)
        if host is not None:  # the host trainer's schedule (`PipelineConfig.host_sigmas`)
            sigmas = torch.tensor(host, dtype=torch.float32)
            assert sigmas.shape == (num_steps + 1,) and sigmas[-1] == 0, f"unexpected host sigmas {sigmas}"
            return sigmas
        scheduler = copy.deepcopy(self.pipeline.scheduler)
        scheduler.set_timesteps(**self._set_timesteps_kwargs(num_steps))
        sigmas = torch.as_tensor(scheduler.sigmas, dtype=torch.float32).cpu()
        assert sigmas.shape == (num_steps + 1,) and sigmas[-1] == 0, f"unexpected scheduler sigmas {sigmas}"
        return sigmas

    @staticmethod
    def _linspace_sigmas(num_steps: int) -> np.ndarray:
        return np.linspace(1.0, 1 / num_steps, num_steps)

    # -- velocity -----------------------------------------------------------------------------------
    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        shape = self.latent_shape()
        if x.dim() != len(shape) + 1 or tuple(x.shape[1:]) != shape:
            raise ValueError(f"{self.architecture}.velocity: x must be [B, {', '.join(map(str, shape))}], "
                             f"got {tuple(x.shape)}")
        batch = x.shape[0]
        if sigma.shape != (batch,):
            raise ValueError(f"{self.architecture}.velocity: sigma must be [B]=[{batch}], got {tuple(sigma.shape)}")
        if cond.batch_size != batch:
            raise ValueError(f"{self.architecture}.velocity: conditioning has batch {cond.batch_size}, x has {batch}")
        v = self._velocity(x.to(self.device, self.dtype), sigma.to(self.device, torch.float32), cond)
        return v.float()

    def _velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        raise NotImplementedError

    def _t(self, sigma: torch.Tensor) -> torch.Tensor:
        """The transformer's `timestep` input for per-row σ."""
        return (sigma * self.timestep_scale).to(self.dtype)

    def _c(self, cond: Conditioning, key: str) -> torch.Tensor:
        """A conditioning tensor on the device, floats cast to the denoiser dtype."""
        t = cond.tensors[key].to(self.device)
        return t.to(self.dtype) if t.is_floating_point() else t

    @staticmethod
    def _cfg(uncond: torch.Tensor, cond: torch.Tensor, scale: float) -> torch.Tensor:
        return uncond + scale * (cond - uncond)

    # -- prompts and decoding -----------------------------------------------------------------------
    def _check_prompts(self, prompts: Sequence[str]) -> list[str]:
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts) or len(prompts) == 0:
            raise ValueError(f"{self.architecture}.encode_prompts: expected a non-empty list of strings, "
                             f"got {prompts!r}")
        return list(prompts)

    @staticmethod
    def _f32(t: torch.Tensor) -> torch.Tensor:
        return t.detach().float() if t.is_floating_point() else t.detach().long()

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        shape = self.latent_shape()
        if x.dim() != len(shape) + 1 or tuple(x.shape[1:]) != shape:
            raise ValueError(f"{self.architecture}.decode: x must be [B, {', '.join(map(str, shape))}], "
                             f"got {tuple(x.shape)}")
        with torch.no_grad():
            vae = self.pipeline.vae
            pixels = self._decode(x.to(self.device, torch.float32), vae)
        return to_uint8(pixels).cpu()

    def _decode(self, x: torch.Tensor, vae: nn.Module) -> torch.Tensor:
        """Latents → pixels in [-1, 1], [B, 3, H, W] or [B, T, 3, H, W]."""
        raise NotImplementedError

    # -- training -----------------------------------------------------------------------------------
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for _, p in named_trainable_parameters(self.transformer)]

    def trainable_state(self, device: torch.device | str | None = "cpu") -> dict[str, torch.Tensor]:
        """`{name: tensor}` copies of the trainable parameters (LoRA weights, or the whole transformer)."""
        return trainable_state(self.transformer, device)

    def load_trainable_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the trainable parameters (weight sync); the reference policy is not touched."""
        load_trainable_state(self.transformer, state)

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """LoRA: the adapter disabled (peft `disable_adapter`); full fine-tune: the frozen copy taken at load."""
        if self.lora.enabled:
            with self.transformer.disable_adapter():
                yield
            return
        if self._reference is None:
            raise ValueError(f"{self.architecture}: no reference policy kept; load with keep_reference=True "
                             "(needed for the KL term with full fine-tuning)")
        policy = self.transformer
        self.transformer = self._reference
        try:
            yield
        finally:
            self.transformer = policy


class VideoLatentAdapter(PipelineAdapter):
    """Video pipelines whose VAE keeps the first frame and compresses the rest in time (Wan, HunyuanVideo):
    latents [C, (F−1)/t + 1, H/s, W/s], so `num_frames` must be 1 + k·t; the size defaults are `__call__`'s."""

    is_video = True

    def _default_size(self) -> tuple[int, int]:
        return self._call_default("height"), self._call_default("width")

    def _validate_config(self, cfg: Any) -> None:
        super()._validate_config(cfg)
        ft = self.pipeline.vae_scale_factor_temporal
        if (cfg.num_frames - 1) % ft:
            raise ValueError(f"{PIPELINE_KEY}.num_frames={cfg.num_frames} must be 1 + k·{ft} for {self.architecture}")

    def latent_shape(self) -> tuple[int, ...]:
        fs, ft = self.pipeline.vae_scale_factor_spatial, self.pipeline.vae_scale_factor_temporal
        c = self.denoiser.config.in_channels
        return (c, (self.config.num_frames - 1) // ft + 1, self.config.height // fs, self.config.width // fs)


class PackedLatentAdapter(PipelineAdapter):
    """FLUX-style token latents: 2x2 patches of the VAE latent packed into tokens, dynamic shift from the token
    count, linear σ schedule, optional true CFG (shared by FLUX.1 and Qwen-Image)."""

    @property
    def do_true_cfg(self) -> bool:
        return self.config.true_cfg_scale > 1

    def _latent_hw(self) -> tuple[int, int]:
        f = self.pipeline.vae_scale_factor
        return 2 * (self.config.height // (f * 2)), 2 * (self.config.width // (f * 2))

    def latent_shape(self) -> tuple[int, ...]:
        h, w = self._latent_hw()
        return ((h // 2) * (w // 2), self.denoiser.config.in_channels)

    def _set_timesteps_kwargs(self, num_steps: int) -> dict[str, Any]:
        mu = calculate_shift(self.latent_shape()[0], self.pipeline.scheduler.config)
        return {"sigmas": self._linspace_sigmas(num_steps), "mu": mu}
