"""Driver behaviour: failures and re-issue, timeouts, colocated plan, step-by-step use and resume."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig, TspConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.types import ScheduleError, TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import Fault, SimExecutor
from digenrl_verl.sim.profiles import CostProfile

CLUSTER = ClusterSpec.parse("gen=4xG,trn=2xT")


def profile() -> CostProfile:
    return CostProfile("test", gen=4.0, score=0.5, update_loop=2.0, update_tsp=1.0, tag_overhead=1.2, opt_step=0.5,
                       sync=1.0)


def _cfg(**kw) -> ScheduleConfig:
    base = dict(mode="disaggregated", pools=CLUSTER.pools, prompts_per_step=6, n=4, num_steps=3)
    base.update(kw)
    return ScheduleConfig(**base)


def _updated_once(driver: Driver, cfg: ScheduleConfig) -> None:
    for step in range(cfg.start_step, cfg.end_step):
        samples = sorted(s for c in driver.trace.completions if c.ok and c.task.kind == TaskKind.UPDATE
                         and c.task.step == step for s in c.task.samples)
        assert samples == list(range(cfg.samples_per_step))


@settings(max_examples=80, deadline=None)
@given(kind=st.sampled_from([TaskKind.GEN, TaskKind.SCORE, TaskKind.TAG_GEN]), step=st.integers(0, 2),
       worker=st.sampled_from(["gen:0", "gen:3"]), action=st.sampled_from(["fail", "lose", "kill"]),
       occurrence=st.integers(1, 3), staleness=st.sampled_from([0, 1]), gap=st.booleans())
def test_failures_are_reissued_and_every_sample_is_trained_once(kind, step, worker, action, occurrence,
                                                                 staleness, gap):
    cfg = _cfg(tcss=TcssConfig(staleness=staleness, max_stale_fraction=0.5 if staleness else 0.0), gap=gap)
    fault = Fault(action, kind, step=step, worker=worker if action == "kill" or kind != TaskKind.TAG_GEN else None,
                  occurrence=occurrence)
    executor = SimExecutor(CLUSTER, profile(), faults=(fault,))
    driver = Driver(cfg, executor)
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    _updated_once(driver, cfg)
    failed = [c for c in driver.trace.completions if not c.ok]
    if action == "kill" and failed:
        assert worker in driver.dead and all(worker not in lane for lane in driver.lanes)
        retries = [d for d in driver.trace.decisions if d.action == "retry"]
        assert retries or failed[0].task.kind == TaskKind.SYNC


def test_all_generators_dead_trainer_generates_and_scores():
    cfg = _cfg(tag=TagConfig(policy="off"), num_steps=2)
    faults = tuple(Fault("kill", worker=f"gen:{i}", at=3.0) for i in range(4))
    executor = SimExecutor(CLUSTER, profile(), faults=faults)
    driver = Driver(cfg, executor)
    results = driver.run()
    assert len(results) == 2 and not driver.lanes
    assert check_run(cfg, driver.trace.completions) == []
    late = [c for c in driver.trace.completions if c.start > 3.0 and c.task.kind in (TaskKind.TAG_GEN, TaskKind.SCORE)]
    assert late and all(set(c.task.workers) <= {"trn:0", "trn:1"} for c in late)
    _updated_once(driver, cfg)


def test_trainer_death_is_fatal_and_prints_the_schedule():
    executor = SimExecutor(CLUSTER, profile(), faults=(Fault("kill", TaskKind.UPDATE, step=1, worker="trn:1"),))
    with pytest.raises(ScheduleError) as err:
        Driver(_cfg(), executor).run()
    text = str(err.value)
    assert "trn:1" in text and "UPDATE s1" in text and "<-- ERROR HERE" in text


def test_timeout_names_worker_and_task_with_schedule_around_it():
    cfg = _cfg(task_timeout_s=30.0)
    executor = SimExecutor(CLUSTER, profile(), faults=(Fault("hang", TaskKind.GEN, step=1, occurrence=2),))
    with pytest.raises(ScheduleError) as err:
        Driver(cfg, executor).run()
    text = str(err.value)
    lines = text.splitlines()
    marked = [ln for ln in lines if "<-- ERROR HERE" in ln]
    assert len(marked) == 1 and "GEN s1" in marked[0] and "running" in marked[0]
    assert "task_timeout_s=30.0" in lines[0] and "gen:" in lines[0]
    assert any(" s0 " in ln for ln in lines[1:])  # the steps around the failing one are printed


def test_colocated_plan_generates_scores_then_updates():
    cluster = ClusterSpec.parse("col=4xG")
    cfg = ScheduleConfig(mode="colocated", pools=cluster.pools, prompts_per_step=6, n=4, num_steps=2,
                         gap=False, tsp=TspConfig(enabled=False))
    driver = Driver(cfg, SimExecutor(cluster, profile()))
    results = driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    kinds = {c.task.kind for c in driver.trace.completions}
    assert TaskKind.SYNC not in kinds and TaskKind.TAG_GEN not in kinds
    for step in (0, 1):
        cs = [c for c in driver.trace.completions if c.task.step == step]
        last_score = max(c.end for c in cs if c.task.kind == TaskKind.SCORE)
        first_update = min(c.start for c in cs if c.task.kind == TaskKind.UPDATE)
        assert last_score <= first_update  # full-batch barrier
        assert all(set(c.task.workers) == {f"col:{i}" for i in range(4)} for c in cs if c.task.kind == TaskKind.UPDATE)
    assert [r.version for r in results] == [0, 1]


def _colocated_run(ranks: int, prompts: int, n: int, micro: int | None,
                   tsp: bool = True) -> tuple[Driver, ScheduleConfig]:
    cluster = ClusterSpec.parse(f"col={ranks}xG")
    cfg = ScheduleConfig(mode="colocated", pools=cluster.pools, prompts_per_step=prompts, n=n, num_steps=2,
                         micro_batch_size=micro, tsp=TspConfig(enabled=tsp))
    driver = Driver(cfg, SimExecutor(cluster, profile()))
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    _updated_once(driver, cfg)
    return driver, cfg


def test_colocated_flux_32_ranks_every_rank_busy_in_every_update():
    # the 32-rank FLUX recipe's shape (32 prompts x n=16) with ppo_micro_batch_size_per_gpu=8: two UPDATEs per step,
    # each with 8 samples on every one of the 32 ranks (GAP units of one group of 16 left 16 ranks idle, counted
    # busy); TSP flags the UPDATEs (trainer.digenrl.tsp.enabled honoured in colocated mode)
    driver, cfg = _colocated_run(32, 32, 16, 8)
    workers = {f"col:{i}" for i in range(32)}
    for step in (0, 1):
        updates = [c.task for c in driver.trace.completions if c.task.kind == TaskKind.UPDATE and c.task.step == step]
        assert len(updates) == 2
        for task in updates:
            assert set(task.workers) == workers and {len(s) for _, s in task.assignment} == {8}
            assert "tsp" in task.flags
        gens = [c.task for c in driver.trace.completions if c.task.kind == TaskKind.GEN and c.task.step == step]
        assert [g.assignment for g in gens] == [u.assignment for u in updates]  # one plan for GEN, SCORE, UPDATE
    # no rank idles while counted busy: each rank's busy time is the sum of its own tasks, the same on every rank
    busy = {w: driver.busy_seconds[w] for w in workers}
    assert max(busy.values()) == pytest.approx(min(busy.values()))
    per_timestep, _ = _colocated_run(32, 32, 16, 8, tsp=False)
    assert not any("tsp" in c.task.flags for c in per_timestep.trace.completions)


def test_colocated_uneven_shares_leave_only_finished_ranks_out():
    # 5 prompts x 3 = 15 samples on 4 ranks: shares 4, 4, 4, 3; micro-batches of 3: [3, 3, 3, 3], [1, 1, 1]
    driver, _ = _colocated_run(4, 5, 3, 3)
    for kind in (TaskKind.GEN, TaskKind.SCORE, TaskKind.UPDATE):
        tasks = [c.task for c in driver.trace.completions if c.task.kind == kind and c.task.step == 0]
        assert [t.workers for t in tasks] == [("col:0", "col:1", "col:2", "col:3"), ("col:0", "col:1", "col:2")]
        assert [t.work for t in tasks] == [3, 1]
    one, _ = _colocated_run(4, 5, 3, None)
    assert [c.task.work for c in one.trace.completions if c.task.kind == TaskKind.UPDATE] == [4, 4]


def test_step_by_step_equals_one_run_and_resume_starts_at_version_k():
    cfg = _cfg(tcss=TcssConfig(staleness=1, max_stale_fraction=0.5), start_step=7)
    whole = Driver(cfg, SimExecutor(CLUSTER, profile()))
    whole.run()
    stepped = Driver(cfg, SimExecutor(CLUSTER, profile()))
    got = []
    for _ in range(3):
        got += stepped.run_steps(1)
    assert [r.step for r in got] == [7, 8, 9] and [r.version for r in got] == [7, 8, 9]
    assert stepped.trace.to_text() == whole.trace.to_text()
    first_gen = min((c for c in whole.trace.completions if c.task.kind == TaskKind.GEN), key=lambda c: c.start)
    assert first_gen.task.version == 7


def test_decisions_are_recorded():
    driver = Driver(_cfg(), SimExecutor(CLUSTER, profile()))
    driver.run()
    actions = {d.action for d in driver.trace.decisions}
    assert {"issue", "tag", "skip"} <= actions
    issued = [d for d in driver.trace.decisions if d.action == "issue"]
    assert len(issued) == len(driver.trace.completions)
    probe = [c for c in driver.trace.completions if "probe" in c.task.flags]
    assert len(probe) == 1 and probe[0].task.kind == TaskKind.TAG_GEN


def test_least_busy_selector_spreads_uneven_lanes():
    from digenrl_verl.schedule.select import FirstFree, LeastBusy, make_selector

    assert LeastBusy().order([("a",), ("b",)], {"a": 5.0, "b": 1.0}) == [("b",), ("a",)]
    assert FirstFree().order([("a",), ("b",)], {"a": 5.0}) == [("a",), ("b",)]
    with pytest.raises(ValueError, match="valid names"):
        make_selector("random")
    cluster = ClusterSpec.parse("gen=5xG,trn=2xT")  # n=2: three lanes of widths 2, 2, 1
    cfg = ScheduleConfig(mode="disaggregated", pools=cluster.pools, prompts_per_step=9, n=2, num_steps=2,
                         tag=TagConfig(policy="off"))
    driver = Driver(cfg, SimExecutor(cluster, profile()), selector=LeastBusy())
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    assert len(driver.lanes) == 3 and sorted(map(len, driver.lanes)) == [1, 2, 2]


class _Bounded(SimExecutor):
    """A simulator that refuses to run forever: a driver that re-issues a failing task without bound
    fails the test (AssertionError) instead of hanging it."""

    def submit(self, task) -> None:
        assert len(self.submitted) < 1_000, "the driver keeps re-issuing tasks"
        super().submit(task)


@pytest.mark.parametrize("tag", ["off", "bts"])
def test_a_microbatch_whose_generation_always_fails_stops_after_the_retry_bound(tag):
    """Every GEN (and TAG) of s0 m1 raises on live workers: the driver retries it MAX_TASK_RETRIES times,
    then stops with a ScheduleError naming the task, instead of re-issuing it forever."""
    from digenrl_verl.schedule.driver import MAX_TASK_RETRIES

    faults = (Fault("fail", TaskKind.GEN, step=0, microbatch=1, occurrence=None),
              Fault("fail", TaskKind.TAG_GEN, step=0, microbatch=1, occurrence=None))
    executor = _Bounded(CLUSTER, profile(), faults=faults)
    with pytest.raises(ScheduleError) as err:
        Driver(_cfg(tag=TagConfig(policy=tag)), executor).run()
    attempts = [t for t in executor.submitted if t.step == 0 and t.microbatch == 1
                and t.kind in (TaskKind.GEN, TaskKind.TAG_GEN)]
    assert len(attempts) == MAX_TASK_RETRIES + 1
    first_line = str(err.value).splitlines()[0]
    assert f"s0 m1 (id {attempts[-1].task_id}) failed {MAX_TASK_RETRIES + 1} times on live workers" in first_line
    assert "injected failure" in first_line and "<-- ERROR HERE" in str(err.value)


def test_a_score_that_always_fails_stops_and_fewer_failures_recover():
    from digenrl_verl.schedule.driver import MAX_TASK_RETRIES

    executor = _Bounded(CLUSTER, profile(), faults=(Fault("fail", TaskKind.SCORE, step=1, microbatch=0,
                                                          occurrence=None),))
    with pytest.raises(ScheduleError, match=rf"SCORE s1 m0 \(id \d+\) failed {MAX_TASK_RETRIES + 1} times"):
        Driver(_cfg(), executor).run()
    # exactly MAX_TASK_RETRIES failures of one micro-batch: the run completes and trains every sample once
    faults = tuple(Fault("fail", TaskKind.GEN, step=0, microbatch=1, occurrence=k)
                   for k in range(1, MAX_TASK_RETRIES + 1))
    cfg = _cfg(tag=TagConfig(policy="off"))
    driver = Driver(cfg, SimExecutor(CLUSTER, profile(), faults=faults))
    driver.run()
    assert sum(not c.ok for c in driver.trace.completions) == MAX_TASK_RETRIES
    assert check_run(cfg, driver.trace.completions) == []
    _updated_once(driver, cfg)


def test_mark_dead_excludes_lost_generators_and_refuses_lost_trainers():
    cfg = _cfg(num_steps=2)
    driver = Driver(cfg, SimExecutor(CLUSTER, profile()))
    driver.mark_dead(["gen:3"])
    assert all("gen:3" not in lane for lane in driver.lanes) and driver.lanes
    driver.run()
    assert all("gen:3" not in c.task.workers for c in driver.trace.completions)
    assert check_run(cfg, driver.trace.completions) == []
    _updated_once(driver, cfg)
    with pytest.raises(ScheduleError, match=r"trn:1"):
        Driver(cfg, SimExecutor(CLUSTER, profile())).mark_dead(["trn:1"])
