"""The vLLM-free parts of the vLLM-Omni engine (`engines.vllm_omni`) on CPU: requests (one per prompt), the
trajectory pipeline core (our SDE code, so its log-probs are the trainer's), the mapping back to shard order, and
versions. The parts that touch vLLM-Omni are held to the real package in tests/contract (a second venv)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
from digenrl_verl.diffusion.sde import sde_step
from digenrl_verl.engines import base
from digenrl_verl.engines import vllm_omni as vl
from digenrl_verl.models.config import PipelineConfig

torch.set_num_threads(1)
PIPE = PipelineConfig(height=32, width=32, num_inference_steps=6, max_sequence_length=16)
CFG = RolloutConfig(num_inference_steps=6, sde_type="sde", noise_level=0.7, timestep_selection="window",
                    sde_window_size=2, sde_window_range=(0, 4), seed=3)
# A shard as GAP hands it to one generator rank: rows of two prompt groups, not in group order.
PROMPTS = ["a red cube", "a blue ball", "a red cube", "a blue ball", "a red cube"]
UIDS = ["u0", "u1", "u0", "u1", "u0"]
INDEX = [0, 3, 2, 1, 1]
STEP = 7


@pytest.fixture(scope="module")
def adapter(tiny_dirs):
    from digenrl_verl.models.registry import load_adapter

    return load_adapter(tiny_dirs["FluxPipeline"], pipeline=PIPE, keep_reference=False)


def test_require_vllm_omni_names_the_key_and_the_fix_on_cpu():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name=vllm_omni cannot be used here.*"
                                         r"set actor_rollout_ref\.rollout\.name=diffusers"):
        vl.require_vllm_omni()


def test_one_request_per_prompt_with_all_its_samples():
    reqs = vl.build_requests(PROMPTS, UIDS, INDEX, step=STEP, version=4, pipeline=PIPE, rollout=CFG)
    assert [(r.prompt, r.rows, r.num_outputs) for r in reqs] == [("a red cube", [0, 2, 4], 3),
                                                                  ("a blue ball", [1, 3], 2)]
    assert [r.extra_args["digenrl"]["sample_indices"] for r in reqs] == [[0, 2, 1], [3, 1]]
    assert len({r.batching_key() for r in reqs}) == 1  # same size/steps/guidance: vLLM-Omni can batch them
    assert len({r.request_id for r in reqs}) == 2
    json.dumps([r.extra_args for r in reqs])  # travels through vLLM's sampling params
    assert vl.rollout_config_from_dict(reqs[0].extra_args["digenrl"]["rollout"]) == CFG
    with pytest.raises(ValueError, match="rows of prompt uid 'u0' carry different prompts"):
        vl.build_requests(["x", "y"], ["u0", "u0"], [0, 1], step=0, version=0, pipeline=PIPE, rollout=CFG)


def test_core_outputs_are_the_diffusers_trajectories_and_on_policy(adapter):
    core = vl.TrajectoryPipelineCore(adapter, version=4, register=False)
    reqs = vl.build_requests(PROMPTS, UIDS, INDEX, step=STEP, version=4, pipeline=PIPE, rollout=CFG)
    outs = [core.run(r.prompt, r.num_outputs, r.extra_args) for r in reqs]
    ids = [10, 11, 12, 13, 14]
    tensors, images = vl.outputs_to_batch(reqs, outs, ids, len(PROMPTS))
    assert tensors["sample_id"].tolist() == ids and tensors["policy_version"].tolist() == [4] * 5
    assert images.dtype == torch.uint8 and images.shape[0] == 5

    # The diffusers generator's rollout of the same rows (same keys, one batch in shard order).
    keys = [SampleKey(STEP, u, i) for u, i in zip(UIDS, INDEX)]
    ref = rollout(adapter, adapter.encode_prompts(PROMPTS), keys, CFG)
    assert torch.equal(tensors["step_index"], ref.step_index)  # same per-sample window selection
    for k in ("sigmas", "next_sigmas"):
        assert torch.equal(tensors[k], getattr(ref, k))
    for k in ("latents", "next_latents", "final_latents", "log_probs"):  # batch neighbours differ: fp32 rounding
        torch.testing.assert_close(tensors[k], getattr(ref, k), rtol=1e-4, atol=1e-5)

    # Training side: the trainer's log-prob of each recorded transition under the same weights.
    cond = adapter.encode_prompts(PROMPTS)
    for k in range(tensors["latents"].shape[1]):
        x, sig, nxt = tensors["latents"][:, k], tensors["sigmas"][:, k], tensors["next_sigmas"][:, k]
        with torch.no_grad():
            v = adapter.velocity(x, sig, cond)
        lp = sde_step(CFG.sde_type, v, x, sig, nxt, CFG.noise_level, prev_sample=tensors["next_latents"][:, k]).log_prob
        torch.testing.assert_close(lp, tensors["rollout_log_probs"][:, k], rtol=1e-4, atol=1e-4)


def test_weights_apply_between_requests_and_versions_follow(adapter):
    core = vl.TrajectoryPipelineCore(adapter, version=0, register=False)
    state = adapter.trainable_state()
    new = {k: v + 0.01 for k, v in state.items()}
    req = vl.build_requests(PROMPTS[:2], UIDS[:2], INDEX[:2], step=0, version=0, pipeline=PIPE, rollout=CFG)[0]

    # An update arriving while a request runs is held until the request is done.
    encode = adapter.encode_prompts

    def encode_and_receive(prompts):
        core.stage_weights(new, 1)
        assert core.version == 0
        return encode(prompts)

    adapter.encode_prompts = encode_and_receive
    try:
        out = core.run(req.prompt, req.num_outputs, req.extra_args)
    finally:
        adapter.encode_prompts = encode
    assert out["policy_version"] == 0 and core.version == 1
    assert all(torch.equal(adapter.trainable_state()[k], new[k]) for k in new)
    with pytest.raises(RuntimeError, match="holds policy version 1 but the request asks for 0"):
        core.run(req.prompt, req.num_outputs, req.extra_args)
    core.stage_weights(state, 2)  # idle: applies at once
    assert core.version == 2 and all(torch.equal(adapter.trainable_state()[k], state[k]) for k in state)


def test_outputs_must_cover_the_shard():
    reqs = vl.build_requests(PROMPTS, UIDS, INDEX, step=STEP, version=0, pipeline=PIPE, rollout=CFG)
    with pytest.raises(ValueError, match="2 requests but 1 outputs"):
        vl.outputs_to_batch(reqs, [{}], list(range(5)), 5)


def test_engine_kwargs_never_name_enable_dummy_pipeline_and_clamp_max_num_seqs():
    with pytest.warns(UserWarning, match="max_num_seqs=8 is clamped to 1"):
        kw = vl.build_engine_kwargs("m", {"pipeline_class": vl.PIPELINE_CLASS}, {"max_num_seqs": 8}, dtype="float32")
    assert kw["max_num_seqs"] == 1 and "enable_dummy_pipeline" not in kw
    assert kw["model_class_name"] == vl.PIPELINE_NAME and kw["worker_extension_cls"] == vl.WORKER_EXTENSION_CLASS


def test_rpc_results_unwrap_and_worker_errors_raise():
    assert vl.unwrap_rpc_result("m", [[{"version": 1}]]) == {"version": 1}
    for bad in ([{"error": True, "reason": "boom"}], [{"supported": False, "error": "boom"}],
                [[{"error": True, "reason": "boom"}]]):
        with pytest.raises(vl.VllmOmniRpcError, match="boom"):
            vl.unwrap_rpc_result("m", bad)
    with pytest.raises(TypeError, match="dataclass"):
        vl.plain_rpc_args((CFG,))


def test_isolate_master_port_sets_a_free_port(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "29500")
    port = vl.isolate_master_port()
    import os

    assert os.environ["MASTER_PORT"] == str(port) and port != 29500


def test_the_vllm_pins_are_spelled_alike_in_the_extra_the_hint_the_contract_venv_and_the_docs():
    """One vllm / vllm-omni pair: setup.py's `[vllm]` extra, the install hint (engines.base) and the contract tier's
    default venv (scripts/contract_venv.sh) name the same versions; the docs name that pair or verl-omni's."""
    root = Path(__file__).parents[2]
    setup = ast.parse((root / "setup.py").read_text())
    extras = next(ast.literal_eval(node.value) for node in ast.walk(setup) if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "EXTRAS" for t in node.targets))
    assert sorted(extras["vllm"]) == [f"vllm-omni=={base.VLLM_OMNI_PIN}", f"vllm=={base.VLLM_PIN}"]
    script = (root / "scripts" / "contract_venv.sh").read_text()
    assert f'VLLM_VERSION="${{DIGENRL_CONTRACT_VLLM:-{base.VLLM_PIN}}}"' in script
    assert f'VLLM_OMNI_VERSION="${{DIGENRL_CONTRACT_VLLM_OMNI:-{base.VLLM_OMNI_PIN}}}"' in script
    assert base.VLLM_PIN.rsplit(".", 1)[0] == base.VLLM_OMNI_PIN.rsplit(".", 1)[0]  # vllm X.Y with vllm-omni X.Y
    known = {("vllm", base.VLLM_PIN), ("vllm-omni", base.VLLM_OMNI_PIN), ("vllm", base.VERL_OMNI_VLLM_PIN),
             ("vllm-omni", base.VERL_OMNI_VLLM_OMNI_PIN)}
    mention = re.compile(r"\b(vllm(?:-omni)?)(?:==| )(\d+\.\d+\.\d+\w*)", re.IGNORECASE)
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "digenrl_verl/engines/vllm_omni.py"]
    found = {(doc.name, name.lower(), version) for doc in docs for name, version in mention.findall(doc.read_text())}
    assert found and not {f for f in found if f[1:] not in known}, found
