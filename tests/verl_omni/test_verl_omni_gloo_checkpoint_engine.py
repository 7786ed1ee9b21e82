"""verl's checkpoint engine over gloo on CPU (`digenrl_verl.weights.gloo_checkpoint_engine`), issue 29 item 3.

- a config selects it the way a user's would: verl-omni's composed ``diffusion_trainer`` with
  ``actor_rollout_ref.rollout.checkpoint_engine.backend=gloo`` and ``...custom_backend_module=`` the module; verl's
  own `CheckpointEngineManager` / `import_external_libs` / `CheckpointEngineRegistry` then find the class;
- three Ray actors drive the engine's API in the order verl's manager calls it (prepare, build_topology,
  init_process_group, send_weights / receive_weights, finalize) with buckets small enough to split tensors: every
  received tensor equals the sent one bit for bit, the version arrives; a sender that drops a bucket's entries is
  caught;
- the real path: verl-omni's `OmniCheckpointEngineManager.update_weights` from trainers on verl-omni's
  `ActorRolloutRefWorker` methods (its update_weights / execute_checkpoint_engine / get_lora_peft_config) to verl's
  `CheckpointEngineWorker`s of two standalone replicas (2 + 1 workers), twice: each worker's server adapter gets the
  tiny SD3 transformer's weights bit for bit, then the stepped ones and not the old, with the version.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

import ray  # noqa: E402
import torch  # noqa: E402
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

from digenrl_verl.platform import process_env  # noqa: E402
from digenrl_verl.weights import gloo_checkpoint_engine as gce  # noqa: E402
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from _gloo_ce_workers import WORKER_DIR, Recorder, RolloutWorker, Trainer, trainer_weights  # noqa: E402

CE = "actor_rollout_ref.rollout.checkpoint_engine"
#: what a user's command line adds to select the backend (rollout.name=vllm_omni: what every verl-omni script sets)
USER_OVERRIDES = ("actor_rollout_ref.rollout.name=vllm_omni", f"{CE}.backend=gloo",
                  f"{CE}.custom_backend_module=digenrl_verl.weights.gloo_checkpoint_engine",
                  f"{CE}.update_weights_bucket_megabytes=1")


def compose_rollout(overrides=USER_OVERRIDES):
    """verl-omni's ``diffusion_trainer`` composed as its entry point composes it, plus `overrides`; the rollout
    section as verl's dataclass (verl-omni's DiffusionRolloutConfig)."""
    import importlib.util

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = importlib.util.find_spec("verl_omni").submodule_search_locations[0] + "/trainer/config"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose(config_name="diffusion_trainer", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)


@pytest.fixture(scope="module")
def rollout_config():
    return compose_rollout()


@pytest.fixture(scope="module")
def sd3_weights_file(tmp_path_factory) -> str:
    from digenrl_verl.models.tiny import build_tiny_model_dir

    path = build_tiny_model_dir("StableDiffusion3Pipeline", tmp_path_factory.mktemp("gloo_ce") / "sd3", seed=0)
    return str(path / "transformer" / "diffusion_pytorch_model.safetensors")


def assert_bit_equal(received: dict[str, torch.Tensor], sent: dict[str, torch.Tensor]) -> None:
    assert sorted(received) == sorted(sent), f"names differ: missing {sorted(set(sent) - set(received))[:5]}"
    for name, w in sent.items():
        r = received[name]
        assert (r.dtype, r.shape) == (w.dtype, w.shape), name
        assert torch.equal(r.contiguous().view(-1).view(torch.uint8), w.contiguous().view(-1).view(torch.uint8)), name


# ---- (c) selected through verl's config hook ------------------------------------------------------------------------

def test_config_selects_gloo_through_custom_backend_module(rollout_config):
    """In a fresh interpreter: 'gloo' is not in verl's registry until verl's own calls import the module that the
    user's config names; then verl's manager and verl's registry give the package's class."""
    ce = rollout_config.checkpoint_engine
    assert (ce.backend, ce.custom_backend_module) == ("gloo", "digenrl_verl.weights.gloo_checkpoint_engine")
    probe = textwrap.dedent(f"""
        from verl.checkpoint_engine import CheckpointEngineManager, CheckpointEngineRegistry
        from verl.workers.config import CheckpointEngineConfig
        assert "gloo" not in CheckpointEngineRegistry._registry
        cfg = CheckpointEngineConfig(backend={ce.backend!r}, custom_backend_module={ce.custom_backend_module!r},
                                     update_weights_bucket_megabytes={ce.update_weights_bucket_megabytes})
        manager = CheckpointEngineManager(cfg, actor_wg=None, replicas=[])  # imports custom_backend_module
        engine = CheckpointEngineRegistry.new(cfg.backend, bucket_size=cfg.update_weights_bucket_megabytes << 20,
                                              is_master=True, **cfg.engine_kwargs.get(cfg.backend, {{}}))
        print(manager.backend_cls.__module__, manager.backend_cls.__qualname__, type(engine).__name__,
              engine.bucket_size)
    """)
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-4:] == ["digenrl_verl.weights.gloo_checkpoint_engine", "GlooCheckpointEngine",
                                       "GlooCheckpointEngine", str(1 << 20)]


def test_refusals_name_the_key():
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes"):
        gce.GlooCheckpointEngine(bucket_size=0)
    engine = gce.GlooCheckpointEngine(bucket_size=4096)
    header = {"index": 0, "bucket_size": 4096, "global_steps": 3}
    engine._check_header(header, 0, 3)
    engine._check_header(header, 0, None)
    engine._check_header(dict(header, global_steps=None), 0, 5)  # an untagged update takes the manager's version
    with pytest.raises(ValueError, match="global_steps=4, the trainer sent global_steps=3"):
        engine._check_header(header, 0, 4)
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes"):
        engine._check_header(dict(header, bucket_size=8192), 0, 3)
    with pytest.raises(RuntimeError, match="bucket 1 arrived where bucket 0 was due"):
        engine._check_header(dict(header, index=1), 0, 3)
    with pytest.raises(RuntimeError, match="before init_process_group"):
        engine._require_group("send_weights")


# ---- (a, b) three processes through the engine's API, in verl's manager's order -------------------------------------

@ray.remote(num_cpus=0)
class EngineHost:
    """One engine in its own process; `drop_bucket`: the mutation, the sender leaves bucket 1's entries out of its
    header (its bytes still go)."""

    def __init__(self, bucket_size: int, is_master: bool, drop_bucket: bool = False):
        torch.set_num_threads(1)
        self.engine = gce.GlooCheckpointEngine(bucket_size=bucket_size, is_master=is_master, timeout_s=120)
        if drop_bucket:
            send = self.engine._send_bucket

            async def dropping(index, metas, nbytes, global_steps, last):
                await send(index, [] if index == 1 else metas, nbytes, global_steps, last)

            self.engine._send_bucket = dropping

    def call(self, method, *args, **kwargs):
        return getattr(self.engine, method)(*args, **kwargs)

    async def send(self, weights, global_steps):
        await self.engine.send_weights(iter(weights.items()), global_steps=global_steps)

    async def receive(self, global_steps):
        return {name: w.clone() async for name, w in self.engine.receive_weights(global_steps=global_steps)}


def _one_update(sender, receivers, weights, global_steps, receive_steps=None):
    """verl's `CheckpointEngineManager.build_process_group` + update_weights + finalize, for one sender."""
    hosts = [sender, *receivers]
    metadata = ray.get([h.call.remote("prepare") for h in hosts])
    actor_kwargs, rollout_kwargs = gce.GlooCheckpointEngine.build_topology(1, len(receivers), metadata)
    kwargs = [{k: v[0] for k, v in actor_kwargs.items()}] + [{k: v[i] for k, v in rollout_kwargs.items()}
                                                             for i in range(len(receivers))]
    ray.get([h.call.remote("init_process_group", **kw) for h, kw in zip(hosts, kwargs)])
    try:
        futures = [sender.send.remote(weights, global_steps)] + [r.receive.remote(receive_steps) for r in receivers]
        return ray.get(futures)[1:]
    finally:
        ray.get([h.call.remote("finalize") for h in hosts])


