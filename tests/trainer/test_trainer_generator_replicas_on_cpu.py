"""`trainer.digenrl.generator_replicas` with `rollout.name=vllm_omni` (what verl-omni's scripts set): verl-omni's
rollout replicas as the generators, each on its generator rank's own bundle and device (rollout engine
``verl_omni_replica``), or its rollout pipeline in each generator's process (``verl_omni``, CPU only). null
(default) = auto: replicas on CUDA, the pipeline on CPU.

* The run plans it, a dry run as a real run: the engine, the key in plan.json, a decision saying what it chose.
* A generator rank and its replica share the rank's bundle (`pool_spec`: the bundle holds the device, the rank's
  worker asks half of it): one GPU per generator rank on CUDA, the replica included.
* The run gives the replicas of a CPU run their resources itself: its local Ray instance one logical GPU and one more
  CPU per generator bundle (`local_ray_resources`), its generators' processes Ray's logical-GPU mode (`worker_env`);
  nothing for a run without replicas.
* Refused before any worker starts, naming the key and the fix: false on CUDA; a model the replicas cannot serve;
  a real run without verl-omni.
* Set where it has no effect (another rollout engine): warned by name and said in the plan.

verl-omni itself is not needed here: its packages' presence is stood in for (`find_spec`, which is all the engine
registry asks), and no worker starts.
"""

from __future__ import annotations

import importlib.util
import re
import warnings

import pytest

from digenrl_verl.config.digenrl import DigenRLConfig
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.models import build_tiny_model_dir
from digenrl_verl.platform.cpu import LOGICAL_GPUS_VAR
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.runner import local_ray_resources, pool_spec, worker_env

A = "actor_rollout_ref"
KEY = "trainer.digenrl.generator_replicas"
DISAGGREGATED = ("trainer.digenrl.mode=disaggregated", "trainer.digenrl.pools.generator.workers_per_node=2",
                 "trainer.digenrl.tag.policy=off", f"{A}.rollout.algo.sde_window_size=2")


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory) -> str:
    """A tiny Wan2.2 (an architecture both verl-omni engines serve)."""
    return str(build_tiny_model_dir("WanPipeline", tmp_path_factory.mktemp("models") / "tiny_wan"))


@pytest.fixture
def verl_omni_present(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: object()
                        if name in ("verl_omni", "vllm_omni") else real(name, *a, **k))


def _build(model_dir, *overrides):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = build_run(compose([TINY_CPU, f"{A}.model.path={model_dir}", *overrides]))
    return spec, [str(w.message) for w in caught]


def test_the_key_plans_the_replicas_and_gives_them_ray_resources(wan_dir, verl_omni_present):
    spec, _ = _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED, f"{KEY}=true")
    assert spec.policy.engine.name == "verl_omni_replica"
    assert spec.plan()["config"][KEY] is True
    said = [d for d in spec.decisions if d.startswith(f"{A}.rollout.name=vllm_omni on CPU ({KEY}=true)")]
    assert len(said) == 1 and "on its own placement-group bundle" in said[0], spec.decisions
    assert "logical GPU (the run's own local Ray instance gets one per generator rank" in said[0]
    assert "engines: generation verl_omni_replica" in spec.describe()
    # 1 trainer bundle {CPU: 1}, 2 generator bundles {CPU: 2, GPU: 1} (rank + replica), 1 CPU to place the servers
    assert pool_spec(spec, "generator", "g").bundle() == {"CPU": 2, "GPU": 1.0}
    assert pool_spec(spec, "trainer", "t").bundle() == {"CPU": 1}
    assert local_ray_resources(spec) == (1 + 2 * 2 + 1, 2)
    assert worker_env(spec, "generator")[LOGICAL_GPUS_VAR] == "1"
    assert LOGICAL_GPUS_VAR not in worker_env(spec, "trainer")


def test_without_the_key_a_cpu_run_keeps_verl_omnis_pipeline_and_ray_gets_no_gpus(wan_dir, verl_omni_present):
    spec, _ = _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED)
    assert spec.policy.engine.name == "verl_omni" and spec.plan()["config"][KEY] is None
    said = [d for d in spec.decisions if d.startswith(f"{A}.rollout.name=vllm_omni on CPU ({KEY}=auto)")]
    assert len(said) == 1 and f"{KEY}=true starts verl-omni's replicas instead" in said[0], spec.decisions
    assert local_ray_resources(spec) == (3, None)
    assert LOGICAL_GPUS_VAR not in worker_env(spec, "generator")


