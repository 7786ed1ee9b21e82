"""Generator-side features of verl-omni's scripts that DigenRL cannot run yet are refused naming the precise missing
piece (issue 23's replay: rollout tensor parallelism, BAGEL, LTX-2 / Qwen-Image-Edit, `output_type=latent`), and
`rollout.name=vllm_omni` on a CPU host with verl-omni installed is planned on verl-omni's rollout pipeline
(rollout engine `verl_omni`), whose limits are refused before any worker starts."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest

from digenrl_verl.engines.base import EngineEntry
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run

DISAGG = "trainer.digenrl.mode=disaggregated"
A = "actor_rollout_ref"


def _build(model_dir, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_run(compose([TINY_CPU, f"{A}.model.path={model_dir}", DISAGG, *overrides]))


def _model_named(src, dst, architecture: str) -> str:
    shutil.copytree(src, dst)
    index = json.loads((dst / "model_index.json").read_text())
    (dst / "model_index.json").write_text(json.dumps({**index, "_class_name": architecture}))
    return str(dst)


@pytest.mark.parametrize("override, key, piece", [
    (f"{A}.rollout.tensor_model_parallel_size=2", f"{A}.rollout.tensor_model_parallel_size",
     "vLLM-Omni rollout replicas (vLLMOmniReplica"),
    (f"{A}.rollout.pipeline.output_type=latent", f"{A}.rollout.pipeline.output_type", "a latent reward path"),
])
def test_generator_features_name_the_missing_piece(tiny_flux_dir, override, key, piece):
    with pytest.raises(ValueError) as err:
        _build(tiny_flux_dir, override)
    assert str(err.value).startswith(key) and piece in str(err.value)


@pytest.mark.parametrize("architecture", ["LTX2Pipeline", "QwenImageEditPlusPipeline"])
def test_an_architecture_without_a_package_adapter_names_the_adapter_as_missing(tiny_flux_dir, tmp_path,
                                                                                architecture):
    with pytest.raises(ValueError) as err:
        _build(_model_named(tiny_flux_dir, tmp_path / "m", architecture))
    text = str(err.value)
    assert text.startswith(f"{A}.model.architecture") and f"{architecture!r} has no adapter" in text
    assert "this package's adapter of the architecture (digenrl_verl.models), which is what is missing" in text


def test_a_model_without_a_diffusers_layout_names_the_replicas_and_the_adapter(tmp_path):
    (tmp_path / "bagel").mkdir()
    with pytest.raises(ValueError) as err:
        _build(tmp_path / "bagel")
    text = str(err.value)
    assert text.startswith(f"{A}.model.path=") and "model_index.json is missing" in text
    assert "vLLM-Omni rollout replicas on GPUs" in text and "both are missing" in text


def _cpu_host_with_verl_omni(monkeypatch):
    """verl-omni installed: its rollout (``vllm_omni``: on CPU its pipeline in the generator's process) can run."""
    monkeypatch.setattr(EngineEntry, "unavailable_reason", lambda self: None)


@pytest.fixture(scope="module")
def tiny_sd3_dir(tmp_path_factory) -> str:
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return str(build_tiny_model_dir("StableDiffusion3Pipeline", tmp_path_factory.mktemp("sd3")))


def test_vllm_omni_on_a_cpu_host_with_verl_omni_plans_verl_omnis_rollout_pipeline(tiny_sd3_dir, tiny_flux_dir,
                                                                                  monkeypatch):
    _cpu_host_with_verl_omni(monkeypatch)
    window = (f"{A}.rollout.algo.timestep_selection=window", f"{A}.rollout.algo.sde_window_size=2",
              f"{A}.model.lora_rank=0")
    spec = _build(tiny_sd3_dir, f"{A}.rollout.name=vllm_omni", *window)
    assert spec.policy.engine.name == "verl_omni"
    found = [d for d in spec.decisions if d.startswith(f"{A}.rollout.name=vllm_omni on CPU")]
    assert len(found) == 1 and "verl-omni's own registered rollout pipeline" in found[0]
    lora = _build(tiny_sd3_dir, f"{A}.rollout.name=vllm_omni", *window[:2], f"{A}.model.lora_rank=4")
    assert lora.policy.engine.name == "verl_omni" and lora.policy.lora.rank == 4  # merged into its weights
    with pytest.raises(ValueError, match=rf"{A}\.rollout\.algo\.timestep_selection='flow_grpo'"):
        _build(tiny_sd3_dir, f"{A}.rollout.name=vllm_omni", f"{A}.rollout.algo.timestep_selection=flow_grpo",
               f"{A}.model.lora_rank=0")
    with pytest.raises(ValueError, match=rf"{A}\.model\.architecture='FluxPipeline' with {A}\.rollout\.name="):
        _build(tiny_flux_dir, f"{A}.rollout.name=vllm_omni", *window)


def test_without_verl_omni_vllm_omni_on_cpu_is_still_refused_by_name(tiny_flux_dir, monkeypatch):
    monkeypatch.setattr(EngineEntry, "unavailable_reason",
                        lambda self: None if self.name == "diffusers" else "not installed")
    with pytest.raises(ValueError, match=rf"{A}\.rollout\.name=vllm_omni cannot be used here"):
        _build(tiny_flux_dir, f"{A}.rollout.name=vllm_omni")
