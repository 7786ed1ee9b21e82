"""Reliability of the Ray runs: dead generator, trainer failure + resume, checkpoints, NaN, timeouts, signals."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import ray
import torch
from ray._private import worker as ray_worker

from digenrl_verl import main as entry
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.schedule.types import ScheduleError, TaskKind
from digenrl_verl.trainer.checkpoint import latest_checkpoint, read_meta
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.ray_executor import RayExecutor
from digenrl_verl.trainer.runner import INTERRUPT_SAVE_TIMEOUT_S, DigenRLTrainer, NonFiniteError
from digenrl_verl.weights.sync import CollectiveSpec, Collectives, free_port

SMALL = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.optim.lr=3e-3"]
DISAGG = ["trainer.digenrl.mode=disaggregated"]


class KillOnSubmit(RayExecutor):
    """Kills a worker right after the first task of `kind` at `step` that it runs has been submitted."""

    target: tuple[TaskKind, int, str]

    def submit(self, task):
        super().submit(task)
        kind, step, worker = self.target
        if task.kind == kind and task.step == step and worker in task.workers and not getattr(self, "fired", False):
            self.fired = True
            ray.kill(self.workers[worker], no_restart=True)


def killing_trainer(kind, step, worker):
    class T(DigenRLTrainer):
        def make_executor(self):
            ex = KillOnSubmit(self.workers, self.step_batch, self.run.advantage,
                              self.run.policy.rollout.num_train_steps, on_result=self.on_result,
                              on_checkpoint=self.on_checkpoint)
            ex.target = (kind, step, worker)
            return ex
    return T


def _trained_exactly_once(trainer, samples_per_step):
    counts: dict[tuple[int, int], int] = {}
    for c in trainer.driver.trace.sorted_completions():
        if c.ok and c.task.kind == TaskKind.UPDATE:
            for s in c.task.samples:
                counts[(c.task.step, s)] = counts.get((c.task.step, s), 0) + 1
    steps = {c.task.step for c in trainer.driver.trace.sorted_completions()}
    assert set(counts) == {(st, s) for st in steps for s in range(samples_per_step)}
    assert set(counts.values()) == {1}


@pytest.mark.slow
def test_generator_killed_mid_step_is_replaced_and_every_sample_trains_once(train_run):
    t = train_run(*SMALL, *DISAGG, "trainer.digenrl.pools.generator.workers_per_node=2",
                  "trainer.digenrl.tag.policy=off",
                  "trainer.total_training_steps=3", "trainer.save_freq=2",
                  trainer_cls=killing_trainer(TaskKind.GEN, 1, "gen:0"), name="dead_gen")
    completions = t.driver.trace.sorted_completions()
    failed = [c for c in completions if not c.ok]
    assert failed and failed[0].task.kind == TaskKind.GEN and "gen:0" in failed[0].info["dead_workers"]
    assert any(d.action == "dead" for d in t.driver.trace.decisions)
    _trained_exactly_once(t, 8)
    # gen:1 carried on: it generated after the failure and still received every weight sync
    after = [c for c in completions if c.start >= failed[0].end and c.task.kind == TaskKind.GEN]
    assert after and all("gen:0" not in c.task.workers for c in after)
    assert t.reporter.history[-1][M["workers_dead"]] == 1  # also after the checkpoint barrier
    ids = [c.task.task_id for c in completions]
    assert len(ids) == len(set(ids))
    # save_freq=2: the schedule drained and checkpointed after step 1 (version 2) on the trainer, once
    (ckpt,) = [c for c in completions if c.task.kind == TaskKind.CHECKPOINT]
    assert ckpt.ok and (ckpt.task.step, ckpt.task.version, ckpt.task.workers) == (1, 2, ("trn:0",))
    assert all(c.start >= ckpt.end for c in completions if c.task.step >= 2)
    assert Path(ckpt.info["path"]).name == "global_step_2" and read_meta(ckpt.info["path"])["global_step"] == 2
    assert read_meta(latest_checkpoint(t.run.checkpoint.root))["global_step"] == 3  # the last step, too
    trn = ray.get(t.workers["trn:0"].checksum.remote())
    assert ray.get(t.workers["gen:1"].checksum.remote())["checksum"] == trn["checksum"]


@pytest.mark.slow
def test_trainer_failure_is_reported_and_resume_reaches_the_uninterrupted_weights(uninterrupted_run, tiny_flux_dir,
                                                                                    tmp_path):
    # tag=off: with one generator lane the schedule's order is fixed, so both runs do the same arithmetic
    common = list(uninterrupted_run.overrides)  # 4 steps, a checkpoint every 2; the uninterrupted run once per session
    want = uninterrupted_run.state

    ckpt_root = tmp_path / "ckpt"
    overrides = [TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                 f"trainer.digenrl.output_dir={tmp_path / 'broken'}",
                 f"trainer.default_local_dir={ckpt_root}", *common]
    broken = killing_trainer(TaskKind.UPDATE, 3, "trn:0")(build_run(compose(overrides)))
    with pytest.raises(ScheduleError, match="trn:0"):
        broken.fit()
    broken.shutdown()
    ckpt = latest_checkpoint(ckpt_root)
    assert ckpt is not None and read_meta(ckpt)["global_step"] == 2
    assert read_meta(ckpt)["tcss"]["queued_microbatches"] == []
    # one driver for the whole run: the barrier's CHECKPOINT, then step 2, in one trace
    kinds = [(c.task.kind, c.task.step) for c in broken.driver.trace.sorted_completions()]
    assert kinds.index((TaskKind.CHECKPOINT, 1)) < min(i for i, (_, s) in enumerate(kinds) if s == 2)

    resumed = DigenRLTrainer(build_run(compose(overrides), start_step=2))
    try:
        resumed.fit(resume_from=ckpt)
        got = ray.get(resumed.workers["trn:0"].trainable_state.remote())
        assert [r.step for r in resumed.results] == [2, 3]
    finally:
        resumed.shutdown()
    worst = max(float((got[k] - want[k]).abs().max() / want[k].abs().max().clamp_min(1e-12)) for k in want)
    assert worst <= 1e-5, worst


def _reward_file(tmp_path, body):
    path = tmp_path / "nan_reward.py"
    path.write_text("import math\n\ndef compute_score(data_source, solution_image, ground_truth, extra_info):\n"
                    f"    {body}\n")
    return path


@pytest.mark.slow
def test_nan_rewards_are_dropped_counted_and_weights_stay_finite(train_run, tmp_path):
    # every fourth sample of a group (index 0 has uid p<k>; extra_info carries the uid) scores NaN
    path = _reward_file(tmp_path, "return float('nan') if solution_image.float().mean() > -1 and "
                                  "extra_info['uid'].endswith(('0', '2')) "
                                  "else solution_image.float().mean().item() / 255")
    t = train_run(*SMALL, *DISAGG, "trainer.total_training_steps=2", "reward.reward_functions={}",
                  f"reward.custom_reward_function.path={path}", "trainer.digenrl.max_nonfinite_steps=5", name="nan")
    assert all(h[M["reward_nonfinite"]] > 0 for h in t.reporter.history)
    state = ray.get(t.workers["trn:0"].trainable_state.remote())
    assert all(torch.isfinite(v).all() for v in state.values())


@pytest.mark.slow
def test_a_run_of_nonfinite_steps_stops_with_a_clear_message(train_run, tmp_path):
    path = _reward_file(tmp_path, "return math.inf")
    with pytest.raises(NonFiniteError, match="max_nonfinite_steps=2"):
        train_run(*SMALL, *DISAGG, "trainer.total_training_steps=4", "reward.reward_functions={}",
                  f"reward.custom_reward_function.path={path}", "trainer.digenrl.max_nonfinite_steps=2", name="inf")


@pytest.mark.slow
def test_a_task_over_its_timeout_names_the_worker_and_prints_the_schedule(train_run):
    with pytest.raises(ScheduleError) as err:
        train_run(*SMALL, *DISAGG, "trainer.total_training_steps=1", "trainer.digenrl.task_timeout_s=0.001",
                  name="timeout")
    text = str(err.value)
    assert "ERROR HERE" in text and ("gen:0" in text or "trn:0" in text)


@pytest.mark.slow  # starts the session's Ray instance
def test_local_ray_and_the_trainer_world_listen_on_loopback_without_a_dashboard(ray_session):
    class _TrainerRankZero:  # defined here: Ray ships it by value (the tests package is not importable there)
        """Joins a trainer world as rank 0 in a worker process, as a trainer worker does: it serves the rendezvous
        store and opens gloo's listening socket."""

        def __init__(self, spec: CollectiveSpec) -> None:
            self.collectives = Collectives(spec, "trainer", 0)

        def pid(self) -> int:
            return os.getpid()

    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    assert not ray_worker._global_node.address_info.get("webui_url")
    spec = CollectiveSpec("127.0.0.1", free_port(), 1, 0, timeout_s=60.0)
    rank0 = ray.remote(num_cpus=0)(_TrainerRankZero).remote(spec)
    try:
        pid = ray.get(rank0.pid.remote(), timeout=120)
        # every socket this process's children listen on (Ray's GCS, raylet, agents and workers, the trainer's store
        # and gloo) is on loopback, and nothing serves the dashboard's HTTP port (Ray keeps a head process with its
        # frontend disabled); torch's store and gloo would listen on every interface / the host name's address
        listening = {pid: _listening(psutil.Process(pid))}
        for proc in psutil.Process().children(recursive=True):
            listening[proc.pid] = _listening(proc)
    finally:
        ray.kill(rank0)
    assert len(listening[pid]) >= 2, listening[pid]  # the store and gloo's pair listener
    exposed = {p: socks for p, socks in listening.items() if not all(_loopback(ip) for ip, _ in socks)}
    assert not exposed, exposed
    assert 8265 not in {port for socks in listening.values() for _, port in socks}, listening