@pytest.mark.slow  # Ray actors
def test_three_processes_bit_exact_and_versioned(ray_session, sd3_weights_file):
    bucket = 64 << 10  # 64 KiB: the bf16 tensor (1.4 MB) spans ~22 buckets
    sender = EngineHost.remote(bucket, True)
    receivers = [EngineHost.remote(bucket, False) for _ in range(2)]
    try:
        for step in (1, 2):
            weights = trainer_weights(sd3_weights_file, step=step - 1)
            for received in _one_update(sender, receivers, weights, global_steps=step, receive_steps=step):
                assert_bit_equal(received, weights)
            assert ray.get([r.call.remote("received_version") for r in receivers]) == [step, step]
            sent, got = ray.get(sender.call.remote("last_transfer")), ray.get(receivers[0].call.remote("last_transfer"))
            assert sent["buckets"] == got["buckets"] > 20 and sent["bytes"] == got["bytes"]
            assert got["version_from"] == "trainer"
        # a sender with no version: the receiver records the one it was asked for, and says where it came from
        _one_update(sender, receivers, weights, global_steps=None, receive_steps=7)
        assert ray.get(receivers[1].call.remote("last_transfer"))["version_from"] == "manager"
        assert ray.get(receivers[1].call.remote("received_version")) == 7
    finally:
        for h in (sender, *receivers):
            ray.kill(h)


