"""Checkpoint barriers: the driver drains at `checkpoint_every` steps (CHECKPOINT task), audited by check_run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.trace import parse_text
from digenrl_verl.schedule.types import Completion, ScheduleError, TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import Fault, SimExecutor
from digenrl_verl.sim.profiles import CostProfile

CLUSTER = ClusterSpec.parse("gen=2xG,trn=2xT")
PROFILE = CostProfile("ckpt", gen=4.0, score=0.5, update_loop=2.0, update_tsp=1.0, tag_overhead=1.25, opt_step=0.5,
                      sync=1.0, checkpoint=3.0)
# TCSS without the estimate guard: stale generation runs ahead whenever the limits allow (deterministic)
TCSS = TcssConfig(staleness=1, max_stale_fraction=0.5, guard=False)


def _config(**kw) -> ScheduleConfig:
    base = dict(mode="disaggregated", pools=CLUSTER.pools, prompts_per_step=4, n=2, num_steps=4, tag=TagConfig("off"),
                tcss=TCSS)
    return ScheduleConfig(**{**base, **kw})


def _run(cfg: ScheduleConfig, cluster: ClusterSpec = CLUSTER) -> Driver:
    driver = Driver(cfg, SimExecutor(cluster, PROFILE))
    results = driver.run()
    assert [r.step for r in results] == list(range(cfg.start_step, cfg.end_step))
    assert check_run(cfg, driver.trace.completions) == []
    return driver


def _checkpoints(driver: Driver) -> list[Completion]:
    return [c for c in driver.trace.sorted_completions() if c.task.kind == TaskKind.CHECKPOINT]


def test_checkpoint_after_steps_1_and_3_and_nothing_of_the_next_step_runs_ahead():
    driver = _run(_config(checkpoint_every=2))
    ckpts = _checkpoints(driver)
    assert [(c.task.step, c.task.version, c.task.workers) for c in ckpts] == [(1, 2, ("trn:0", "trn:1")),
                                                                          (3, 4, ("trn:0", "trn:1"))]
    assert all(c.ok and c.duration == pytest.approx(3.0) for c in ckpts)
    first = ckpts[0]
    def by_step(s):
        return [c for c in driver.trace.completions if c.task.step == s and c.task.kind != TaskKind.CHECKPOINT]

    assert min(c.start for c in by_step(2) if c.task.kind == TaskKind.GEN) >= first.end
    assert all(c.start >= first.end for c in by_step(2))  # nothing of step 2 runs ahead, stale or not
    assert all(c.end <= first.start for s in (0, 1) for c in by_step(s))  # the state saved is drained
    sync1 = next(c for c in by_step(1) if c.task.kind == TaskKind.SYNC)
    assert first.start == pytest.approx(sync1.end)  # issued as soon as the barrier step's SYNC ended
    # TCSS still runs ahead across the steps without a barrier (0 -> 1, 2 -> 3), never across one (1 -> 2)
    stale = {c.task.step for c in driver.trace.completions if "stale" in c.task.flags}
    assert stale == {1, 3}
    assert driver.trace.sorted_completions()[-1].task.kind == TaskKind.CHECKPOINT  # the run ends after the last one


def test_checkpoint_is_a_trace_event_like_the_others():
    driver = _run(_config(checkpoint_every=2, num_steps=2))
    text = driver.trace.to_text()
    (line,) = [ln for ln in text.splitlines() if " CKPT " in ln]
    assert line.split()[2:] == ["CKPT", "s1", "m-", "v2", "trn:0,trn:1", "ok"]
    assert [p.format() for p in parse_text(text)] == text.splitlines()  # round trip of the text form
    chrome = json.loads(json.dumps(driver.trace.to_chrome()))
    assert {e["tid"] for e in chrome["traceEvents"] if e.get("cat") == "CKPT"}  # one event per trainer rank
    assert sum(e.get("cat") == "CKPT" for e in chrome["traceEvents"]) == 2
    issued = [d for d in driver.trace.decisions if d.action == "issue" and d.detail.startswith("CKPT")]
    assert len(issued) == 1 and "step 2 waits" in issued[0].detail


def test_checkpoint_every_zero_changes_nothing_and_resume_keeps_the_same_steps():
    assert not _checkpoints(_run(_config()))
    # every step: a barrier after each one, so TCSS never runs ahead
    every = _run(_config(checkpoint_every=1))
    assert [c.task.step for c in _checkpoints(every)] == [0, 1, 2, 3]
    assert not any("stale" in c.task.flags for c in every.trace.completions)
    # a run resumed at step 2 checkpoints at the same global steps as the uninterrupted run
    resumed = _run(_config(checkpoint_every=3, start_step=2, num_steps=5))
    assert [c.task.step for c in _checkpoints(resumed)] == [2, 5]


def test_colocated_checkpoint_follows_the_opt_step():
    col = ClusterSpec.parse("col=2xG")
    cfg = ScheduleConfig(mode="colocated", pools=col.pools, prompts_per_step=2, n=2, num_steps=3, checkpoint_every=2)
    driver = _run(cfg, col)
    (ckpt,) = _checkpoints(driver)
    opt = next(c for c in driver.trace.completions if c.task.kind == TaskKind.OPT_STEP and c.task.step == 1)
    assert ckpt.task.step == 1 and ckpt.task.workers == ("col:0", "col:1") and ckpt.start == pytest.approx(opt.end)


def test_invariants_catch_a_task_that_runs_ahead_of_a_checkpoint_or_a_missing_one():
    cfg = _config(checkpoint_every=2)
    driver = _run(cfg)
    completions = list(driver.trace.completions)
    first = _checkpoints(driver)[0]
    # pretend the checkpoint took 100 s longer: every task of step 2 now started before it ended
    late = [dataclasses.replace(c, end=c.end + 100.0) if c is first else c for c in completions]
    errors = check_run(cfg, late)
    assert any("GEN s2" in e and "before the CHECKPOINT of step 1 ended" in e for e in errors)
    assert any("CHECKPOINT of step 1 started (not drained)" in e for e in check_run(
        cfg, [dataclasses.replace(c, start=c.start - 100.0) if c is first else c for c in completions]))
    assert "step 1: 0 successful CHECKPOINTs at its barrier, want 1" in check_run(
        cfg, [c for c in completions if c is not first])
    assert any("CHECKPOINT without a checkpoint barrier" in e
               for e in check_run(dataclasses.replace(cfg, checkpoint_every=0), completions))


def test_a_failed_checkpoint_stops_the_run_with_the_schedule():
    faults = (Fault("fail", TaskKind.CHECKPOINT),)
    driver = Driver(_config(checkpoint_every=2), SimExecutor(CLUSTER, PROFILE, faults=faults))
    with pytest.raises(ScheduleError, match=r"CKPT s1 m- \(id \d+\) failed on workers trn:0, trn:1"):
        driver.run()
