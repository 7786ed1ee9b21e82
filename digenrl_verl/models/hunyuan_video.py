"""HunyuanVideo (`HunyuanVideoPipeline`): embedded guidance (scale·1000), timestep σ·1000, static shift.

Conditioning keys (B = prompts, L = max_sequence_length Llama tokens after the template crop):
    prompt_embeds [B, L, text_embed_dim], prompt_attention_mask [B, L] (int64), pooled_prompt_embeds
    [B, pooled_projection_dim] (CLIP); with true CFG (true_cfg_scale > 1) the negative_* twins.
Latents: [C, (F−1)/4 + 1, H/8, W/8].
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from digenrl_verl.models import _tiny_tokenizers as toks
from digenrl_verl.models._tiny_components import clip_text_encoder
from digenrl_verl.models.base import Conditioning
from digenrl_verl.models.lora import JOINT_ATTENTION
from digenrl_verl.models.pipeline_adapter import VideoLatentAdapter
from digenrl_verl.models.spec import ModelSpec, register_model


class HunyuanVideoAdapter(VideoLatentAdapter):
    architecture = "HunyuanVideoPipeline"
    timestep_scale = 1000.0
    uses_true_cfg_scale = True

    @property
    def do_true_cfg(self) -> bool:
        return self.config.true_cfg_scale > 1

    def _size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor_spatial * self.denoiser.config.patch_size

    def _set_timesteps_kwargs(self, num_steps: int) -> dict[str, Any]:
        return {"sigmas": np.linspace(1.0, 0.0, num_steps + 1)[:-1]}

    def _encode(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        embeds, pooled, mask = self.pipeline.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.config.max_sequence_length
        )
        return {"prompt_embeds": self._f32(embeds), "pooled_prompt_embeds": self._f32(pooled),
                "prompt_attention_mask": mask.detach().long()}

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        prompts = self._check_prompts(prompts)
        tensors = self._encode(prompts)
        if self.do_true_cfg:
            neg = self._encode([self.config.negative_prompt] * len(prompts))
            tensors.update({f"negative_{k}": v for k, v in neg.items()})
        return Conditioning(tensors)

    def _forward(self, x: torch.Tensor, t: torch.Tensor, guidance: torch.Tensor, cond: Conditioning,
                 prefix: str) -> torch.Tensor:
        return self.transformer(
            hidden_states=x, timestep=t, guidance=guidance,
            encoder_hidden_states=self._c(cond, f"{prefix}prompt_embeds"),
            encoder_attention_mask=self._c(cond, f"{prefix}prompt_attention_mask").to(self.dtype),
            pooled_projections=self._c(cond, f"{prefix}pooled_prompt_embeds"), return_dict=False,
        )[0].float()

    def _velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        t = self._t(sigma)
        guidance = torch.full_like(sigma, float(self.config.guidance_scale)).to(self.dtype) * 1000.0
        v = self._forward(x, t, guidance, cond, "")
        if not self.do_true_cfg:
            return v
        return self._cfg(self._forward(x, t, guidance, cond, "negative_"), v, self.config.true_cfg_scale)

    def _decode(self, x: torch.Tensor, vae: nn.Module) -> torch.Tensor:
        video = vae.decode((x / vae.config.scaling_factor).to(vae.dtype), return_dict=False)[0]
        return video.permute(0, 2, 1, 3, 4)


def build_tiny(size: str) -> dict[str, Any]:
    """1+1-block HunyuanVideo transformer, a 3-layer Llama + CLIP, scheduler config as the diffusers port ships it."""
    from diffusers import (
        AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
    from transformers import LlamaConfig, LlamaModel

    tokenizer = toks.llama_tokenizer(DEFAULT_PROMPT_TEMPLATE["template"])
    text_encoder = LlamaModel(
        LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=1, eos_token_id=2,
        )
    )
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4),
    )
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
        spatial_compression_ratio=8, temporal_compression_ratio=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4,
    )
    return dict(
        pipeline_cls=HunyuanVideoPipeline,
        transformer=transformer,
        vae=vae,
        text_encoder=text_encoder, tokenizer=tokenizer,
        text_encoder_2=clip_text_encoder(8, None), tokenizer_2=toks.clip_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=7.0),
    )


SPEC = register_model(ModelSpec(
    adapter=HunyuanVideoAdapter,
    # Joint attention of the double-stream blocks (single blocks and the token refiner share to_q/k/v names).
    lora_targets=JOINT_ATTENTION,
    tiny_builder=build_tiny,
    tiny_sampling=dict(height=64, width=64, num_frames=5, guidance_scale=6.0, max_sequence_length=16),
))
