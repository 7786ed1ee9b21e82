"""Stable Diffusion 3 / 3.5 (`StableDiffusion3Pipeline`): CFG as one batched forward of [uncond; cond].

Conditioning keys (B = prompts, L = 77 CLIP tokens + max_sequence_length T5 tokens):
    prompt_embeds [B, L, joint_attention_dim], pooled_prompt_embeds [B, pooled_projection_dim];
    with CFG (guidance_scale > 1) also negative_prompt_embeds / negative_pooled_prompt_embeds, same shapes.
Latents: [C, H/8, W/8] (unpacked). Timestep fed: σ·1000.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from digenrl_verl.models import _tiny_tokenizers as toks
from digenrl_verl.models._tiny_components import clip_text_encoder, kl_vae, t5_encoder
from digenrl_verl.models.base import Conditioning
from digenrl_verl.models.lora import JOINT_ATTENTION
from digenrl_verl.models.pipeline_adapter import PipelineAdapter, calculate_shift
from digenrl_verl.models.spec import ModelSpec, register_model


class SD3Adapter(PipelineAdapter):
    architecture = "StableDiffusion3Pipeline"
    timestep_scale = 1000.0

    @property
    def do_cfg(self) -> bool:
        return self.config.guidance_scale > 1

    def _size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor * self.denoiser.config.patch_size

    def latent_shape(self) -> tuple[int, ...]:
        f = self.pipeline.vae_scale_factor
        return (self.denoiser.config.in_channels, self.config.height // f, self.config.width // f)

    def _set_timesteps_kwargs(self, num_steps: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"num_inference_steps": num_steps}
        sched_cfg = self.pipeline.scheduler.config
        if sched_cfg.get("use_dynamic_shifting", False):
            _, h, w = self.latent_shape()
            p = self.denoiser.config.patch_size
            kwargs["mu"] = calculate_shift((h // p) * (w // p), {"max_shift": 1.16, **sched_cfg})
        return kwargs

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        prompts = self._check_prompts(prompts)
        embeds, neg_embeds, pooled, neg_pooled = self.pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=self.device,
            do_classifier_free_guidance=self.do_cfg,
            negative_prompt=[self.config.negative_prompt] * len(prompts),
            max_sequence_length=self.config.max_sequence_length,
        )
        tensors = {"prompt_embeds": self._f32(embeds), "pooled_prompt_embeds": self._f32(pooled)}
        if self.do_cfg:
            tensors["negative_prompt_embeds"] = self._f32(neg_embeds)
            tensors["negative_pooled_prompt_embeds"] = self._f32(neg_pooled)
        return Conditioning(tensors)

    def _velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        embeds, pooled = self._c(cond, "prompt_embeds"), self._c(cond, "pooled_prompt_embeds")
        t = self._t(sigma)
        if not self.do_cfg:
            return self.transformer(hidden_states=x, timestep=t, encoder_hidden_states=embeds,
                                    pooled_projections=pooled, return_dict=False)[0]
        out = self.transformer(
            hidden_states=torch.cat([x, x]),
            timestep=torch.cat([t, t]),
            encoder_hidden_states=torch.cat([self._c(cond, "negative_prompt_embeds"), embeds]),
            pooled_projections=torch.cat([self._c(cond, "negative_pooled_prompt_embeds"), pooled]),
            return_dict=False,
        )[0]
        uncond, cond_v = out.float().chunk(2)
        return self._cfg(uncond, cond_v, self.config.guidance_scale)

    def _decode(self, x: torch.Tensor, vae: nn.Module) -> torch.Tensor:
        latents = x / vae.config.scaling_factor + vae.config.shift_factor
        return vae.decode(latents.to(vae.dtype), return_dict=False)[0]


def build_tiny(size: str) -> dict[str, Any]:
    """2-block SD3 transformer (the last block of an SD3 transformer has no text-stream output layer,
    `to_add_out`, so one block would leave a default LoRA target unexercised), CLIP x2 + T5, scheduler config
    as SD3.5 ships it."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
        joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=64, out_channels=4,
        pos_embed_max_size=16,
    )
    return dict(
        pipeline_cls=StableDiffusion3Pipeline,
        transformer=transformer,
        vae=kl_vae(4, sd3_factors=True),
        text_encoder=clip_text_encoder(16, 32), tokenizer=toks.clip_tokenizer(),
        text_encoder_2=clip_text_encoder(16, 32), tokenizer_2=toks.clip_tokenizer(),
        text_encoder_3=t5_encoder(32), tokenizer_3=toks.t5_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
    )


SPEC = register_model(ModelSpec(
    adapter=SD3Adapter,
    lora_targets=JOINT_ATTENTION,  # Flow-GRPO SD3.5 recipe (r32/a64)
    tiny_builder=build_tiny,
    tiny_sampling=dict(height=64, width=64, guidance_scale=4.5, max_sequence_length=16),
))
