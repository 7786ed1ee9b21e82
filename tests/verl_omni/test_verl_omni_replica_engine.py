"""The rollout engine ``verl_omni_replica`` (issue 29 item 2): a generator's samples from verl-omni's own rollout
replica (`vLLMOmniReplica.init_colocated` -> `vLLMOmniHttpServer` -> vLLM-Omni's `AsyncOmni` -> its spawned
diffusion worker), built by `ENGINES` from a `PolicySpec` inside a Ray actor on a generator pool's bundle, as a
generator worker holds it (the replica's worker group and server started from that actor), in a fresh interpreter
with Ray's logical GPUs as the device slots (`_replica_child.py`, engine mode).

* A real replica: verl-omni's server actor on the package's CPU platform, one spawned vLLM-Omni diffusion worker, no
  in-process harness in the server's process nor in the engine's actor.
* On the generator's own device: verl's colocated rollout mode, the replica's worker in the generator's placement
  group, in a Ray instance with one GPU, which the generator's bundle holds (a replica asking for a device of its
  own, as `init_standalone` does, would wait for it forever).
* Its `Rollout` for the rows equals the in-process ``verl_omni`` engine's (same requests, verl-omni's per-rollout
  seeds): latents, log-probs <= 1e-5; σ, step indices and versions equal; the decoded samples within one uint8
  level (fp32 rounding in another process).
* After a hand-over of new weights (the engine's weight path: into the trainers' shadow, then to the replica as
  verl's server adapter sends them), the next samples are the in-process engine's with the new weights, and not
  what the old weights sample.

* Its server requests, built without a pipeline object (`verl_omni_replica.PROMPT_PIPES`: the tokenizers alone),
  equal the in-process engine's, which verl-omni's Qwen-Image pipeline tokenizes itself, for Wan2.2 and Qwen-Image.

The replica runs Wan2.2 only: the cheapest (~60-130 s to start on CPU); Qwen-Image's replica (TP 2) serves the same
requests in test_verl_omni_replica_on_cpu.py. One replica start for the module.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

import torch  # noqa: E402

if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import failure_summary  # noqa: E402
from test_verl_omni_cpu_platform import ROWS, TOL, _in_process, _rel, _spec  # noqa: E402

from digenrl_verl.engines.base import ENGINES  # noqa: E402
from digenrl_verl.engines.spec import RolloutEngineSpec  # noqa: E402
from digenrl_verl.models import build_tiny_model_dir  # noqa: E402

HERE = Path(__file__).resolve().parent
ARCH = "WanPipeline"
EXACT = ("sigmas", "next_sigmas", "step_index", "policy_version")


def _errors(got, want) -> dict[str, float]:
    """Relative errors of the trajectories, and the largest image difference in uint8 levels."""
    out = {k: _rel(got.tensors[k], want.tensors[k]) for k in ("latents", "next_latents", "rollout_log_probs")}
    out["levels"] = int((got.images.int() - want.images.int()).abs().max())
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The in-process engine's Rollouts (before, the same rows of step 2 with the old weights, then with new ones)
    and the replica engine's for the same steps, in a fresh interpreter."""
    work = tmp_path_factory.mktemp("replica_engine")
    spec = _spec(ARCH, str(build_tiny_model_dir(ARCH, work / "model")))
    local = ENGINES.engine_class("verl_omni").from_policy(spec)
    second = replace(ROWS, step=2)
    refs = {"before": local.generate(ROWS), "after_old": local.generate(second)}
    gen = torch.Generator().manual_seed(1)
    state = {n: p.detach() + 0.05 * torch.randn(p.shape, generator=gen) for n, p in local.state.items()}
    local.hand_over(state, 1)
    refs["after"] = local.generate(second)
    job = {"engine": replace(spec, engine=RolloutEngineSpec(name="verl_omni_replica", dtype="float32")),
           "steps": [("generate", ROWS), ("hand_over", state, 1), ("generate", second)]}
    (work / "job.pkl").write_bytes(pickle.dumps(job))
    proc = subprocess.run([sys.executable, str(HERE / "_replica_child.py"), str(work / "job.pkl"),
                           str(work / "out.pt")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, failure_summary(proc.stdout + proc.stderr)
    return torch.load(work / "out.pt", weights_only=False), refs


@pytest.mark.slow  # Ray, verl-omni's server actor, AsyncOmni and its worker process
def test_the_replica_engine_samples_what_the_in_process_engine_samples(run):
    got, refs = run
    server = got["server"]
    assert got["replica"] == "vLLMOmniReplica" and not got["harness_here"], got
    assert got["mode"] == "colocated" and got["cluster_gpus"] == 1.0, got  # the generator's bundle holds the GPU
    assert got["worker_pgs"] == [got["host_pg"]], got  # the replica's worker on the generator's own bundle
    assert server["platform"] == "CpuOmniPlatform" and not server["harness_imported"], server
    workers = [name for name in server["workers"] if name.startswith("vLLM-Omni::DiffusionWorker")]
    assert len(workers) == 1, server["workers"]
    rollout = got["steps"][0]["out"]
    errors = _errors(rollout, refs["before"])
    print(f"replica engine vs in-process {errors}; start {got['start_s']:.1f} s, {len(ROWS)} samples in "
          f"{got['steps'][0]['s']:.1f} s")
    assert max(v for k, v in errors.items() if k != "levels") <= TOL and errors["levels"] <= 1, errors
    for key in EXACT:
        assert torch.equal(rollout.tensors[key], refs["before"].tensors[key]), key
    assert rollout.images.shape == refs["before"].images.shape and rollout.images.dtype == torch.uint8


@pytest.mark.slow
def test_a_hand_over_changes_the_replicas_next_samples_to_the_new_weights(run):
    got, refs = run
    rollout = got["steps"][2]["out"]
    err, stale = _errors(rollout, refs["after"]), _errors(rollout, refs["after_old"])
    print(f"after the hand-over {err} (update {got['steps'][1]['s']:.1f} s); against the old weights' samples "
          f"{stale}")
    assert max(v for k, v in err.items() if k != "levels") <= TOL and err["levels"] <= 1, err
    assert stale["latents"] > 1e3 * TOL, stale  # not what the old weights sample
    assert rollout.tensors["policy_version"].tolist() == [1] * len(ROWS)


def _choice(device: str = "cpu", **digenrl) -> tuple[str, list[str]]:
    """The generators' engine a run on `device` with ``rollout.name=vllm_omni`` gets with the `trainer.digenrl`
    settings `digenrl`, and the plan's decisions."""
    from omegaconf import OmegaConf

    from digenrl_verl.config.digenrl import DigenRLConfig
    from digenrl_verl.config.verl_omni import RecipeKeys, generator_engine_name

    keys = RecipeKeys(OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm_omni"}}}))
    return generator_engine_name(keys, DigenRLConfig(**digenrl), device), keys.decisions


def test_vllm_omni_chooses_the_replicas_on_cuda_and_the_pipeline_on_cpu_unless_told(monkeypatch):
    """verl-omni installed (this venv): null (default) = the in-process pipeline on CPU (``verl_omni``), replicas on
    CUDA (``verl_omni_replica``, the path verl-omni takes on GPUs); true / false honoured (false on CUDA refused, the
    pipeline is CPU only); a dry run chooses as a real run; each choice said in the plan, the key's value in it."""
    from digenrl_verl.platform.cpu import LOGICAL_GPUS_VAR

    key = "trainer.digenrl.generator_replicas"
    monkeypatch.delenv(LOGICAL_GPUS_VAR, raising=False)
    name, said = _choice()
    assert name == "verl_omni" and said[-1].startswith(f"actor_rollout_ref.rollout.name=vllm_omni on CPU ({key}=auto)")
    assert f"{key}=true starts verl-omni's replicas" in said[-1]
    name, said = _choice(generator_replicas=True)
    assert name == "verl_omni_replica" and f"({key}=true)" in said[-1]
    assert "on its own placement-group bundle" in said[-1]
    assert _choice(generator_replicas=True, dry_run=True)[0] == "verl_omni_replica"
    name, said = _choice("cuda")
    assert name == "verl_omni_replica" and said[-1].startswith(f"actor_rollout_ref.rollout.name=vllm_omni on CUDA "
                                                                f"({key}=auto)")
    assert _choice("cuda", generator_replicas=True)[0] == "verl_omni_replica"
    with pytest.raises(ValueError, match=f"{key}=false with .*trainer.device=cuda"):
        _choice("cuda", generator_replicas=False)


def test_a_replica_outside_a_generator_bundle_is_refused_naming_the_fix(ray_session, monkeypatch):
    """The replica shares its generator rank's bundle; a process on none (or on a bundle without a GPU share) is told
    to start the generators through the run, before verl places anything."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from digenrl_verl.integrations.verl_omni_replica import ReplicaConfig, own_bundle_pool
    from digenrl_verl.workers.pools import BUNDLE_VAR

    cfg = ReplicaConfig(model="m", algorithm="dance_grpo", height=32, width=32, steps=4)
    monkeypatch.delenv(BUNDLE_VAR, raising=False)
    with pytest.raises(RuntimeError, match="on none with a GPU share .*start the generators through the run"):
        own_bundle_pool(cfg)
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready())
    try:
        probe = ray.remote(lambda: own_bundle_pool(cfg)).options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0),
            runtime_env={"env_vars": {BUNDLE_VAR: "0"}})
        with pytest.raises(ray.exceptions.RayTaskError, match="on none with a GPU share"):
            ray.get(probe.remote())
    finally:
        remove_placement_group(pg)


@pytest.mark.parametrize("arch", ["WanPipeline", "QwenImagePipeline", "StableDiffusion3Pipeline"])
def test_the_requests_built_without_the_pipeline_are_the_in_process_engines(arch, tmp_path):
    from digenrl_verl.integrations.verl_omni_replica import PROMPT_PIPES, check_replica_policy
    from digenrl_verl.integrations.verl_omni_rollout import server_requests

    spec = _spec(arch, str(build_tiny_model_dir(arch, tmp_path / "model")))
    local = ENGINES.engine_class("verl_omni").from_policy(spec)
    rows = replace(ROWS, prompts=[ROWS.prompts[0], "x " * 40 + "a very long prompt"])
    assert check_replica_policy(spec)[0] == arch
    ours = server_requests(PROMPT_PIPES[arch](spec.model_path), arch, spec, local.sampling, rows)
    assert ours == local.server_requests(rows)
    assert all(r["prompt"]["prompt_token_ids"] for r in ours)


def test_sd3_requests_carry_per_encoder_ids_that_sample_what_the_text_path_samples(tmp_path):
    """SD3's request, as verl-omni's agent loop builds it (`extra_prompt_ids`: CLIP and T5 ids, which the server
    takes), samples exactly what vLLM-Omni's text path samples (the request the in-process engine sent before):
    latents and log-probs of two rows with guidance (negative ids too), through verl-omni's SD3 rollout pipeline."""
    from vllm_omni.diffusion.request import OmniDiffusionRequest
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    from digenrl_verl.integrations.verl_omni_rollout import split_sampling

    spec = _spec("StableDiffusion3Pipeline", str(build_tiny_model_dir("StableDiffusion3Pipeline", tmp_path / "m")))
    engine = ENGINES.engine_class("verl_omni").from_policy(spec)
    served = engine.server_requests(ROWS)
    assert all(set(r["prompt"]["extra_prompt_ids"]) == {"clip", "t5"} and "negative_extra_prompt_ids" in r["prompt"]
               for r in served)
    texts = [OmniDiffusionRequest(prompt={"prompt": p, "negative_prompt": spec.pipeline.negative_prompt},
                                  request_id=r["request_id"], sampling_params=OmniDiffusionSamplingParams(
                                      **split_sampling(r["sampling_params"], OmniDiffusionSamplingParams)))
             for p, r in zip(ROWS.prompts, served)]
    ids, text = _in_process(engine, engine.requests(ROWS)), _in_process(engine, texts)
    for a, b in zip(ids, text):
        for k in ("latents", "log_probs"):
            assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])), k


def test_the_users_engine_kwargs_reach_the_replicas_rollout_config():
    """`actor_rollout_ref.rollout.engine_kwargs.vllm_omni` (the spec's `engine_kwargs`) is in the replica's rollout
    config as verl-omni's own run would have it (its server hands it to `AsyncOmni`); on CPU one request per batch."""
    from digenrl_verl.integrations.verl_omni_replica import ReplicaConfig, replica_configs

    cfg = ReplicaConfig(model="/m", algorithm="flow_grpo", height=32, width=32, steps=4,
                        engine_kwargs=(("max_num_seqs", 8), ("request_batch_max_wait_ms", 10), ("enforce_eager", True)))
    rollout, _ = replica_configs(cfg)
    want = {"max_num_seqs": 1 if not torch.cuda.is_available() else 8, "request_batch_max_wait_ms": 10,
            "enforce_eager": True}
    assert dict(rollout.engine_kwargs.vllm_omni) == want
    assert dict(replica_configs(ReplicaConfig(model="/m", algorithm="flow_grpo", height=32, width=32, steps=4))[0]
                .engine_kwargs.vllm_omni) == ({} if torch.cuda.is_available() else {"max_num_seqs": 1})
