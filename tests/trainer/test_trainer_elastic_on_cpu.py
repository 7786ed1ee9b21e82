"""The elastic generator pool on Ray: a killed generator rejoins within the run; grow 1 -> 2 -> 1 between steps."""

from __future__ import annotations

import json

import pytest
import ray

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.trainer.checkpoint import read_meta
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.elastic import ElasticRayExecutor
from digenrl_verl.trainer.runner import POOLS_FILE, DigenRLTrainer

SMALL = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.optim.lr=3e-3",
         "trainer.digenrl.mode=disaggregated", "trainer.digenrl.tag.policy=off"]
JOIN_WAIT_S = 300.0


def _trained_exactly_once(trainer, samples_per_step, steps):
    counts: dict[tuple[int, int], int] = {}
    for c in trainer.driver.trace.sorted_completions():
        if c.ok and c.task.kind == TaskKind.UPDATE:
            for s in c.task.samples:
                counts[(c.task.step, s)] = counts.get((c.task.step, s), 0) + 1
    assert set(counts) == {(st, s) for st in range(steps) for s in range(samples_per_step)}
    assert set(counts.values()) == {1}


def _gen_samples_by_step(trainer) -> dict[int, dict[str, int]]:
    """step -> generator -> samples it generated (successful GEN tasks)."""
    out: dict[int, dict[str, int]] = {}
    for c in trainer.driver.trace.completions:
        if c.ok and c.task.kind == TaskKind.GEN:
            per = out.setdefault(c.task.step, {})
            for w, samples in c.task.assignment:
                per[w] = per.get(w, 0) + len(samples)
    return out


def _wait_joined(trainer) -> None:
    """Test orchestration at a step end: hold the boundary until the starting generators answered their join, so
    the next step can use them (on this loaded machine a worker start takes longer than a tiny step)."""
    refs = [s.joined for s in trainer.supervisor.starting.values()]
    _, waiting = ray.wait(refs, num_returns=len(refs), timeout=JOIN_WAIT_S)
    assert not waiting, f"{trainer.supervisor.pending()} did not join in {JOIN_WAIT_S}s"


class KillingElastic(ElasticRayExecutor):
    """Kills `target[1]` right after the first GEN of step `target[0]` it runs was submitted."""

    target: tuple[int, str] = (-1, "")
    fired = False

    def submit(self, task):
        super().submit(task)
        step, worker = self.target
        if task.kind == TaskKind.GEN and task.step == step and worker in task.workers and not self.fired:
            self.fired = True
            ray.kill(self.workers[worker], no_restart=True)


def killing_trainer(step: int, worker: str):
    class T(DigenRLTrainer):
        def make_executor(self):
            ex = super().make_executor()
            killing = KillingElastic(self.workers, ex.step_batch, ex.advantage_cfg, ex.rows_per_sample,
                                     on_result=self.on_result, on_checkpoint=self.on_checkpoint,
                                     supervisor=ex.supervisor)
            killing.target = (step, worker)
            return killing

        def at_step_end(self, result):
            super().at_step_end(result)
            if result.step == step:
                _wait_joined(self)
    return T


@pytest.mark.slow
def test_a_killed_generator_rejoins_with_the_trainers_weights_and_the_run_matches_an_uninterrupted_one(
        train_run, uninterrupted_run):
    # each sample drawn alone (rows_alone): the same samples whether one generator, two or a rejoined one draws them,
    # so the session's uninterrupted one-generator run is the reference (same shape, lr, TAG off)
    common = [*SMALL, "trainer.digenrl.pools.generator.workers_per_node=2", "trainer.total_training_steps=4",
              "trainer.save_freq=-1", "trainer.digenrl.rows_alone=true"]
    t = train_run(*common, trainer_cls=killing_trainer(1, "gen:0"), name="rejoin")
    trace = t.driver.trace
    actions = [d.action for d in trace.decisions]
    assert actions.index("dead") < actions.index("rejoin") < actions.index("joined")
    joined = next(d for d in trace.decisions if d.action == "joined")
    assert "gen:0" in joined.detail
    # the new gen:0 got the current weights (a SYNC naming it after the rejoin) and generated again
    first_sync = min((c for c in trace.completions if c.ok and c.task.kind == TaskKind.SYNC
                      and "gen:0" in c.task.workers and c.start >= next(d.time for d in trace.decisions
                                                                         if d.action == "rejoin")),
                     key=lambda c: c.start)
    assert first_sync.end <= joined.time + 1e-6
    by_step = _gen_samples_by_step(t)
    assert by_step[0] == {"gen:0": 4, "gen:1": 4} and by_step[3] == {"gen:0": 4, "gen:1": 4}
    _trained_exactly_once(t, 8, 4)
    assert t.supervisor.restarts == {"gen:0": 1} and not t.supervisor.dropped
    trn = ray.get(t.workers["trn:0"].checksum.remote())
    for g in ("gen:0", "gen:1"):
        got = ray.get(t.workers[g].checksum.remote())
        assert (got["checksum"], got["version"]) == (trn["checksum"], trn["version"]) == (got["checksum"], 4)
    assert t.reporter.history[-1][M["workers_generators"]] == 2
    # the Perfetto trace: the decisions on the driver's lane, gen:0's lane with the gap and its tasks after it
    chrome = json.loads((t.output_dir / "trace.json").read_text())["traceEvents"]
    instants = {e["name"]: e["ts"] for e in chrome if e.get("ph") == "i"}
    tid = next(e["tid"] for e in chrome if e.get("ph") == "M" and e["args"].get("name") == "gen:0")
    lane = sorted((e["ts"], e["name"], e["args"]["ok"]) for e in chrome if e.get("ph") == "X" and e["tid"] == tid)
    failed_at = next(ts for ts, _, ok in lane if not ok)
    assert failed_at <= instants["dead"] < instants["rejoin"] < instants["joined"]
    assert any(ts > instants["joined"] and name.startswith("GEN") and ok for ts, name, ok in lane)
    assert not any(instants["dead"] < ts < instants["rejoin"] for ts, _, _ in lane)  # the gap

    want = uninterrupted_run.state
    got = ray.get(t.workers["trn:0"].trainable_state.remote())
    worst = max(float((got[k] - want[k]).abs().max() / want[k].abs().max().clamp_min(1e-12)) for k in want)
    assert worst <= 1e-5, worst


