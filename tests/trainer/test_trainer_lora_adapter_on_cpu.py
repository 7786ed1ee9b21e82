"""`actor_rollout_ref.model.lora_adapter_path` (issue 21): the LoRA starts from a pre-trained adapter, as verl-omni's
engine loads it (`LoRAAdapterMixin._build_lora_module`): the adapter's rank, alpha and targets, its weights on the
trainers and on the generators, so the first sample is the adapted pipeline's. A peft directory (`save_pretrained`)
or a diffusers LoRA file (`save_lora_weights`, keys under `transformer.`); a missing path fails build_run by name.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import rollout
from digenrl_verl.engines.diffusers import load_policy
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.models.config import LoraConfig
from digenrl_verl.models.lora import AdapterLoraConfig, read_lora_adapter
from digenrl_verl.trainer.config import build_run

KEY = "actor_rollout_ref.model.lora_adapter_path"


@pytest.fixture(scope="module")
def peft_adapter(tiny_flux_dir, tmp_path_factory):
    """A peft adapter of the tiny FLUX transformer (r=4, alpha=8, to_q/to_v), random non-zero weights: (dir, state)."""
    from diffusers import FluxTransformer2DModel
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model, get_peft_model_state_dict

    transformer = FluxTransformer2DModel.from_pretrained(tiny_flux_dir, subfolder="transformer")
    model = get_peft_model(transformer, PeftLoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_v"]))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    out = tmp_path_factory.mktemp("adapters") / "peft"
    model.save_pretrained(str(out))
    state = get_peft_model_state_dict(model)
    return str(out), {k.removeprefix("base_model.model."): v.clone() for k, v in state.items()}


def _run(model_dir, *overrides):
    return build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model_dir}", *overrides]))


def _sample(policy, spec):
    cond = policy.encode_prompts(["a red cube", "a red cube"])
    keys = [SampleKey(0, "u0", 0), SampleKey(0, "u0", 1)]
    return rollout(policy, cond, keys, spec.rollout).final_latents


def test_the_trainer_starts_from_the_adapters_weights_and_config(tiny_flux_dir, peft_adapter):
    path, state = peft_adapter
    run = _run(tiny_flux_dir, f"{KEY}={path}", "actor_rollout_ref.model.lora_rank=16",
               "actor_rollout_ref.model.target_modules=all-linear")
    lora = run.policy.lora
    assert isinstance(lora, AdapterLoraConfig) and lora.adapter_path == path
    assert (lora.rank, lora.alpha, sorted(lora.target_modules)) == (4, 8.0, ["to_q", "to_v"])
    assert any(path in d and "r=4, lora_alpha=8" in d for d in run.decisions), run.decisions
    policy = load_policy(run.policy)
    ours = {k.removeprefix("base_model.model.").replace(".default.", "."): v for k, v in
            policy.trainable_state().items()}
    assert sorted(ours) == sorted(state)
    for name, value in state.items():
        torch.testing.assert_close(ours[name], value, rtol=0, atol=0)


def test_the_first_sample_is_the_adapted_pipelines(tiny_flux_dir, peft_adapter):
    from peft import PeftModel

    path, _ = peft_adapter
    spec = _run(tiny_flux_dir, f"{KEY}={path}").policy
    ours = _sample(load_policy(spec), spec)
    plain = load_policy(replace(spec, lora=LoraConfig()))  # the base model, peft's own loader for the adapter
    base = _sample(plain, spec)
    plain.transformer = PeftModel.from_pretrained(plain.transformer, path)
    theirs = _sample(plain, spec)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert (ours - base).abs().max() > 1e-3  # the adapter changes the sample


def test_a_diffusers_lora_file_reads_as_the_peft_directory(peft_adapter, tmp_path):
    from diffusers import FluxPipeline

    path, state = peft_adapter
    FluxPipeline.save_lora_weights(str(tmp_path), transformer_lora_layers=state,
                                   transformer_lora_adapter_metadata={"r": 4, "lora_alpha": 8,
                                                                      "target_modules": ["to_q", "to_v"]})
    from_file, from_dir = read_lora_adapter(str(tmp_path / "pytorch_lora_weights.safetensors")), read_lora_adapter(path)
    assert from_file.kind == "diffusers" and from_dir.kind == "peft"
    for field in ("r", "lora_alpha"):
        assert from_file.config[field] == from_dir.config[field]
    assert sorted(from_file.state) == sorted(from_dir.state)
    for k, v in from_dir.state.items():
        assert torch.equal(from_file.state[k], v)


def test_a_missing_adapter_fails_build_run_by_name(tiny_flux_dir, tmp_path):
    with pytest.raises(ValueError) as e:
        _run(tiny_flux_dir, f"{KEY}={tmp_path / 'nowhere'}")
    assert KEY in str(e.value) and "does not exist" in str(e.value) and "set it to null" in str(e.value)
