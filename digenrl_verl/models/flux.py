"""FLUX.1 (`FluxPipeline`): embedded guidance, packed 2x2 latents, dynamic shift, timestep fed as σ.

Conditioning keys (B = prompts, L = max_sequence_length T5 tokens):
    prompt_embeds [B, L, joint_attention_dim], pooled_prompt_embeds [B, pooled_projection_dim];
    with true CFG (true_cfg_scale > 1) also negative_prompt_embeds / negative_pooled_prompt_embeds.
    shared: txt_ids [L, 3] (zeros, as the pipeline builds them).
Latents: packed [(H/16)·(W/16), 4·C] (2x2 patches of the C-channel VAE latent).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from digenrl_verl.models import _tiny_tokenizers as toks
from digenrl_verl.models._tiny_components import clip_text_encoder, kl_vae, t5_encoder
from digenrl_verl.models.base import Conditioning
from digenrl_verl.models.config import PIPELINE_KEY
from digenrl_verl.models.lora import JOINT_ATTENTION
from digenrl_verl.models.pipeline_adapter import PackedLatentAdapter
from digenrl_verl.models.spec import ModelSpec, register_model


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] → [B, (h/2)(w/2), 4C], the FLUX / Qwen-Image token layout."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of `pack_latents` for a latent of h x w."""
    b, _, ch = tokens.shape
    x = tokens.view(b, h // 2, w // 2, ch // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, ch // 4, h, w)


def latent_image_ids(h: int, w: int) -> torch.Tensor:
    """RoPE ids [(h/2)(w/2), 3] of the packed tokens: (0, row, col)."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3)


class FluxAdapter(PackedLatentAdapter):
    architecture = "FluxPipeline"
    timestep_scale = 1.0
    uses_true_cfg_scale = True

    def _validate_config(self, cfg: Any) -> None:
        super()._validate_config(cfg)
        if cfg.max_sequence_length > 512:
            raise ValueError(f"{PIPELINE_KEY}.max_sequence_length={cfg.max_sequence_length} exceeds FLUX's 512")

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        prompts = self._check_prompts(prompts)
        embeds, pooled, txt_ids = self.pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, device=self.device, max_sequence_length=self.config.max_sequence_length
        )
        tensors = {"prompt_embeds": self._f32(embeds), "pooled_prompt_embeds": self._f32(pooled)}
        if self.do_true_cfg:
            neg, neg_pooled, _ = self.pipeline.encode_prompt(
                prompt=[self.config.negative_prompt] * len(prompts), prompt_2=None, device=self.device,
                max_sequence_length=self.config.max_sequence_length,
            )
            tensors["negative_prompt_embeds"] = self._f32(neg)
            tensors["negative_pooled_prompt_embeds"] = self._f32(neg_pooled)
        return Conditioning(tensors, {"txt_ids": txt_ids.detach().float().cpu()})

    def _forward(self, x: torch.Tensor, t: torch.Tensor, guidance: torch.Tensor | None, embeds: torch.Tensor,
                 pooled: torch.Tensor, txt_ids: torch.Tensor) -> torch.Tensor:
        h, w = self._latent_hw()
        img_ids = latent_image_ids(h, w).to(self.device, self.dtype)
        return self.transformer(
            hidden_states=x, timestep=t, guidance=guidance, pooled_projections=pooled,
            encoder_hidden_states=embeds, txt_ids=txt_ids, img_ids=img_ids, return_dict=False,
        )[0].float()

    def _velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        t = self._t(sigma)
        guidance = None
        if self.denoiser.config.guidance_embeds:
            guidance = torch.full_like(sigma, float(self.config.guidance_scale))
        txt_ids = cond.shared["txt_ids"].to(self.device, self.dtype)
        v = self._forward(x, t, guidance, self._c(cond, "prompt_embeds"), self._c(cond, "pooled_prompt_embeds"),
                          txt_ids)
        if not self.do_true_cfg:
            return v
        v_neg = self._forward(x, t, guidance, self._c(cond, "negative_prompt_embeds"),
                              self._c(cond, "negative_pooled_prompt_embeds"), txt_ids)
        return self._cfg(v_neg, v, self.config.true_cfg_scale)

    def _decode(self, x: torch.Tensor, vae: nn.Module) -> torch.Tensor:
        h, w = self._latent_hw()
        latents = unpack_latents(x, h, w) / vae.config.scaling_factor + vae.config.shift_factor
        return vae.decode(latents.to(vae.dtype), return_dict=False)[0]


def build_tiny(size: str) -> dict[str, Any]:
    """FLUX.1 transformer ("unit": 1 double + 1 single block, 2 heads x 16; "bench": 2 + 2 blocks, 2 heads x 32,
    64 latent tokens at 128 px), CLIP + T5, scheduler config as FLUX.1-dev ships it."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    if size == "bench":
        dims = dict(num_layers=2, num_single_layers=2, attention_head_dim=32, axes_dims_rope=(8, 12, 12))
    else:
        dims = dict(num_layers=1, num_single_layers=1, attention_head_dim=16, axes_dims_rope=(4, 6, 6))
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        guidance_embeds=True, **dims,
    )
    return dict(
        pipeline_cls=FluxPipeline,
        transformer=transformer,
        vae=kl_vae(4, sd3_factors=True),
        text_encoder=clip_text_encoder(32, None), tokenizer=toks.clip_tokenizer(),
        text_encoder_2=t5_encoder(32), tokenizer_2=toks.t5_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
            base_image_seq_len=256, max_image_seq_len=4096,
        ),
    )


SPEC = register_model(ModelSpec(
    adapter=FluxAdapter,
    # Flow-GRPO FLUX recipe: attention plus both feed-forward streams of the double blocks.
    lora_targets=JOINT_ATTENTION + ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2"),
    tiny_builder=build_tiny,
    tiny_sampling=dict(height=64, width=64, guidance_scale=3.5, max_sequence_length=16),
    tiny_sizes=("unit", "bench"),
))
