"""Trace exports, text round trip, metrics, and the lower bound (formula + validity)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from digenrl_verl.schedule.bounds import StepCosts, run_lower_bound, step_lower_bound
from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.trace import parse_line, parse_text
from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import SimExecutor
from digenrl_verl.sim.profiles import CostProfile
from digenrl_verl.sim.scenarios import lower_bound

CLUSTER = ClusterSpec.parse("gen=3xG,trn=2xT@2")
PROFILE = CostProfile("t", gen=3.0, score=0.4, update_loop=2.0, update_tsp=1.0, tag_overhead=1.1, opt_step=0.3,
                      sync=0.7)


def _run(**kw):
    cfg = ScheduleConfig(mode="disaggregated", pools=CLUSTER.pools, prompts_per_step=5, n=3, num_steps=2, **kw)
    driver = Driver(cfg, SimExecutor(CLUSTER, PROFILE, jitter=0.2, seed=3))
    driver.run()
    return cfg, driver


def test_text_round_trip():
    _, driver = _run(tcss=TcssConfig(staleness=1, max_stale_fraction=0.4))
    text = driver.trace.to_text()
    lines = parse_text(text)
    assert len(lines) == len(driver.trace.completions)
    assert "\n".join(ln.format() for ln in lines) + "\n" == text
    one = parse_line("1.000 2.500 GEN s3 m4 v2 gen:0=0-2|5,gen:1=3-4 ok +stale")
    assert one.assignment == (("gen:0", (0, 1, 2, 5)), ("gen:1", (3, 4))) and one.flags == {"stale"}
    assert parse_line("3.000 3.500 SYNC s3 m- v4 trn:0,gen:0 ok").microbatch is None
    with pytest.raises(ValueError):
        parse_line("not a schedule line")


def test_chrome_trace_is_perfetto_shaped(tmp_path):
    _, driver = _run()
    data = driver.trace.to_chrome()
    json.dumps(data)
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(driver.trace.events)
    assert all(e["dur"] >= 0 and {"pid", "tid", "ts", "name"} <= set(e) for e in spans)
    names = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"gen", "trn", "driver"} <= names
    path = tmp_path / "t.json"
    driver.trace.write_chrome(str(path))
    assert json.loads(path.read_text())["traceEvents"]


def test_metrics_add_up():
    cfg, driver = _run(tag=TagConfig(policy="off"))
    workers = list(cfg.workers("gen") + cfg.workers("trn"))
    m = driver.trace.metrics(workers, lower_bound=10.0)
    assert set(m.per_worker) == set(workers)
    for w, s in m.per_worker.items():
        busy = sum(e.end - e.start for e in driver.trace.events if e.worker == w)
        assert s.busy == pytest.approx(busy) and s.busy + s.idle == pytest.approx(m.makespan)
    assert m.utilisation + m.bubble_fraction == pytest.approx(1.0)
    assert m.efficiency == pytest.approx(10.0 / m.makespan)


@pytest.mark.parametrize("b, g, gp, t", [(16, 1.0, 1.0, 0.1), (32, 2.0, 3.0, 0.5), (8, 1.0, 2.0, 0.9)])
def test_lower_bound_reduces_to_design_formula(b, g, gp, t):
    # no scoring, OPT or SYNC cost: the design's TAG balance M* = B·g·(g' + t)/(g + g') (for g >= t), plus the tail t
    # of the last update that the design's formula leaves out: the LP crossing of
    # (B - x)·g + t and x·g' + B·t.
    bound = step_lower_bound(StepCosts(b, (g,), (0.0,), t, gp, 0.0, 0.0))
    design = b * g * (gp + t) / (g + gp)
    x_star = (b * g + t - b * t) / (g + gp)
    assert bound.tags == pytest.approx(x_star)
    assert bound.value == pytest.approx(max(min(g, gp) + b * t, b * g + t - g * x_star))
    assert design <= bound.value <= design + t
    # training-bound (g < t): x* = 0 and M* = B·t plus the fill of the first generation
    tb = step_lower_bound(StepCosts(b, (1.0,), (0.0,), 2.0, 1.0, 0.0, 0.0))
    assert tb.value == pytest.approx(1.0 + b * 2.0) and tb.tags == 0.0


def test_heterogeneous_lanes_use_the_fluid_rate():
    c = StepCosts(12, (2.0, 6.0), (0.2, 0.6), 0.5, None, 0.0, 0.0)
    assert c.gen == pytest.approx(1.5) and c.score == pytest.approx(0.15)
    assert step_lower_bound(c).value == pytest.approx(12 * 1.5 + 12 * 0.15 + 0.5)
    assert run_lower_bound(c, 3, 0).value == pytest.approx(3 * step_lower_bound(c).value)
    assert run_lower_bound(c, 3, 1).value <= run_lower_bound(c, 3, 0).value


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gen=st.integers(1, 4), trn=st.integers(1, 3), n=st.integers(1, 4), prompts=st.integers(1, 6),
       tag=st.sampled_from(["off", "bts"]), staleness=st.sampled_from([0, 1]), gap=st.booleans(),
       costs=st.tuples(st.floats(0.5, 5), st.floats(0, 1), st.floats(0.1, 5), st.floats(0.8, 2)))
def test_lower_bound_never_exceeds_a_simulated_makespan(gen, trn, n, prompts, tag, staleness, gap, costs):
    cluster = ClusterSpec.parse(f"gen={gen}xG@0.7,trn={trn}xT")
    profile = CostProfile("p", gen=costs[0], score=costs[1], update_loop=2 * costs[2], update_tsp=costs[2],
                          tag_overhead=costs[3], opt_step=0.2, sync=0.3)
    cfg = ScheduleConfig(mode="disaggregated", pools=cluster.pools, prompts_per_step=prompts, n=n, num_steps=2,
                         tag=TagConfig(policy=tag), gap=gap,
                         tcss=TcssConfig(staleness=staleness, max_stale_fraction=0.5 if staleness else 0.0))
    driver = Driver(cfg, SimExecutor(cluster, profile))
    driver.run()
    makespan = driver.trace.metrics().end
    assert lower_bound(cfg, cluster, profile).value <= makespan * (1 + 1e-9)
    assert TaskKind.SYNC in {c.task.kind for c in driver.trace.completions}
