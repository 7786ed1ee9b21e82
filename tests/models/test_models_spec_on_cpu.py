"""The model spec registry: one complete `ModelSpec` per architecture, registered once.

That every tiny builder builds and its pipeline runs with the spec's tiny sampling settings is covered by
test_models_tiny_on_cpu (build) and test_models_adapters_on_cpu (sampling against the diffusers pipeline);
here: the registry's contents, each spec's completeness, duplicates and misses.
"""

from __future__ import annotations

import pytest
from torch import nn

from digenrl_verl.models import (
    ModelSpec,
    PipelineConfig,
    get_adapter_class,
    get_model_spec,
    list_architectures,
    register_model,
    tiny_architectures,
)
from digenrl_verl.models import spec as spec_module
from digenrl_verl.models.flux import FluxAdapter
from digenrl_verl.models.pipeline_adapter import PipelineAdapter

BUILT_IN = ["FluxPipeline", "HunyuanVideoPipeline", "QwenImagePipeline", "StableDiffusion3Pipeline", "WanPipeline"]


def _builder(size: str) -> dict:
    return {}


def test_the_five_architectures_are_registered_with_tiny_models():
    assert list_architectures() == BUILT_IN
    assert tiny_architectures() == BUILT_IN
    for arch in BUILT_IN:
        spec = get_model_spec(arch)
        assert spec.architecture == spec.adapter.architecture == arch
        assert get_adapter_class(arch) is spec.adapter and issubclass(spec.adapter, PipelineAdapter)


@pytest.mark.parametrize("arch", BUILT_IN)
def test_every_spec_is_complete(arch, tiny_adapter):
    spec = get_model_spec(arch)
    assert spec.tiny_builder is not None and "unit" in spec.tiny_sizes
    sampling = PipelineConfig.from_dict(spec.tiny_sampling)
    assert spec.is_video == (sampling.num_frames is not None)
    with pytest.raises(TypeError):
        spec.tiny_sampling["height"] = 8  # type: ignore[index]

    adapter = tiny_adapter(arch)  # the tiny directory, loaded with the spec's sampling settings
    for name in ("height", "width", "num_frames", "max_sequence_length", "negative_prompt"):
        if name in spec.tiny_sampling:
            assert getattr(adapter.config, name) == spec.tiny_sampling[name], name
    linear = [name for name, module in adapter.denoiser.named_modules() if isinstance(module, nn.Linear)]
    missing = [t for t in spec.lora_targets if not any(n == t or n.endswith(f".{t}") for n in linear)]
    assert not missing, f"{arch}: LoRA targets with no linear layer in the tiny transformer: {missing}"


def test_a_duplicate_registration_raises_and_leaves_the_registry_unchanged():
    original = get_model_spec("FluxPipeline")

    class Impostor(FluxAdapter):
        pass

    with pytest.raises(ValueError, match=r"'FluxPipeline' is already registered \(adapter .*FluxAdapter\)"):
        register_model(ModelSpec(adapter=Impostor, lora_targets=("to_q",)))
    with pytest.raises(ValueError, match="already registered"):
        register_model(original)  # the very same spec twice is a duplicate too
    assert get_model_spec("FluxPipeline") is original and get_adapter_class("FluxPipeline") is FluxAdapter
    assert list_architectures() == BUILT_IN


@pytest.mark.parametrize("lookup", [get_model_spec, get_adapter_class])
def test_a_miss_lists_the_valid_names(lookup):
    with pytest.raises(ValueError) as err:
        lookup("StableDiffusionXLPipeline")
    message = str(err.value)
    assert "actor_rollout_ref.model.architecture" in message and "_class_name" in message
    assert "'StableDiffusionXLPipeline' has no adapter" in message
    assert f"valid: {BUILT_IN}" in message


def test_another_package_registers_a_model_once(monkeypatch):
    monkeypatch.setattr(spec_module, "_SPECS", dict(spec_module._SPECS))  # leave the real registry alone

    class MyFluxAdapter(FluxAdapter):
        architecture = "MyFluxPipeline"

    spec = register_model(ModelSpec(adapter=MyFluxAdapter, lora_targets=("to_q", "to_v")))
    assert get_model_spec("MyFluxPipeline") is spec and get_adapter_class("MyFluxPipeline") is MyFluxAdapter
    assert "MyFluxPipeline" in list_architectures() and "MyFluxPipeline" not in tiny_architectures()
    with pytest.raises(ValueError, match="already registered"):
        register_model(ModelSpec(adapter=MyFluxAdapter, lora_targets=("to_k",)))


class _Unnamed(PipelineAdapter):
    pass


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(adapter=object, lora_targets=("to_q",)), TypeError, "must be a DiffusionAdapter subclass"),
        (dict(adapter=_Unnamed, lora_targets=("to_q",)), ValueError, "must set `architecture`"),
        (dict(adapter=FluxAdapter, lora_targets=()), ValueError, "lora_targets must be a non-empty tuple"),
        (dict(adapter=FluxAdapter, lora_targets=["to_q"]), ValueError, "lora_targets must be a non-empty tuple"),
        (dict(adapter=FluxAdapter, lora_targets=("to_q",), tiny_builder="flux"), TypeError, "must be callable"),
        (dict(adapter=FluxAdapter, lora_targets=("to_q",), tiny_sampling={"height": 64}), ValueError,
         "no tiny_builder"),
        (dict(adapter=FluxAdapter, lora_targets=("to_q",), tiny_builder=_builder, tiny_sampling={"hieght": 64}),
         ValueError, r"unknown key actor_rollout_ref\.rollout\.pipeline\.hieght"),
        (dict(adapter=FluxAdapter, lora_targets=("to_q",), tiny_builder=_builder, tiny_sizes=("bench",)),
         ValueError, "tiny_sizes must be a tuple of size names with 'unit'"),
    ],
)
def test_model_spec_rejects_an_incomplete_spec(kwargs, error, match):
    with pytest.raises(error, match=match):
        ModelSpec(**kwargs)