def _listening(proc: psutil.Process) -> set[tuple[str, int]]:
    try:
        return {(c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback  # '::ffff:127.0.0.1' is loopback too


def test_a_second_signal_during_the_shutdown_is_ignored():
    """The first SIGINT/SIGTERM raises (the run checkpoints and flushes); a second one while that runs is swallowed
    instead of breaking the checkpoint."""
    entry._received.clear()
    try:
        with pytest.raises(KeyboardInterrupt):
            entry._raise_interrupt(signal.SIGTERM, None)
        entry._raise_interrupt(signal.SIGINT, None)  # returns: no second exception
        assert entry._received == [signal.SIGTERM]
    finally:
        entry._received.clear()


def test_the_checkpoint_on_interrupt_is_bounded_in_time(tiny_flux_dir, monkeypatch):
    """An interrupt mid-run saves the last state with a time bound (a hung collective cannot block the exit), then
    flushes the outputs and re-raises; a failed save is reported, not raised over the interrupt."""
    run = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", *SMALL, *DISAGG]))
    trainer = DigenRLTrainer(run)
    saves, finished = [], []

    def interrupted():
        trainer.driver = object()  # a run in progress
        raise KeyboardInterrupt

    def save(step, timeout_s=None):
        saves.append((step, timeout_s))
        raise TimeoutError("the trainer did not answer")

    for name, fn in {"start_ray": lambda: None, "build_workers": lambda: None, "make_executor": lambda: _Clock(),
                     "train": interrupted, "save_checkpoint": save, "finish": lambda: finished.append(1)}.items():
        monkeypatch.setattr(trainer, name, fn)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert saves == [(None, INTERRUPT_SAVE_TIMEOUT_S)] and finished == [1] and trainer.interrupted


class _Clock:
    def now(self) -> float:
        return 0.0


def test_no_unsafe_deserialisation_in_the_package():
    root = Path(__file__).resolve().parents[2] / "digenrl_verl"
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "pickle.load" not in text, path
        for line in text.splitlines():
            if "torch.load(" in line:
                assert "weights_only=True" in line, (path, line)


@pytest.mark.slow
def test_sigterm_flushes_outputs_checkpoints_and_exits_interrupted(tiny_flux_dir, tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "digenrl_verl.main", TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
           f"trainer.digenrl.output_dir={out}", f"trainer.default_local_dir={ckpt}", *SMALL, *DISAGG,
           "trainer.total_training_steps=400", "trainer.logger=[console]"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "interrupted by SIGTERM" in err
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert "summary" in lines[-1]
    assert json.loads((out / "trace.json").read_text())
    saved = latest_checkpoint(ckpt)
    assert saved is not None and read_meta(saved)["global_step"] >= 2