@pytest.mark.slow  # Ray actors
def test_a_dropped_bucket_fails(ray_session, sd3_weights_file):
    """Mutation (b): the sender drops bucket 1's entries; the receivers refuse the update (chunk count) and keep the
    old version, and the bit-for-bit comparison would have failed too."""
    bucket = 64 << 10
    sender = EngineHost.remote(bucket, True, drop_bucket=True)
    receivers = [EngineHost.remote(bucket, False) for _ in range(2)]
    try:
        weights = trainer_weights(sd3_weights_file)
        with pytest.raises(ray.exceptions.RayTaskError, match="received .* chunks .* the trainer sent"):
            _one_update(sender, receivers, weights, global_steps=1, receive_steps=1)
        assert ray.get([r.call.remote("received_version") for r in receivers]) == [None, None]
        dropped = {k: v for k, v in list(weights.items())[1:]}
        with pytest.raises(AssertionError, match="names differ"):
            assert_bit_equal(dropped, weights)
    finally:
        for h in (sender, *receivers):
            ray.kill(h)


# ---- the real path: verl-omni's manager, verl-omni's trainer-worker methods, verl's CheckpointEngineWorker ----------

class _Replica:
    """A standalone replica as verl's manager uses it: its CheckpointEngineWorker handles and the calls around a
    sync (no server: abort / kv-cache calls are counted)."""

    server_handle = None

    def __init__(self, wg):
        self.wg, self.workers, self.calls = wg, wg.workers, []

    async def abort_all_requests(self):
        self.calls.append("abort")

    async def release_kv_cache(self):
        self.calls.append("release_kv_cache")

    async def resume_kv_cache(self):
        self.calls.append("resume_kv_cache")

    async def resume_generation(self):
        self.calls.append("resume")


def _worker_env() -> dict[str, str]:
    """verl's CPU platform (`process_env`) and the helper module's folder on the workers' PYTHONPATH."""
    path = os.pathsep.join(p for p in (WORKER_DIR, os.environ.get("PYTHONPATH", "")) if p)
    return dict(process_env(cpu=True), PYTHONPATH=path)


def _group(n, cls, name, **init):
    pool = RayResourcePool([n], use_gpu=False, max_colocate_count=1, name_prefix=f"{name}_pool")
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(cls), **init),
                        name_prefix=name, device_name="cpu", worker_env=_worker_env())
    return pool, wg


@pytest.mark.slow  # Ray worker groups
def test_verl_omni_manager_updates_standalone_workers(ray_session, rollout_config, sd3_weights_file):
    from ray.util.placement_group import remove_placement_group
    from verl_omni.workers.checkpoint_engine import OmniCheckpointEngineManager

    class Manager(gce.VersionedUpdates, OmniCheckpointEngineManager):
        pass

    groups = [_group(2, Trainer, "gce_trainer", rollout_config=rollout_config, weights_file=sd3_weights_file)]
    for i, n in enumerate((2, 1)):
        groups.append(_group(n, RolloutWorker, f"gce_replica{i}", rollout_config=rollout_config, model_config=None,
                             server_adapter=Recorder()))
    trainer_wg, replicas = groups[0][1], [_Replica(wg) for _, wg in groups[1:]]
    try:
        manager = Manager(rollout_config.checkpoint_engine, trainer_wg, replicas)
        assert manager.backend_cls is gce.GlooCheckpointEngine
        for version in (1, 2):
            trainer_wg.step(version - 1)
            manager.update_weights(global_steps=version)
            sent = trainer_weights(sd3_weights_file, step=version - 1)
            for replica in replicas:
                assert replica.calls[-4:] == ["abort", "release_kv_cache", "resume_kv_cache", "resume"]
                for steps, updates, received in replica.wg.recorded():
                    assert (steps, updates) == (version, version)
                    assert_bit_equal(received, sent)
                assert ray.get(replica.wg.execute_checkpoint_engine(["received_version"] * replica.wg.world_size)) \
                    == [version] * replica.wg.world_size
                froms = ray.get(replica.wg.execute_checkpoint_engine(["last_transfer"] * replica.wg.world_size))
                assert [t["version_from"] for t in froms] == ["trainer"] * replica.wg.world_size
            if version == 2:  # the new weights, not the old
                old = trainer_weights(sd3_weights_file, step=0)
                assert not torch.equal(received["extra.big_bf16"], old["extra.big_bf16"])
    finally:
        for pool, wg in groups:
            for worker in wg.workers:
                ray.kill(worker)
            for pg in pool.pgs or []:
                remove_placement_group(pg)
