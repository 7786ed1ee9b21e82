"""Tiny random components shared by the architectures' tiny builders (VAEs, text encoders).

Each architecture module builds its tiny pipeline from these (its `ModelSpec.tiny_builder`); `models.tiny`
writes the result to disk. diffusers / transformers are imported inside the functions so that importing
`digenrl_verl.models` does not import them.
"""

from __future__ import annotations

from typing import Any


def kl_vae(latent_channels: int, *, sd3_factors: bool) -> Any:
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


def wan_like_vae(cls: Any, z_dim: int) -> Any:
    """AutoencoderKLWan / AutoencoderKLQwenImage: x8 spatial, x4 temporal; non-trivial latents_mean/std so
    that the adapters' de-normalisation is exercised."""
    mean = [0.1 * (i + 1) for i in range(z_dim)]
    std = [1.0 + 0.5 * i for i in range(z_dim)]
    return cls(
        base_dim=8, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], latents_mean=mean, latents_std=std,
    )


def clip_text_encoder(hidden: int, projection: int | None) -> Any:
    """2-layer CLIP text model (with a projection head if `projection`), vocabulary of `clip_tokenizer`."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=514, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, bos_token_id=512, eos_token_id=513,
        pad_token_id=513, projection_dim=projection or hidden,
    )
    return CLIPTextModelWithProjection(cfg) if projection else CLIPTextModel(cfg)


def t5_encoder(d_model: int, *, umt5: bool = False) -> Any:
    """2-layer T5 (or UMT5) encoder, vocabulary of `t5_tokenizer`."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kw = dict(
        vocab_size=193, d_model=d_model, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    if umt5:
        return UMT5EncoderModel(UMT5Config(**kw))
    return T5EncoderModel(T5Config(**kw))