def test_the_key_where_it_has_no_effect_is_warned_by_name(wan_dir, verl_omni_present):
    spec, warned = _build(wan_dir, f"{A}.rollout.name=diffusers", *DISAGGREGATED, f"{KEY}=true")
    assert spec.policy.engine.name == "diffusers" and local_ray_resources(spec)[1] is None
    note = f"{KEY}=true has no effect: {A}.rollout.name=diffusers"
    assert any(m.startswith(note) for m in warned), warned
    assert any(d.startswith(note) and d.endswith("(warned)") for d in spec.decisions), spec.decisions


def test_a_dry_run_chooses_as_the_real_run_does(wan_dir):
    """A dry run plans for the cluster: the same engine as a real run with the same keys, verl-omni installed or
    not (here it is not: the plan says so, a real run would be refused)."""
    dry = "trainer.digenrl.dry_run=true"
    spec, _ = _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED, f"{KEY}=true", dry)
    assert spec.policy.engine.name == "verl_omni_replica" and not spec.policy.engine.runs_here
    spec, _ = _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED, dry)
    assert spec.policy.engine.name == "verl_omni"


CUDA = ("trainer.device=cuda", "trainer.digenrl.pools.generator.use_gpu=true",
        "trainer.digenrl.pools.trainer.use_gpu=true", "trainer.digenrl.dry_run=true")


def test_a_cuda_run_takes_verl_omnis_replicas_and_says_so_in_plan_json(wan_dir, tmp_path):
    """On CUDA `rollout.name=vllm_omni` is verl-omni's replicas by default (the path verl-omni itself takes on GPUs),
    in the plan and in the plan.json a dry run writes; no logical GPUs are reserved (Ray counts the host's)."""
    spec, _ = _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED, *CUDA,
                     f"trainer.digenrl.output_dir={tmp_path}")
    assert spec.policy.device == "cuda" and spec.policy.engine.name == "verl_omni_replica"
    said = [d for d in spec.decisions if d.startswith(f"{A}.rollout.name=vllm_omni on CUDA ({KEY}=auto)")]
    assert len(said) == 1 and "on its own placement-group bundle" in said[0], spec.decisions
    assert "its device is the rank's own GPU" in said[0]
    plan = spec.plan()
    assert plan["config"][KEY] is None and any(d.startswith(f"{A}.rollout.name=vllm_omni on CUDA ({KEY}=auto)")
                                               for d in plan["decisions"]), plan["decisions"]
    assert "engines: generation verl_omni_replica (float32 on cuda)" in spec.describe()
    assert local_ray_resources(spec)[1] is None and LOGICAL_GPUS_VAR not in worker_env(spec, "generator")
    explicit, _ = _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED, *CUDA, f"{KEY}=true")
    assert explicit.policy.engine.name == "verl_omni_replica"


def test_on_cuda_a_generator_rank_and_its_replica_share_one_gpu(wan_dir):
    """The generator rank's bundle holds one GPU; the rank's worker asks half of it (verl's worker group:
    max_colocate_count 2), the replica's worker the other half (`own_bundle_pool`). The pool asks one GPU per
    generator rank, not two; the trainer pool and a run without replicas are as before."""
    from digenrl_verl.workers.pools import make_ray_pool, pool_needs

    spec, _ = _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED, *CUDA)
    gen = pool_spec(spec, "generator", "g")
    assert gen.hosts_replica and gen.bundle() == {"CPU": 2, "GPU": 1.0} and gen.worker_gpus == 0.5
    assert pool_needs(gen) == {"CPU": 2.0 * gen.world_size, "GPU": 1.0 * gen.world_size}
    assert make_ray_pool(gen).max_colocate_count == 2
    trainer = pool_spec(spec, "trainer", "t")
    assert not trainer.hosts_replica and trainer.worker_gpus == 1.0 and trainer.bundle() == {"CPU": 1, "GPU": 1.0}
    plain, _ = _build(wan_dir, f"{A}.rollout.name=diffusers", *DISAGGREGATED, *CUDA)
    assert pool_spec(plain, "generator", "g").worker_gpus == 1.0