class Resizing(DigenRLTrainer):
    """Writes the control file at step ends: 2 generators after step 0, back to 1 after step 2."""

    def at_step_end(self, result):
        asks = {0: 2, 2: 1}
        if result.step in asks:
            (self.output_dir / POOLS_FILE).write_text(json.dumps({"generator": asks[result.step]}))
        super().at_step_end(result)
        if result.step == 0:
            _wait_joined(self)


@pytest.mark.slow
def test_grow_one_to_two_generators_between_steps_and_shrink_back(train_run):
    t = train_run(*SMALL, "trainer.total_training_steps=5", "trainer.save_freq=-1", trainer_cls=Resizing,
                  name="resize")
    by_step = _gen_samples_by_step(t)
    assert by_step[0] == {"gen:0": 8}
    assert by_step[2] == {"gen:0": 4, "gen:1": 4}  # one lane of two ranks: each takes half of every group
    assert by_step[3] == by_step[4] == {"gen:0": 8}
    _trained_exactly_once(t, 8, 5)
    actions = {d.action for d in t.driver.trace.decisions}
    assert {"resize", "grow", "joined", "shrink"} <= actions
    assert [h[M["workers_generators"]] for h in t.reporter.history][0] == 1
    assert "gen:1" in t.driver.removed and "gen:1" not in t.workers  # its actor was stopped
    trn = ray.get(t.workers["trn:0"].checksum.remote())
    assert ray.get(t.workers["gen:0"].checksum.remote())["checksum"] == trn["checksum"]
    spans = {r.step: r.end - r.start for r in t.results}
    print("step spans (s):", {s: round(v, 3) for s, v in spans.items()}, "generators:",
          [h[M["workers_generators"]] for h in t.reporter.history])


@pytest.mark.slow
def test_resume_with_a_different_generator_count_reaches_the_same_weights(uninterrupted_run, tiny_flux_dir, tmp_path,
                                                                         capfd):
    common = list(uninterrupted_run.overrides)  # one generator, 4 steps, a checkpoint every 2 (run once per session)
    want = uninterrupted_run.state
    ckpt = uninterrupted_run.checkpoints / "global_step_2"
    assert read_meta(ckpt)["generators"] == 1
    overrides = [TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                 f"trainer.digenrl.output_dir={tmp_path / 'two'}",
                 f"trainer.default_local_dir={tmp_path / 'ckpt2'}", "trainer.logger=[console]", *common,
                 "trainer.digenrl.pools.generator.workers_per_node=2"]
    resumed = DigenRLTrainer(build_run(compose(overrides), start_step=2))
    try:
        resumed.fit(resume_from=ckpt)
        got = ray.get(resumed.workers["trn:0"].trainable_state.remote())
        assert [r.step for r in resumed.results] == [2, 3]
        assert all(set(r.gen_tasks) == {"gen:0", "gen:1"} for r in resumed.results)
        assert "resuming with 2 generator(s), the checkpoint was written with 1" in capfd.readouterr().err
    finally:
        resumed.shutdown()
    worst = max(float((got[k] - want[k]).abs().max() / want[k].abs().max().clamp_min(1e-12)) for k in want)
    assert worst <= 1e-5, worst
