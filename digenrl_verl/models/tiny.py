"""Tiny random diffusers model directories that load through the real `from_pretrained` path on CPU.

`build_tiny_model_dir(architecture, path, seed)` writes a complete diffusers directory (model_index.json,
every component via `save_pretrained`, tokenizers built in memory). Sizes follow
/work/shared/reference/tiny-models.md: every denoiser call takes milliseconds, a directory is < 1 MB.
Nothing is downloaded. The same (architecture, seed, size) always writes the same weights.

Sizes:
  - "unit" (default): the smallest configs, for unit tests.
  - "bench" (FLUX only): 2 double + 2 single blocks, 2 heads x 32 dims; 64 latent tokens at 128 px
    (load with height=width=128); big enough that attention and MLP costs dominate python overhead (TSP
    benchmark).

CLI: `python -m digenrl_verl.models.tiny <architecture> <path> [--seed N] [--size unit|bench]`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch


SIZES = ("unit", "bench")


def _toks() -> Any:
    """The in-memory tokenizer builders (imported lazily: transformers is slow to import)."""
    from digenrl_verl.models import _tiny_tokenizers

    return _tiny_tokenizers

# Scheduler configs as the public checkpoints ship them (FLUX.1-dev, SD3.5, Qwen-Image, Wan2.1-T2V,
# hunyuanvideo-community/HunyuanVideo), so the tiny directories exercise the same sigma code paths.
_SD3_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0)
_FLUX_SCHEDULER = dict(
    num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
    base_image_seq_len=256, max_image_seq_len=4096,
)
_QWEN_SCHEDULER = dict(
    num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
    base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential",
)
_WAN_SCHEDULER = dict(
    num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
    solver_order=2, final_sigmas_type="zero",
)
_HUNYUAN_SCHEDULER = dict(num_train_timesteps=1000, shift=7.0)


def _kl_vae(latent_channels: int, *, sd3_factors: bool) -> Any:
    """4-level AutoencoderKL: x8 spatial compression, ~25k params."""
    from diffusers import AutoencoderKL

    kwargs: dict[str, Any] = {}
    if sd3_factors:
        kwargs = dict(shift_factor=0.0609, scaling_factor=1.5035)
    return AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=4, sample_size=64, use_quant_conv=False, use_post_quant_conv=False, **kwargs,
    )


def _wan_like_vae(cls: Any, z_dim: int) -> Any:
    """AutoencoderKLWan / AutoencoderKLQwenImage: x8 spatial, x4 temporal; non-trivial latents_mean/std so
    that the adapters' de-normalisation is exercised."""
    mean = [0.1 * (i + 1) for i in range(z_dim)]
    std = [1.0 + 0.5 * i for i in range(z_dim)]
    return cls(
        base_dim=8, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], latents_mean=mean, latents_std=std,
    )


def _clip(hidden: int, projection: int | None) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=514, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, bos_token_id=512, eos_token_id=513,
        pad_token_id=513, projection_dim=projection or hidden,
    )
    return CLIPTextModelWithProjection(cfg) if projection else CLIPTextModel(cfg)


def _t5(d_model: int, *, umt5: bool = False) -> Any:
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kw = dict(
        vocab_size=193, d_model=d_model, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    if umt5:
        return UMT5EncoderModel(UMT5Config(**kw))
    return T5EncoderModel(T5Config(**kw))


def _sd3(size: str) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=4,
        joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=64, out_channels=4,
        pos_embed_max_size=16,
    )
    return dict(
        pipeline_cls=StableDiffusion3Pipeline,
        transformer=transformer,
        vae=_kl_vae(4, sd3_factors=True),
        text_encoder=_clip(16, 32), tokenizer=_toks().clip_tokenizer(),
        text_encoder_2=_clip(16, 32), tokenizer_2=_toks().clip_tokenizer(),
        text_encoder_3=_t5(32), tokenizer_3=_toks().t5_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(**_SD3_SCHEDULER),
    )


def _flux(size: str) -> dict[str, Any]:
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
        vae=_kl_vae(4, sd3_factors=True),
        text_encoder=_clip(32, None), tokenizer=_toks().clip_tokenizer(),
        text_encoder_2=_t5(32), tokenizer_2=_toks().t5_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(**_FLUX_SCHEDULER),
    )


