"""Tiny model directories: deterministic, complete, with tokenizers that fit the pipelines' templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from digenrl_verl.models import _tiny_tokenizers, load_adapter
from digenrl_verl.models.tiny import build_tiny_model_dir, main, tiny_architectures


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("arch", tiny_architectures())
def test_build_is_deterministic_in_the_seed(arch, tiny_dirs, tmp_path):
    again = build_tiny_model_dir(arch, tmp_path / "again", seed=0)
    reference = _files(tiny_dirs[arch])
    assert _files(again) == reference
    index = json.loads(reference["model_index.json"])
    assert index["_class_name"] == arch
    assert sum(len(b) for b in reference.values()) < 1_000_000
    other = _files(build_tiny_model_dir(arch, tmp_path / "other", seed=1))
    assert other["model_index.json"] == reference["model_index.json"]
    weights = "transformer/diffusion_pytorch_model.safetensors"
    assert other[weights] != reference[weights]


def test_build_leaves_the_global_rng_alone(tmp_path):
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    build_tiny_model_dir("StableDiffusion3Pipeline", tmp_path, seed=0)
    assert torch.equal(torch.rand(2), expected)


def test_qwen_tokenizer_crops_exactly_the_template(tiny_adapter):
    """QwenImagePipeline drops the first 34 tokens (its template); the prompt must start right after."""
    pipe = tiny_adapter("QwenImagePipeline").pipeline
    template, drop = pipe.prompt_template_encode, pipe.prompt_template_encode_start_idx
    expected = (_tiny_tokenizers.QWEN_IMAGE_TEMPLATE, _tiny_tokenizers.QWEN_IMAGE_DROP)
    assert (template, drop) == expected  # the tokenizer was fitted to this
    ids = pipe.tokenizer(template.format("a cat")).input_ids
    prefix = pipe.tokenizer(template.split("{}")[0]).input_ids
    assert len(prefix) == drop == 34
    assert pipe.tokenizer.decode(ids[drop:]).startswith("a cat<|im_end|>")


def test_hunyuan_tokenizer_crops_exactly_the_template(tiny_adapter):
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    tok = tiny_adapter("HunyuanVideoPipeline").pipeline.tokenizer
    template, crop = DEFAULT_PROMPT_TEMPLATE["template"], DEFAULT_PROMPT_TEMPLATE["crop_start"]
    ids = tok(template.format("a cat")).input_ids
    assert len(tok(template.split("{}")[0]).input_ids) == crop == 95
    assert tok.decode(ids[crop:]).startswith("a cat<|eot_id|>")
    assert tok.padding_side == "right" and tok.pad_token is not None


@pytest.mark.parametrize("arch", ["StableDiffusion3Pipeline", "FluxPipeline", "WanPipeline"])
def test_char_level_tokenizers_round_trip(arch, tiny_adapter):
    pipe = tiny_adapter(arch).pipeline
    for name in ("tokenizer", "tokenizer_2", "tokenizer_3"):
        tok = getattr(pipe, name, None)
        if tok is not None:
            ids = tok("a photo of a cat").input_ids
            assert tok.decode(ids, skip_special_tokens=True).strip() == "a photo of a cat", name
            assert tok.model_max_length < 10_000, name


def test_flux_bench_size(tmp_path):
    path = build_tiny_model_dir("FluxPipeline", tmp_path, seed=0, size="bench")
    adapter = load_adapter(path, keep_reference=False, height=128, width=128)
    cfg = adapter.denoiser.config
    assert (cfg.num_layers, cfg.num_single_layers, cfg.num_attention_heads, cfg.attention_head_dim) == (2, 2, 2, 32)
    assert adapter.latent_shape() == (64, 16)  # 128 px → 16x16x4 latent → 64 packed tokens
    with pytest.raises(ValueError, match="size='bench' is not available for WanPipeline"):
        build_tiny_model_dir("WanPipeline", tmp_path / "w", size="bench")


def test_unknown_architecture(tmp_path):
    with pytest.raises(ValueError, match="valid: .*'FluxPipeline'"):
        build_tiny_model_dir("KandinskyPipeline", tmp_path)


def test_cli_writes_a_loadable_directory(tmp_path, capsys):
    assert main(["WanPipeline", str(tmp_path / "wan"), "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "wan")
    assert json.loads((tmp_path / "wan" / "model_index.json").read_text())["_class_name"] == "WanPipeline"
