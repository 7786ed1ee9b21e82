"""Wan2.1 text-to-video (`WanPipeline`): CFG as one batched forward of [uncond; cond], timestep σ·1000.

The diffusers pipeline runs the two CFG branches as two forwards; the rows of a Wan forward do not interact
(no text mask, per-row modulation), so one forward of 2B rows gives the same guided velocity.

Conditioning keys (B = prompts, L = max_sequence_length):
    prompt_embeds [B, L, text_dim] (UMT5 states, zero past each prompt's end, as the pipeline pads);
    with CFG (guidance_scale > 1) also negative_prompt_embeds [B, L, text_dim].
Latents: [C, (F−1)/4 + 1, H/8, W/8].
Only Wan2.1 (one transformer) is supported; Wan2.2 two-expert / expand-timestep directories are rejected.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from digenrl_verl.models import _tiny_tokenizers as toks
from digenrl_verl.models._tiny_components import t5_encoder, wan_like_vae
from digenrl_verl.models.base import Conditioning
from digenrl_verl.models.config import PATH_KEY
from digenrl_verl.models.lora import ATTENTION
from digenrl_verl.models.pipeline_adapter import VideoLatentAdapter
from digenrl_verl.models.spec import ModelSpec, register_model


class WanAdapter(VideoLatentAdapter):
    architecture = "WanPipeline"
    timestep_scale = 1000.0

    def __init__(self, pipeline: Any, **kwargs: Any) -> None:
        if getattr(pipeline, "transformer_2", None) is not None or pipeline.config.get("expand_timesteps", False):
            raise ValueError(f"{PATH_KEY}: a Wan2.2 directory (transformer_2 / expand_timesteps) is not supported; "
                             "the Wan adapter covers Wan2.1 text-to-video")
        super().__init__(pipeline, **kwargs)

    @property
    def do_cfg(self) -> bool:
        return self.config.guidance_scale > 1

    def _size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor_spatial * self.denoiser.config.patch_size[1]

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        prompts = self._check_prompts(prompts)
        embeds, neg = self.pipeline.encode_prompt(
            prompt=prompts, negative_prompt=[self.config.negative_prompt] * len(prompts),
            do_classifier_free_guidance=self.do_cfg, max_sequence_length=self.config.max_sequence_length,
            device=self.device,
        )
        tensors = {"prompt_embeds": self._f32(embeds)}
        if self.do_cfg:
            tensors["negative_prompt_embeds"] = self._f32(neg)
        return Conditioning(tensors)

    def _velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        embeds, t = self._c(cond, "prompt_embeds"), self._t(sigma)
        if not self.do_cfg:
            return self.transformer(hidden_states=x, timestep=t, encoder_hidden_states=embeds, return_dict=False)[0]
        out = self.transformer(
            hidden_states=torch.cat([x, x]), timestep=torch.cat([t, t]),
            encoder_hidden_states=torch.cat([self._c(cond, "negative_prompt_embeds"), embeds]), return_dict=False,
        )[0]
        uncond, cond_v = out.float().chunk(2)
        return self._cfg(uncond, cond_v, self.config.guidance_scale)

    def _decode(self, x: torch.Tensor, vae: nn.Module) -> torch.Tensor:
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=x.device).view(1, z, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=x.device).view(1, z, 1, 1, 1)
        latents = x / (1.0 / std) + mean  # written as the pipeline does, for bit-identical decodes
        video = vae.decode(latents.to(vae.dtype), return_dict=False)[0]  # [B, 3, T, H, W]
        return video.permute(0, 2, 1, 3, 4)


def build_tiny(size: str) -> dict[str, Any]:
    """1-block Wan transformer, UMT5, scheduler config as Wan2.1-T2V ships it (UniPC, flow sigmas)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )
    return dict(
        pipeline_cls=WanPipeline,
        transformer=transformer,
        vae=wan_like_vae(AutoencoderKLWan, 4),
        text_encoder=t5_encoder(16, umt5=True), tokenizer=toks.t5_tokenizer(),
        scheduler=UniPCMultistepScheduler(
            num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
            solver_order=2, final_sigmas_type="zero",
        ),
    )


SPEC = register_model(ModelSpec(
    adapter=WanAdapter,
    # Self- and cross-attention (attn1/attn2) and the FFN of every Wan block.
    lora_targets=ATTENTION + ("ffn.net.0.proj", "ffn.net.2"),
    tiny_builder=build_tiny,
    tiny_sampling=dict(height=64, width=64, num_frames=5, guidance_scale=4.5, max_sequence_length=16),
))