def _qwen_image(size: str) -> dict[str, Any]:
    from diffusers import (
        AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline, QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = _toks().qwen2_tokenizer()
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
        vae=_wan_like_vae(AutoencoderKLQwenImage, 4),
        text_encoder=text_encoder, tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(**_QWEN_SCHEDULER),
    )


def _wan(size: str) -> dict[str, Any]:
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )
    return dict(
        pipeline_cls=WanPipeline,
        transformer=transformer,
        vae=_wan_like_vae(AutoencoderKLWan, 4),
        text_encoder=_t5(16, umt5=True), tokenizer=_toks().t5_tokenizer(),
        scheduler=UniPCMultistepScheduler(**_WAN_SCHEDULER),
    )


def _hunyuan_video(size: str) -> dict[str, Any]:
    from diffusers import (
        AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
    from transformers import LlamaConfig, LlamaModel

    tokenizer = _toks().llama_tokenizer(DEFAULT_PROMPT_TEMPLATE["template"])
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
        text_encoder_2=_clip(8, None), tokenizer_2=_toks().clip_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(**_HUNYUAN_SCHEDULER),
    )


_BUILDERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "StableDiffusion3Pipeline": _sd3,
    "FluxPipeline": _flux,
    "QwenImagePipeline": _qwen_image,
    "WanPipeline": _wan,
    "HunyuanVideoPipeline": _hunyuan_video,
}
TINY_ARCHITECTURES: tuple[str, ...] = tuple(_BUILDERS)

#: Small sampling settings per tiny architecture, each with its guidance kind: `load_adapter(path,
#: **TINY_PIPELINE_KWARGS[arch])` (64 px: 8x8 latents, 16 image tokens; 5 frames: 2 latent frames).
TINY_PIPELINE_KWARGS: dict[str, dict] = {
    "StableDiffusion3Pipeline": dict(height=64, width=64, guidance_scale=4.5, max_sequence_length=16),
    "FluxPipeline": dict(height=64, width=64, guidance_scale=3.5, max_sequence_length=16),
    "QwenImagePipeline": dict(height=64, width=64, true_cfg_scale=4.0, negative_prompt=" ", max_sequence_length=24),
    "WanPipeline": dict(height=64, width=64, num_frames=5, guidance_scale=4.5, max_sequence_length=16),
    "HunyuanVideoPipeline": dict(height=64, width=64, num_frames=5, guidance_scale=6.0, max_sequence_length=16),
}
assert set(TINY_PIPELINE_KWARGS) == set(TINY_ARCHITECTURES)


def build_tiny_model_dir(architecture: str, path: str | Path, seed: int = 0, size: str = "unit") -> Path:
    """Write a tiny random diffusers model directory for `architecture` (a model_index.json `_class_name`).

    Args:
        architecture: one of TINY_ARCHITECTURES.
        path: target directory (created; existing files with the same names are overwritten).
        seed: weights are drawn under `torch.manual_seed(seed)` (the global RNG state is restored after).
        size: "unit" or, for FluxPipeline only, "bench".
    Returns:
        The directory path.
    """
    if architecture not in _BUILDERS:
        raise ValueError(
            f"build_tiny_model_dir: unknown architecture {architecture!r}; valid: {sorted(_BUILDERS)}"
        )
    if size not in SIZES or (size == "bench" and architecture != "FluxPipeline"):
        raise ValueError(f"build_tiny_model_dir: size={size!r} is not available for {architecture}; "
                         f"valid: 'unit' (all), 'bench' (FluxPipeline)")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        parts = _BUILDERS[architecture](size)
        pipeline_cls = parts.pop("pipeline_cls")
        pipe = pipeline_cls(**parts)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m digenrl_verl.models.tiny", description=__doc__.split("\n")[0])
    parser.add_argument("architecture", choices=TINY_ARCHITECTURES)
    parser.add_argument("path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=SIZES, default="unit")
    args = parser.parse_args(argv)
    out = build_tiny_model_dir(args.architecture, args.path, seed=args.seed, size=args.size)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
