"""Qwen-Image (`QwenImagePipeline`): true CFG (two forwards, norm-rescaled), packed latents, dynamic shift.

The pipeline feeds the transformer `timestep = σ` (its timestep embedding multiplies by 1000 itself).

Conditioning keys (B = prompts, L = max_sequence_length):
    prompt_embeds [B, L, D] and prompt_embeds_mask [B, L] (int64, 1 = token); with true CFG
    (true_cfg_scale > 1) also negative_prompt_embeds / negative_prompt_embeds_mask.
    The pipeline pads to the longest prompt of the batch; this adapter pads every prompt to L with a
    zero mask instead, so a row's conditioning does not depend on which prompts share its batch and
    conditionings from different calls concatenate (`Conditioning.cat`).
Latents: packed [(H/16)·(W/16), 4·C].
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from digenrl_verl.models import _tiny_tokenizers as toks
from digenrl_verl.models._tiny_components import wan_like_vae
from digenrl_verl.models.base import Conditioning
from digenrl_verl.models.config import PIPELINE_KEY
from digenrl_verl.models.flux import unpack_latents
from digenrl_verl.models.lora import JOINT_ATTENTION
from digenrl_verl.models.pipeline_adapter import PackedLatentAdapter
from digenrl_verl.models.spec import ModelSpec, register_model


class QwenImageAdapter(PackedLatentAdapter):
    architecture = "QwenImagePipeline"
    timestep_scale = 1.0
    uses_guidance_scale = False
    uses_true_cfg_scale = True

    def _validate_config(self, cfg: Any) -> None:
        super()._validate_config(cfg)
        if cfg.max_sequence_length > 1024:
            raise ValueError(f"{PIPELINE_KEY}.max_sequence_length={cfg.max_sequence_length} exceeds Qwen-Image's 1024")

    @classmethod
    def unused_modules(cls, denoiser: torch.nn.Module) -> tuple[str, ...]:
        # The output is read from the image stream only: the last block's text-stream output layers are dead.
        last = f"transformer_blocks.{len(denoiser.transformer_blocks) - 1}"
        return (f"{last}.attn.to_add_out", f"{last}.txt_mlp.net.0.proj", f"{last}.txt_mlp.net.2")

    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        length = self.config.max_sequence_length
        embeds, mask = self.pipeline.encode_prompt(prompt=prompts, device=self.device, max_sequence_length=length)
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        pad = length - embeds.shape[1]
        embeds = torch.nn.functional.pad(embeds, (0, 0, 0, pad))
        mask = torch.nn.functional.pad(mask.long(), (0, pad))
        return self._f32(embeds), mask.long()

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        prompts = self._check_prompts(prompts)
        embeds, mask = self._encode(prompts)
        tensors = {"prompt_embeds": embeds, "prompt_embeds_mask": mask}
        if self.do_true_cfg:
            neg, neg_mask = self._encode([self.config.negative_prompt] * len(prompts))
            tensors["negative_prompt_embeds"] = neg
            tensors["negative_prompt_embeds_mask"] = neg_mask
        return Conditioning(tensors)

    def _forward(self, x: torch.Tensor, t: torch.Tensor, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h, w = self._latent_hw()
        img_shapes = [[(1, h // 2, w // 2)]] * x.shape[0]
        return self.transformer(
            hidden_states=x, timestep=t, guidance=None, encoder_hidden_states=embeds,
            encoder_hidden_states_mask=mask, img_shapes=img_shapes, return_dict=False,
        )[0].float()

    def _velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        t = self._t(sigma)
        v = self._forward(x, t, self._c(cond, "prompt_embeds"), self._c(cond, "prompt_embeds_mask"))
        if not self.do_true_cfg:
            return v
        v_neg = self._forward(x, t, self._c(cond, "negative_prompt_embeds"),
                              self._c(cond, "negative_prompt_embeds_mask"))
        combined = self._cfg(v_neg, v, self.config.true_cfg_scale)
        # Rescale every token's guided velocity to the norm of the conditional one (the pipeline's rule).
        return combined * (v.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))

    def _decode(self, x: torch.Tensor, vae: nn.Module) -> torch.Tensor:
        h, w = self._latent_hw()
        latents = unpack_latents(x, h, w).unsqueeze(2)  # [B, C, 1, h, w]
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=x.device).view(1, z, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=x.device).view(1, z, 1, 1, 1)
        latents = latents / (1.0 / std) + mean  # written as the pipeline does, for bit-identical decodes
        return vae.decode(latents.to(vae.dtype), return_dict=False)[0][:, :, 0]


def build_tiny(size: str) -> dict[str, Any]:
    """1-block Qwen-Image transformer, a 2-layer Qwen2.5-VL text encoder, scheduler config as Qwen-Image ships it."""
    from diffusers import (
        AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline, QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = toks.qwen2_tokenizer()
    text_cfg = dict(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]},
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.pad_token_id,
    )
    vision_cfg = dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16, patch_size=14,
        fullatt_block_indexes=[0],
    )
    text_encoder = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(text_config=text_cfg, vision_config=vision_cfg, image_token_id=len(tokenizer) - 1,
                         video_token_id=len(tokenizer) - 1, vision_start_token_id=len(tokenizer) - 1,
                         vision_end_token_id=len(tokenizer) - 1)
    )
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
    )
    return dict(
        pipeline_cls=QwenImagePipeline,
        transformer=transformer,
        vae=wan_like_vae(AutoencoderKLQwenImage, 4),
        text_encoder=text_encoder, tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
            base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential",
        ),
    )


SPEC = register_model(ModelSpec(
    adapter=QwenImageAdapter,
    # verl-omni Qwen-Image recipe.
    lora_targets=JOINT_ATTENTION + ("img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2"),
    tiny_builder=build_tiny,
    tiny_sampling=dict(height=64, width=64, true_cfg_scale=4.0, negative_prompt=" ", max_sequence_length=24),
))
