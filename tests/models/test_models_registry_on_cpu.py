"""load_adapter input errors and config validation (the spec registry itself: test_models_spec_on_cpu)."""

from __future__ import annotations

import json
import shutil

import pytest

from digenrl_verl.models import LoraConfig, PipelineConfig, load_adapter, read_model_index


def test_not_a_model_directory(tmp_path):
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.path.*not a directory"):
        load_adapter(tmp_path / "missing")
    with pytest.raises(ValueError, match="model_index.json is missing"):
        load_adapter(tmp_path)
    (tmp_path / "model_index.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_model_index(tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"transformer": ["diffusers", "X"]}))
    with pytest.raises(ValueError, match="_class_name"):
        read_model_index(tmp_path)


def test_missing_component_folder_is_named(tiny_dirs, tmp_path):
    broken = tmp_path / "flux"
    shutil.copytree(tiny_dirs["FluxPipeline"], broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(ValueError, match=r"without a folder: \['vae'\]"):
        load_adapter(broken)


def test_unknown_class_name_in_model_index(tiny_dirs, tmp_path):
    other = tmp_path / "sdxl"
    shutil.copytree(tiny_dirs["StableDiffusion3Pipeline"], other)
    index = json.loads((other / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionXLPipeline"
    (other / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="has no adapter; valid"):
        load_adapter(other)


def test_architecture_mismatch(tiny_dirs):
    with pytest.raises(ValueError, match="names 'FluxPipeline'"):
        load_adapter(tiny_dirs["FluxPipeline"], architecture="WanPipeline")


def test_pipeline_kwargs_are_validated(tiny_dirs):
    path = tiny_dirs["StableDiffusion3Pipeline"]
    with pytest.raises(ValueError, match=r"unknown key actor_rollout_ref\.rollout\.pipeline\.hieght.*'height'"):
        load_adapter(path, hieght=64)
    with pytest.raises(ValueError, match=r"pipeline\.height=72 must be a multiple of 16"):
        load_adapter(path, height=72, width=64)
    with pytest.raises(ValueError, match=r"num_frames=5.*makes images"):
        load_adapter(path, height=64, width=64, num_frames=5)
    with pytest.raises(ValueError, match=r"true_cfg_scale=3.0 is not used"):
        load_adapter(path, height=64, width=64, true_cfg_scale=3.0)
    with pytest.raises(ValueError, match="either pipeline="):
        load_adapter(path, pipeline=PipelineConfig(height=64), width=64)
    with pytest.raises(ValueError, match=r"num_frames=6 must be 1 \+ k·4"):
        load_adapter(tiny_dirs["WanPipeline"], height=64, width=64, num_frames=6)
    with pytest.raises(ValueError, match=r"max_sequence_length=600 exceeds FLUX's 512"):
        load_adapter(tiny_dirs["FluxPipeline"], height=64, width=64, max_sequence_length=600)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(height=0), r"pipeline\.height must be a positive integer"),
        (dict(width=64.0), r"pipeline\.width must be a positive integer"),
        (dict(guidance_scale=-1.0), r"pipeline\.guidance_scale must be a number >= 0"),
        (dict(negative_prompt=None), r"pipeline\.negative_prompt must be a string"),
    ],
)
def test_pipeline_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PipelineConfig(**kwargs)


def test_pipeline_config_from_dict():
    cfg = PipelineConfig.from_dict({"height": 32, "width": 32, "num_inference_steps": 6, "true_cfg_scale": 1.0,
                                    "guidance_scale": None, "max_sequence_length": 32, "num_frames": 1,
                                    "negative_prompt": ""})
    assert (cfg.height, cfg.num_inference_steps, cfg.guidance_scale) == (32, 6, None)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rank=-1), r"lora_rank must be an integer >= 0"),
        (dict(rank=4, alpha=0), r"lora_alpha must be a number > 0"),
        (dict(rank=4, init_weights="pissa"), r"lora_init_weights='pissa' is not supported; valid: \['gaussian'"),
        (dict(rank=4, target_modules=()), r"target_modules must be null, 'all-linear' or a non-empty list"),
    ],
)
def test_lora_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoraConfig(**kwargs)


def test_lora_config_from_verl_model_section():
    cfg = LoraConfig.from_dict({"path": "/x", "lora_rank": 32, "lora_alpha": 64, "lora_init_weights": "gaussian",
                                "target_modules": ["to_q", "to_k"], "exclude_modules": None})
    assert (cfg.rank, cfg.alpha, cfg.target_modules, cfg.enabled) == (32, 64, ("to_q", "to_k"), True)
    assert not LoraConfig.from_dict({"lora_rank": 0}).enabled
    assert LoraConfig(rank=2, target_modules="to_q").target_modules == ("to_q",)
    assert LoraConfig(rank=2, target_modules="all-linear").target_modules == "all-linear"
