"""Elastic generator pool in the pure driver: rejoin after a death, grow and shrink (WorkerEvent), on the simulator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig
from digenrl_verl.schedule.driver import Driver, EventSource, WorkerEvent
from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.types import ScheduleError, TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import Fault, SimExecutor
from digenrl_verl.sim.profiles import CostProfile


def profile() -> CostProfile:
    return CostProfile("test", gen=4.0, score=0.5, update_loop=2.0, update_tsp=1.0, tag_overhead=1.2, opt_step=0.5,
                       sync=1.0)


class ElasticSim(SimExecutor):
    """The simulator plus pool changes at virtual times, or once step k's SYNC ended (`after_step`, the runner's
    step boundary), or `rejoin_after` seconds after a completion reported a worker dead (what the Ray runner
    does: it starts a replacement once it learns of the death): an added dead worker is alive again."""

    def __init__(self, cluster: ClusterSpec, events: list[tuple[float, WorkerEvent]],
                 after_step: list[tuple[int, WorkerEvent]] = (), rejoin_after: float | None = None, **kw) -> None:
        super().__init__(cluster, profile(), **kw)
        self.events = sorted(events, key=lambda te: te[0])
        self.after_step = list(after_step)
        self.rejoin_after = rejoin_after
        self.synced: set[int] = set()
        self.reported: set[tuple[int, str]] = set()

    def wait_any(self, timeout):
        out = super().wait_any(timeout)
        self.synced |= {c.task.step for c in out if c.ok and c.task.kind == TaskKind.SYNC
                        and "join" not in c.task.flags}
        if self.rejoin_after is not None:  # (SimExecutor.wait_any recurses: one replacement per reported death)
            self.events += [(c.end + self.rejoin_after, WorkerEvent("added", w, "replacement"))
                            for c in out for w in c.dead_workers if (c.task.task_id, w) not in self.reported]
            self.reported |= {(c.task.task_id, w) for c in out for w in c.dead_workers}
        return out

    def poll_events(self) -> list[WorkerEvent]:
        due = [e for t, e in self.events if t <= self.now()] + [e for k, e in self.after_step if k in self.synced]
        self.events = [(t, e) for t, e in self.events if t > self.now()]
        self.after_step = [(k, e) for k, e in self.after_step if k not in self.synced]
        for e in due:
            if e.kind == "added":
                self.dead.discard(e.worker)
        return due


def _cfg(cluster: ClusterSpec, **kw) -> ScheduleConfig:
    base = dict(mode="disaggregated", pools=cluster.pools, prompts_per_step=4, n=4, num_steps=4,
                tag=TagConfig(policy="off"))
    base.update(kw)
    return ScheduleConfig(**base)


def _each_sample_once(driver: Driver, cfg: ScheduleConfig) -> None:
    for step in range(cfg.start_step, cfg.end_step):
        for kinds in ((TaskKind.GEN, TaskKind.TAG_GEN), (TaskKind.UPDATE,)):
            got = sorted(s for c in driver.trace.completions if c.ok and c.task.kind in kinds and c.task.step == step
                         for s in c.task.samples)
            assert got == list(range(cfg.samples_per_step)), (step, kinds)


def _gen_workers_by_step(driver: Driver) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for c in driver.trace.completions:
        if c.ok and c.task.kind == TaskKind.GEN:
            out.setdefault(c.task.step, set()).update(c.task.workers)
    return out


def test_the_sim_executor_with_events_is_an_event_source():
    assert isinstance(ElasticSim(ClusterSpec.parse("gen=1xG,trn=1xT"), []), EventSource)
    assert not isinstance(SimExecutor(ClusterSpec.parse("gen=1xG,trn=1xT"), profile()), EventSource)


def test_a_killed_generator_rejoins_gets_the_current_weights_and_takes_tasks_again():
    cluster = ClusterSpec.parse("gen=2xG,trn=1xT")
    cfg = _cfg(cluster)
    step1 = Driver(cfg, SimExecutor(cluster, profile())).run()[1]
    kill_at, back_at = step1.start + 0.2 * (step1.end - step1.start), step1.start + 0.4 * (step1.end - step1.start)
    ex = ElasticSim(cluster, [(back_at, WorkerEvent("added", "gen:0", "replacement"))],
                    faults=(Fault("kill", worker="gen:0", at=kill_at),))
    driver = Driver(cfg, ex)
    ends = {r.step: r.end for r in driver.run()}
    assert check_run(cfg, driver.trace.completions) == []
    _each_sample_once(driver, cfg)
    actions = [d.action for d in driver.trace.decisions]
    assert actions.index("dead") < actions.index("rejoin") < actions.index("joined")
    joined_at = next(d.time for d in driver.trace.decisions if d.action == "joined")
    # the weights it got: a SYNC (join, or a step's) naming it, with the version the other generator held
    first_sync = min((c for c in driver.trace.completions if c.task.kind == TaskKind.SYNC and c.ok
                      and "gen:0" in c.task.workers and c.start > back_at), key=lambda c: c.start)
    assert first_sync.end <= joined_at and "join" in first_sync.task.flags and first_sync.task.step == 1
    assert joined_at < ends[1]  # within the step it died in
    later = [c for c in driver.trace.completions if c.ok and c.task.kind == TaskKind.GEN and c.start >= joined_at]
    assert any("gen:0" in c.task.workers for c in later)
    assert "gen:0" not in driver.dead and driver.live_generators == ["gen:0", "gen:1"]


def test_a_join_waits_for_the_next_sync_when_the_trainer_is_ahead_of_the_generators():
    cluster = ClusterSpec.parse("gen=2xG,trn=1xT")
    cfg = _cfg(cluster, num_steps=3)
    probe = Driver(cfg, SimExecutor(cluster, profile()))
    probe.run()
    opt = next(c for c in probe.trace.completions if c.task.kind == TaskKind.OPT_STEP and c.task.step == 0)
    sync = next(c for c in probe.trace.completions if c.task.kind == TaskKind.SYNC and c.task.step == 0)
    at = (opt.end + sync.start) / 2 if sync.start > opt.end else opt.end
    ex = ElasticSim(cluster, [(at, WorkerEvent("added", "gen:2", "grow"))])
    driver = Driver(cfg, ex)
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    syncs = [c for c in driver.trace.completions if c.task.kind == TaskKind.SYNC and "gen:2" in c.task.workers]
    first = min(syncs, key=lambda c: c.start)
    assert "join" not in first.task.flags and first.task.step == 0 and first.task.version == 1


def test_grow_one_to_two_between_steps_and_shrink_back():
    cluster = ClusterSpec.parse("gen=1xG,trn=1xT")
    cfg = _cfg(cluster, num_steps=5)
    ex = ElasticSim(cluster, [], after_step=[(0, WorkerEvent("added", "gen:1", "grow to 2")),
                                             (2, WorkerEvent("removed", "gen:1", "shrink to 1"))])
    driver = Driver(cfg, ex)
    results = driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    _each_sample_once(driver, cfg)
    by_step = _gen_workers_by_step(driver)
    assert by_step[0] == {"gen:0"} and by_step[1] == by_step[2] == {"gen:0", "gen:1"}
    assert by_step[3] == by_step[4] == {"gen:0"}
    assert driver.removed == {"gen:1"} and driver.live_generators == ["gen:0"]
    assert {"grow", "joined", "shrink"} <= {d.action for d in driver.trace.decisions}
    span = {r.step: r.end - r.start for r in results}
    assert span[1] < 0.8 * span[0] and span[4] > 1.2 * span[2]  # two generators generate a step faster


def test_removing_a_busy_generator_lets_its_task_finish_first():
    cluster = ClusterSpec.parse("gen=2xG,trn=1xT")
    cfg = _cfg(cluster, num_steps=2)
    ex = ElasticSim(cluster, [(1.0, WorkerEvent("removed", "gen:1"))])
    driver = Driver(cfg, ex)
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    _each_sample_once(driver, cfg)
    on_1 = [c for c in driver.trace.completions if "gen:1" in c.task.workers]
    assert len(on_1) == 1 and on_1[0].ok and on_1[0].start < 1.0  # the GEN it ran; nothing after
    assert driver.removed == {"gen:1"}


def test_dropping_a_dead_generator_is_recorded_and_bad_events_are_refused():
    cluster = ClusterSpec.parse("gen=2xG,trn=1xT")
    cfg = _cfg(cluster, num_steps=2)
    ex = ElasticSim(cluster, [(10.0, WorkerEvent("removed", "gen:0", "died 3 times"))],
                    faults=(Fault("kill", worker="gen:0", at=2.0),))
    driver = Driver(cfg, ex)
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    assert any(d.action == "drop" and "died 3 times" in d.detail for d in driver.trace.decisions)
    with pytest.raises(ValueError, match="kind"):
        WorkerEvent("joined", "gen:0")
    for event, match in ((WorkerEvent("added", "trn:1"), "only generator"),
                         (WorkerEvent("added", "gen:1"), "already in the generator pool")):
        d = Driver(cfg, SimExecutor(cluster, profile()))
        d.post(event)
        with pytest.raises(ScheduleError, match=match):
            d.run()
    col = ClusterSpec.parse("col=2xG")
    d = Driver(ScheduleConfig(mode="colocated", pools=col.pools, prompts_per_step=2, n=2, num_steps=1),
               SimExecutor(col, profile()))
    d.post(WorkerEvent("added", "col:2"))
    with pytest.raises(ScheduleError, match="disaggregated"):
        d.run()


@settings(max_examples=60, deadline=None)
@given(kill_at=st.floats(0.5, 40.0), back_after=st.floats(0.0, 30.0), grow_at=st.floats(0.0, 60.0),
       shrink_after=st.floats(0.0, 40.0), staleness=st.sampled_from([0, 1]), gap=st.booleans(),
       tag=st.sampled_from(["off", "bts"]))
def test_random_deaths_rejoins_grows_and_shrinks_keep_every_invariant(kill_at, back_after, grow_at, shrink_after,
                                                                      staleness, gap, tag):
    cluster = ClusterSpec.parse("gen=2xG,trn=2xT")
    cfg = _cfg(cluster, num_steps=4, gap=gap, tag=TagConfig(policy=tag),
               tcss=TcssConfig(staleness=staleness, max_stale_fraction=0.5 if staleness else 0.0))
    events = [(grow_at, WorkerEvent("added", "gen:2")), (grow_at + shrink_after, WorkerEvent("removed", "gen:1"))]
    ex = ElasticSim(cluster, events, rejoin_after=back_after, faults=(Fault("kill", worker="gen:0", at=kill_at),))
    driver = Driver(cfg, ex)
    assert len(driver.run()) == 4
    assert check_run(cfg, driver.trace.completions) == []
    _each_sample_once(driver, cfg)
    # a generator only generates with the version it holds (invariant 3 of check_run), also after joining;
    # at W=0 every generation of step s has version s
    if staleness == 0:
        assert all(c.task.version == c.task.step for c in driver.trace.completions
                   if c.ok and c.task.kind == TaskKind.GEN)