def test_in_process_pipeline_on_cuda_is_refused_naming_the_key(wan_dir):
    with pytest.raises(ValueError, match=rf"{KEY.replace('.', '[.]')}=false with .*trainer[.]device=cuda: .*CPU "
                                         rf"only.*Fix: drop {KEY.replace('.', '[.]')}"):
        _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED, *CUDA, f"{KEY}=false")


def test_a_real_run_without_verl_omni_is_refused_naming_the_key_and_the_fix(wan_dir):
    if importlib.util.find_spec("verl_omni") is not None:
        pytest.skip("verl-omni is installed here: nothing to refuse")
    with pytest.raises(ValueError, match=rf"{A}[.]rollout[.]name=vllm_omni cannot be used here: verl_omni and "
                                         rf"vllm_omni not installed[.] Fix: set {A}[.]rollout[.]name=diffusers"
                                         ".*install verl-omni"):
        _build(wan_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED)


def test_a_value_that_is_not_a_bool_names_the_key(wan_dir):
    """Hydra's typed node refuses it while composing; the section's own check where it is built from a mapping."""
    with pytest.raises(Exception, match=KEY.replace(".", r"\.")):
        _build(wan_dir, f"{KEY}=sometimes")
    with pytest.raises(ValueError, match=rf"{KEY.replace('.', '[.]')}='yes' is invalid: use true, false or null"):
        DigenRLConfig.from_node({"generator_replicas": "yes"})


@pytest.mark.parametrize("device,fix", [("cpu", f"set {KEY}=false"), ("cuda", f"set {A}.rollout.name=diffusers")])
def test_a_model_the_replicas_cannot_serve_is_refused_when_the_run_is_planned(tiny_flux_dir, verl_omni_present,
                                                                             device, fix):
    """FLUX (verl-omni has no rollout pipeline for it) is refused by name while the config is built, before Ray or any
    worker starts, with the fix for the device; the architectures planned are the ones the engine builds requests
    for, verl-omni's (SD3 with per-encoder ids)."""
    from digenrl_verl.engines.spec import REPLICA_ARCHITECTURES, VERL_OMNI_ARCHITECTURES
    from digenrl_verl.integrations.verl_omni_replica import PROMPT_PIPES

    assert sorted(PROMPT_PIPES) == sorted(REPLICA_ARCHITECTURES) == sorted(VERL_OMNI_ARCHITECTURES)
    on = (f"{KEY}=true",) if device == "cpu" else CUDA
    with pytest.raises(ValueError, match=rf"FluxPipeline with {A}[.]rollout[.]name=vllm_omni on "
                                         rf"verl-omni's replicas \({KEY.replace('.', '[.]')}\).*{re.escape(fix)}"):
        _build(tiny_flux_dir, f"{A}.rollout.name=vllm_omni", *DISAGGREGATED, *on)


def test_a_weight_update_to_a_dead_worker_fails_instead_of_waiting_forever(ray_session):
    """`send_weights` streams to each diffusion worker over ZMQ while the server's RPC receives them there; when the
    worker dies (CI: a libzmq abort) the RPC fails and the sender would wait for its reply forever (the replica test
    then waited out 900 s). The wait ends with the RPC's error; with a good RPC the senders are joined."""
    import threading
    import time

    from digenrl_verl.integrations.verl_omni_replica import _join_unless_the_rpc_fails

    @ray_session.remote
    def rpc(fail: bool) -> str:
        time.sleep(0.5)
        if fail:
            raise RuntimeError("EngineCore encountered an issue")
        return "ok"

    stuck = threading.Thread(target=threading.Event().wait, daemon=True)  # a sender waiting for a reply
    stuck.start()
    start = time.monotonic()
    with pytest.raises(ray_session.exceptions.RayTaskError, match="EngineCore"):
        _join_unless_the_rpc_fails([stuck], rpc.remote(True), poll_s=0.1)
    assert time.monotonic() - start < 30 and stuck.is_alive()
    done = threading.Thread(target=time.sleep, args=(1.0,))
    done.start()
    _join_unless_the_rpc_fails([done], rpc.remote(False), poll_s=0.1)
    assert not done.is_alive()
