"""The rollout engine ``verl_omni_replica`` (issue 29 item 2): a generator's samples from verl-omni's own rollout
replica (`vLLMOmniReplica.init_colocated` -> `vLLMOmniHttpServer` -> vLLM-Omni's `AsyncOmni` -> its spawned
diffusion worker), built by `ENGINES` from a `PolicySpec` inside a Ray actor on a generator pool's bundle, as a
generator worker holds it (the replica's worker group and server started from that actor), with Ray's logical GPUs as
the device slots: `python -m digenrl_verl.bench rollout --engines verl_omni,verl_omni_replica` in a fresh process
(its `--keep` file holds what is checked here; its JSON line is the bench's own smoke in this tier).

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
* A replica whose server dies is replaced on the same bundle, with the weights the engine holds, and the call's rows
  are drawn again: the same samples; the dead server's diffusion worker has exited.

* Its server requests, built without a pipeline object (`verl_omni_replica.PROMPT_PIPES`: the tokenizers alone),
  equal the in-process engine's, which verl-omni's Qwen-Image pipeline tokenizes itself, for Wan2.2 and Qwen-Image.

The replica runs Wan2.2 only: the cheapest (~60-130 s to start on CPU); Qwen-Image's replica (TP 2) serves the same
requests in test_verl_omni_replica_on_cpu.py. Two replica starts for the module (the first, and its replacement).
"""

from __future__ import annotations

import json
import os
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
from test_verl_omni_cpu_platform import ROWS, TOL, _in_process, _spec  # noqa: E402

from digenrl_verl.bench.rollout import errors as _errors  # noqa: E402
from digenrl_verl.engines.base import ENGINES  # noqa: E402
from digenrl_verl.models import build_tiny_model_dir  # noqa: E402

ARCH = "WanPipeline"
EXACT = ("sigmas", "next_sigmas", "step_index", "policy_version")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`bench rollout` of the in-process engine and the replica engine (module docstring): its JSON line and its
    kept results (facts, the first round's, after-update and recovered rollouts of each engine)."""
    work = tmp_path_factory.mktemp("replica_engine")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "TORCH_COMPILE_DISABLE": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "digenrl_verl.bench", "rollout", "--engines",
                           "verl_omni,verl_omni_replica", "--rounds", "1", "--samples", str(len(ROWS.prompts)),
                           "--keep", str(work), "--json"], capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, failure_summary(proc.stdout + proc.stderr)
    print(proc.stdout.splitlines()[-2] if len(proc.stdout.splitlines()) > 1 else proc.stdout)
    kept = torch.load(work / "rollout.pt", weights_only=False)
    local, replica = kept["results"]
    return json.loads(proc.stdout.splitlines()[-1]), local, replica


@pytest.mark.slow  # Ray, verl-omni's server actor, AsyncOmni and its worker process
def test_the_replica_engine_samples_what_the_in_process_engine_samples(run):
    out, local, got = run
    server = got["server"]
    assert got["replica"] == "vLLMOmniReplica" and not got["harness_here"], got
    assert got["mode"] == "colocated" and got["cluster_gpus"] == 1.0, got  # the generator's bundle holds the GPU
    assert got["worker_pgs"] == [got["host_pg"]], got  # the replica's worker on the generator's own bundle
    assert server["platform"] == "CpuOmniPlatform" and not server["harness_imported"], server
    workers = [name for name in server["workers"] if name.startswith("vLLM-Omni::DiffusionWorker")]
    assert len(workers) == 1, server["workers"]
    rollout = got["first"]
    errors = _errors(rollout, local["first"])
    print(f"replica engine vs in-process {errors}; start {got['start_s']:.1f} s, {len(ROWS.prompts)} samples in "
          f"{got['round_s'][0]:.1f} s")
    assert max(v for k, v in errors.items() if k != "levels") <= TOL and errors["levels"] <= 1, errors
    for key in EXACT:
        assert torch.equal(rollout.tensors[key], local["first"].tensors[key]), key
    assert rollout.images.shape == local["first"].images.shape and rollout.images.dtype == torch.uint8
    assert out["bench"] == "rollout" and out["baseline"] == "verl_omni" and out["within_tolerance"] is True, out
    assert [r["engine"] for r in out["rows"]] == ["verl_omni", "verl_omni_replica"]
    assert set(out["speedup"]["verl_omni_replica"]) == {"start_s", "samples_per_s"}


