"""Several optimizer steps per global step (verl's ``ppo_mini_batch_size < train_batch_size``): the plan's mini-batches,
the driver's UPDATE / OPT_STEP / SYNC order, and the invariants that audit it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from digenrl_verl.errors import ConfigError
from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig, minibatch_groups
from digenrl_verl.schedule.driver import Driver, WorkerEvent
from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.plan import BatchAxisPlanner, ColocatedPlanner, GapPlanner, step_microbatches
from digenrl_verl.schedule.types import Completion, TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import SimExecutor
from digenrl_verl.sim.profiles import CostProfile

CLUSTER = ClusterSpec.parse("gen=4xG,trn=2xT")
COLOCATED = ClusterSpec.parse("col=4xG")


def profile() -> CostProfile:
    return CostProfile("test", gen=4.0, score=0.5, update_loop=2.0, update_tsp=1.0, tag_overhead=1.2, opt_step=0.5,
                       sync=1.0)


def _cfg(**kw) -> ScheduleConfig:
    base = dict(mode="disaggregated", pools=CLUSTER.pools, prompts_per_step=8, n=4, num_steps=3,
                mini_batches_per_step=2)
    base.update(kw)
    return ScheduleConfig(**base)


def _run(cfg: ScheduleConfig, cluster: ClusterSpec = CLUSTER) -> Driver:
    driver = Driver(cfg, SimExecutor(cluster, profile()))
    driver.run()
    return driver


def _trainer_tasks(driver: Driver, step: int) -> list[Completion]:
    return sorted((c for c in driver.trace.completions if c.ok and c.task.step == step
                   and c.task.kind in (TaskKind.UPDATE, TaskKind.OPT_STEP, TaskKind.SYNC)), key=lambda c: c.start)


@pytest.mark.parametrize("planner", [GapPlanner(), BatchAxisPlanner(), ColocatedPlanner(3)])
def test_plan_cuts_contiguous_prompt_blocks_in_order(planner):
    mbs = step_microbatches(planner, 0, prompts=8, n=4, ranks=2, minibatches=2)
    assert [m.index for m in mbs] == list(range(len(mbs)))
    assert sorted(s for m in mbs for s in m.samples) == list(range(32))
    for m in mbs:  # mini-batch j holds the prompt groups 4j..4j+3 and nothing else
        assert {p // 4 for p in m.prompts} == {m.minibatch}
        assert {s // 16 for s in m.samples} == {m.minibatch}
        assert sorted(s for part in m.split for s in part) == (list(m.samples) if m.split else [])
    assert [m.minibatch for m in mbs] == sorted(m.minibatch for m in mbs)  # mini-batch order = micro-batch order
    one = step_microbatches(planner, 0, prompts=8, n=4, ranks=2)
    assert one == planner.microbatches(0, 8, 4, 2)  # k=1 is today's plan


def test_config_rejects_a_count_that_does_not_divide_the_prompts():
    with pytest.raises(ConfigError, match="mini_batches_per_step.*divisor of prompts_per_step=8"):
        _cfg(mini_batches_per_step=3)
    with pytest.raises(ConfigError, match="mini_batches_per_step"):
        _cfg(mini_batches_per_step=0)


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_each_minibatch_is_updated_then_stepped_and_sync_follows_the_last(mode):
    cluster = CLUSTER if mode == "disaggregated" else COLOCATED
    cfg = _cfg(mode=mode, pools=cluster.pools, mini_batches_per_step=4, micro_batch_size=2)
    driver = _run(cfg, cluster)
    assert check_run(cfg, driver.trace.completions) == []
    for step in range(cfg.num_steps):
        seq = _trainer_tasks(driver, step)
        opts = [c for c in seq if c.task.kind == TaskKind.OPT_STEP]
        assert [c.task.version for c in opts] == [step, step, step, step + 1]
        cuts = [seq.index(c) for c in opts]
        blocks = [seq[lo + 1 if i else 0:hi] for i, (lo, hi) in enumerate(zip([0] + cuts, cuts))]
        # verl's cut over the trainer ranks where it keeps groups whole (2 trainers: 8 prompts % (4 x 2) == 0), else
        # contiguous blocks (4 colocated ranks: a rank's block would be half a group)
        assert cfg.minibatch_dp_ranks == (2 if mode == "disaggregated" else 1)
        groups = minibatch_groups(8, 4, cfg.minibatch_dp_ranks)
        for j, block in enumerate(blocks):  # before OPT_STEP j: exactly the UPDATEs of mini-batch j
            samples = sorted(s for c in block for s in c.task.samples)
            assert samples == [g * 4 + i for g in groups[j] for i in range(4)], (j, [c.task.label for c in block])
        syncs = [c for c in seq if c.task.kind == TaskKind.SYNC]
        assert len(syncs) == (mode == "disaggregated")
        assert all(s.start >= opts[-1].end for s in syncs)
    assert driver.trainer_version == cfg.num_steps


@settings(max_examples=40, deadline=None)
@given(k=st.sampled_from([1, 2, 4]), staleness=st.sampled_from([0, 1]), gap=st.booleans(),
       tag=st.sampled_from(["off", "bts", "static"]), pipeline=st.booleans())
def test_invariants_hold_with_tag_tcss_gap(k, staleness, gap, tag, pipeline):
    cfg = _cfg(mini_batches_per_step=k, gap=gap, pipeline=pipeline,
               tcss=TcssConfig(staleness=staleness, guard=False, max_stale_fraction=0.5 if staleness else 0.0),
               tag=TagConfig(policy=tag, static_k=2 if tag == "static" else 0))
    driver = _run(cfg)
    assert check_run(cfg, driver.trace.completions) == []
    syncs = [c for c in driver.trace.completions if c.ok and c.task.kind == TaskKind.SYNC]
    assert sorted(c.task.version for c in syncs if "join" not in c.task.flags) == list(range(1, cfg.num_steps + 1))


def test_invariants_catch_an_update_of_the_next_minibatch_before_the_optimizer_step():
    cfg = _cfg()
    driver = _run(cfg)
    trace = list(driver.trace.completions)
    opt0 = next(c for c in trace if c.task.kind == TaskKind.OPT_STEP and c.task.step == 0)
    late = next(c for c in trace if c.task.kind == TaskKind.UPDATE and c.task.step == 0
                and cfg.minibatch_of(c.task.samples[0]) == 1)
    moved = dataclasses.replace(late, start=opt0.start - 0.25, end=opt0.start - 0.01)
    bad = [moved if c is late else c for c in trace]
    assert any("mini-batch 1) starts before OPT_STEP 0" in v for v in check_run(cfg, bad))
    dropped = [c for c in trace if c is not opt0]
    assert any("1 successful OPT_STEPs, want mini_batches_per_step=2" in v for v in check_run(cfg, dropped))


def test_k1_schedule_is_unchanged_by_the_feature():
    """k=1 runs exactly the plan it ran before mini-batches existed: one OPT_STEP per step, version bumped."""
    cfg = _cfg(mini_batches_per_step=1)
    driver = _run(cfg)
    opts = [c.task for c in driver.trace.completions if c.task.kind == TaskKind.OPT_STEP]
    assert [(t.step, t.version, sorted(t.flags)) for t in opts] == [(s, s + 1, []) for s in range(cfg.num_steps)]


class _JoinAt(SimExecutor):
    """The simulator plus one generator that joins at virtual time `at` (an `EventSource`)."""

    def __init__(self, cluster: ClusterSpec, at: float, worker: str) -> None:
        super().__init__(cluster, profile())
        self.at, self.worker, self.sent = at, worker, False

    def poll_events(self) -> list[WorkerEvent]:
        if self.sent or self.now() < self.at:
            return []
        self.sent = True
        return [WorkerEvent("added", self.worker, "grow")]


def test_a_generator_joining_between_two_optimizer_steps_waits_for_the_step_s_weights():
    """Between a step's optimizer steps the trainer's version has not changed but its weights have: a join SYNC
    then would hand the new generator weights no version names."""
    cluster = ClusterSpec.parse("gen=2xG,trn=1xT")
    cfg = _cfg(pools=cluster.pools, prompts_per_step=4, tag=TagConfig(policy="off"))
    probe = _run(cfg, cluster)
    opts = sorted((c for c in probe.trace.completions if c.task.kind == TaskKind.OPT_STEP and c.task.step == 0),
                  key=lambda c: c.start)
    driver = Driver(cfg, _JoinAt(cluster, opts[0].end, "gen:2"))
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    first = min((c for c in driver.trace.completions if c.task.kind == TaskKind.SYNC and "gen:2" in c.task.workers),
                key=lambda c: c.start)
    last_opt0 = max(c.end for c in driver.trace.completions if c.task.kind == TaskKind.OPT_STEP and c.task.step == 0)
    assert first.start >= last_opt0 and first.task.version == 1
