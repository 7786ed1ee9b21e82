"""The schedule side of TAG on verl-omni's hybrid engine: a g' floor (the engine switch, timed before any TAG) in the
profiler, BTS deciding ties for skip on it, and the Chrome trace drawing a task's phases (the switch) as sub-spans."""

from __future__ import annotations

import pytest

from digenrl_verl.schedule.bts import BtsCosts, BtsSolver, BtsState, GenPhase
from digenrl_verl.schedule.cost import CostProfiler
from digenrl_verl.schedule.tag import BtsTag, BubbleContext
from digenrl_verl.schedule.trace import PHASES, Trace, phase_spans
from digenrl_verl.schedule.types import Completion, Task, TaskKind

# flux.1 on the hybrid engine with the large switch, at its second bubble: g' >= the 184 s switch, free updates
PRIOR = BtsCosts(gen=8.3, score=0.0, update=0.0, tag=184.0)
TIED = BtsState(29, GenPhase.GEN, 8.3, 0)


def _ctx(prior: BtsCosts | None, *, floor: bool, costs: BtsCosts | None = None) -> BubbleContext:
    return BubbleContext(now=8.3, step=0, pending=TIED.pending, tags_this_step=0, state=TIED, costs=costs,
                         tag_cost_known=True, prior=prior, tag_floor=floor)


def test_a_floor_is_an_estimate_until_the_first_measurement_replaces_it():
    p = CostProfiler()
    p.seed_floor(TaskKind.TAG_GEN, "H800", 184.0)
    assert p.is_floor(TaskKind.TAG_GEN, "H800") and p.estimate(TaskKind.TAG_GEN, "H800", 2) == 368.0
    task = Task(1, TaskKind.TAG_GEN, 0, 3, ("trn:0",), 0, (("trn:0", (0,)),))
    p.observe(Completion(task, 10.0, 202.3), "H800")
    assert not p.is_floor(TaskKind.TAG_GEN, "H800")
    assert p.unit_cost(TaskKind.TAG_GEN, "H800") == pytest.approx(192.3)  # replaced, not averaged with the floor
    p.seed(TaskKind.GEN, "H800", 8.3)
    assert not p.is_floor(TaskKind.GEN, "H800") and not p.is_floor(TaskKind.UPDATE, "H800")


def test_a_prior_tie_is_decided_for_skip_when_g_prime_is_only_a_floor():
    result = BtsSolver(PRIOR).solve(TIED)
    assert result.tag_makespan == pytest.approx(result.skip_makespan)  # the case the tie rule decides
    measured = BtsTag().decide(_ctx(PRIOR, floor=False))
    assert measured.tag and measured.reason.startswith("prior(g=8.3 sc=0 t=0 g'=184) bts")
    floor = BtsTag().decide(_ctx(PRIOR, floor=True))
    assert not floor.tag and floor.reason.startswith("prior(g=8.3 sc=0 t=0 g'>=184) bts")
    # with every cost measured the plain rule (ties skip) holds either way; the floor is named in the reason
    exact = BtsTag().decide(_ctx(None, floor=True, costs=PRIOR))
    assert not exact.tag and exact.reason.startswith("floor(g'>=184) bts")


def _completion(task_id: int, kind: TaskKind, start: float, end: float, **info) -> Completion:
    workers = ("trn:0", "trn:1") if kind == TaskKind.TAG_GEN else ("gen:0",)
    task = Task(task_id, kind, 0, task_id, workers, 0, tuple((w, (task_id,)) for w in workers))
    return Completion(task, start, end, info=info)


def test_chrome_trace_draws_phases_as_nested_sub_spans_and_leaves_the_rest_as_it_was():
    phases = (("wake", 3.4), ("sync", 2.4), ("generate", 8.3), ("sleep", 3.4))
    gen = _completion(1, TaskKind.GEN, 0.0, 8.3)
    tag = _completion(2, TaskKind.TAG_GEN, 1.0, 18.5, engine="hybrid", switch_s=9.2, phases=phases)
    plain = _completion(2, TaskKind.TAG_GEN, 1.0, 18.5)
    with_phases, without = Trace([gen, tag]), Trace([gen, plain])
    assert with_phases.to_text() == without.to_text()  # the text form (golden files) never shows phases
    new, old = with_phases.to_chrome()["traceEvents"], without.to_chrome()["traceEvents"]
    subs = [e for e in new if e.get("cat", "").startswith("TAG.")]
    assert [e for e in new if e not in subs] == [
        {**e, "args": {**e["args"], "engine": "hybrid", "switch_s": 9.2}} if e.get("cat") == "TAG" else e for e in old]
    assert len(subs) == 2 * len(phases)  # every phase on each of the task's two workers
    for parent in (e for e in new if e.get("cat") == "TAG"):
        mine = [e for e in subs if e["tid"] == parent["tid"]]
        assert [e["name"] for e in mine] == ["wake", "sync", "generate", "sleep"]
        assert mine[0]["ts"] == parent["ts"]
        assert mine[-1]["ts"] + mine[-1]["dur"] == pytest.approx(parent["ts"] + parent["dur"])
        assert all(a["ts"] + a["dur"] == pytest.approx(b["ts"]) for a, b in zip(mine, mine[1:]))
        assert [e["args"]["seconds"] for e in mine] == [s for _, s in phases]
    assert phase_spans(gen) == [] and phase_spans(tag)[-1][2] == tag.end and PHASES == "phases"