@pytest.mark.slow
def test_a_hand_over_changes_the_replicas_next_samples_to_the_new_weights(run):
    _, local, got = run
    rollout = got["after"]
    err, stale = _errors(rollout, local["after"]), _errors(rollout, local["first"])
    print(f"after the hand-over {err} (update {got['update_s']:.1f} s); against the old weights' samples {stale}")
    assert max(v for k, v in err.items() if k != "levels") <= TOL and err["levels"] <= 1, err
    assert stale["latents"] > 1e3 * TOL, stale  # not what the old weights sample
    assert rollout.tensors["policy_version"].tolist() == [1] * len(ROWS.prompts)


@pytest.mark.slow
def test_a_replica_that_died_is_replaced_on_its_bundle_and_the_rows_are_drawn_again(run):
    """The replica's server is killed after the hand-over; the engine's next call finds it dead, starts a new replica
    on the generator's bundle (the Ray instance has one GPU: the dead replica's half must come back to it), hands it
    the weights of version 1, and draws the same rows again: the same samples as before the death, nothing lost."""
    _, local, got = run
    err = _errors(got["recovered"], local["after"])
    print(f"after the server died: a new replica in {got['recovery_s']:.1f} s, its samples {err}")
    assert got["replicas_started"] == 2
    assert got["left_behind"] == []  # the dead server's diffusion worker exited with it (no process holds a device)
    assert max(v for k, v in err.items() if k != "levels") <= TOL and err["levels"] <= 1, err
    assert got["recovered"].tensors["policy_version"].tolist() == [1] * len(ROWS.prompts)


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


def test_a_model_verl_omni_does_not_register_for_the_algorithm_is_refused_naming_the_key(tmp_path):
    """Wan2.2 with a flow_grpo SDE (verl-omni registers Wan for dance_grpo only): refused before a replica starts
    (`training_schedule` runs first in `from_policy`), naming the key and the fix (dance_grpo's schedule: the
    engine's run above)."""
    from digenrl_verl.integrations.verl_omni_replica import ReplicaConfig, replica_configs, training_schedule

    model = str(build_tiny_model_dir(ARCH, tmp_path / "model"))
    cfg = ReplicaConfig(model=model, algorithm="flow_grpo", height=32, width=32, steps=4)
    with pytest.raises(ValueError, match=r"rollout\.algo\.sde_type gives verl-omni's algorithm flow_grpo, for which "
                                         r"verl-omni registers no WanPipeline .*\['dance', 'dance_sde'\]"):
        training_schedule(replica_configs(cfg)[1], ARCH, "flow_grpo")


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


def test_wan_at_the_pipelines_default_guidance_gets_the_negative_prompt_and_samples(tmp_path):
    """No guidance_scale (the pipeline's default: verl-omni's Wan2.2 adapter guides at 5.0): the requests carry the
    negative prompt's ids, which the adapter needs (without them its `encode_prompt` fails on None, found by a
    by-hand run through the replicas), and verl-omni's pipeline samples them; guidance_scale=1 sends none."""
    spec = _spec(ARCH, str(build_tiny_model_dir(ARCH, tmp_path / "model")))
    default = replace(spec, pipeline=replace(spec.pipeline, guidance_scale=None))
    local = ENGINES.engine_class("verl_omni").from_policy(default)
    assert all("negative_prompt_ids" in r["prompt"] for r in local.server_requests(ROWS))
    assert local.generate(ROWS).tensors["latents"].shape[0] == len(ROWS.prompts)
    unguided = ENGINES.engine_class("verl_omni").from_policy(replace(spec, pipeline=replace(spec.pipeline,
                                                                                            guidance_scale=1.0)))
    assert not any("negative_prompt_ids" in r["prompt"] for r in unguided.server_requests(ROWS))


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
