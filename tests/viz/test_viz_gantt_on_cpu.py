"""Gantt PNG: each row carries its worker's idle share, the title the makespan and bubble fraction."""

from __future__ import annotations

import re

import pytest

from digenrl_verl.schedule.config import ScheduleConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.trace import Trace
from digenrl_verl.schedule.types import Completion, Task, TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import SimExecutor
from digenrl_verl.viz.gantt import save_gantt
from digenrl_verl.sim.profiles import CostProfile

LABEL = re.compile(r"^(?P<worker>\S+) \(idle (?P<pct>\d+(\.\d)?)%\)$")
PNG = b"\x89PNG\r\n\x1a\n"


def _parse(labels) -> dict[str, float]:
    out = {}
    for text in labels:
        m = LABEL.match(text)
        assert m, f"row label without an idle share: {text!r}"
        out[m["worker"]] = float(m["pct"])
    return out


def _task(tid: int, kind: TaskKind, workers: tuple[str, ...]) -> Task:
    return Task(tid, kind, 0, None, workers, 0, tuple((w, ()) for w in workers))


def test_hand_made_trace_labels_and_title(tmp_path):
    # gen:0 busy 0-10 (a failed try 0-2 counts as busy), gen:1 busy 2-7, trn:0 busy 6-10: span 10 s
    trace = Trace()
    trace.record(Completion(_task(1, TaskKind.SYNC, ("gen:0",)), 0.0, 2.0, ok=False))
    trace.record(Completion(_task(2, TaskKind.SYNC, ("gen:0",)), 2.0, 10.0))
    trace.record(Completion(_task(3, TaskKind.OPT_STEP, ("gen:1",)), 2.0, 7.0))
    trace.record(Completion(_task(4, TaskKind.OPT_STEP, ("trn:0",)), 6.0, 10.0))
    info = save_gantt(trace, str(tmp_path / "g.png"), title="hand made")
    assert (tmp_path / "g.png").read_bytes()[:8] == PNG
    assert info.labels == ("gen:0 (idle 0.0%)", "gen:1 (idle 50%)", "trn:0 (idle 60%)")
    # busy 10 + 5 + 4 = 19 of 30 worker-seconds: 11/30 idle
    assert info.title == "hand made\nmakespan 10.0 s, bubble fraction 37% (idle share of 3 workers)"


def test_simulated_run_labels_match_trace_metrics(tmp_path):
    cluster = ClusterSpec.parse("gen=4xG,trn=2xT")
    profile = CostProfile("t", gen=4.0, score=0.5, update_loop=2.0, update_tsp=1.0, tag_overhead=1.2,
                          opt_step=0.5, sync=1.0)
    cfg = ScheduleConfig(mode="disaggregated", pools=cluster.pools, prompts_per_step=6, n=4, num_steps=2)
    driver = Driver(cfg, SimExecutor(cluster, profile))
    driver.run()
    metrics = driver.trace.metrics()
    info = save_gantt(driver.trace, str(tmp_path / "run.png"))
    shown = _parse(info.labels)
    assert list(shown) == ["gen:0", "gen:1", "gen:2", "gen:3", "trn:0", "trn:1"]
    idle = {w: 100.0 * s.idle / metrics.makespan for w, s in metrics.per_worker.items()}
    assert len(set(round(v, 1) for v in idle.values())) > 1  # the workers' shares differ: a real check
    for worker, pct in shown.items():
        assert pct == pytest.approx(idle[worker], abs=0.05 if idle[worker] < 9.95 else 0.5), worker
    m = re.fullmatch(r"makespan (\S+) s, bubble fraction (\S+)% \(idle share of 6 workers\)", info.title)
    assert m and float(m[1]) == pytest.approx(metrics.makespan, abs=0.05)
    assert float(m[2]) == pytest.approx(100 * metrics.bubble_fraction, abs=0.5)
    # a few rows drawn: the labels keep each worker's own share; the title still covers every worker
    few = save_gantt(driver.trace, str(tmp_path / "few.png"), title="t", max_workers=2)
    assert _parse(few.labels).keys() == {"gen:0", "trn:0"} and few.title.endswith("(idle share of 6 workers)")
    assert all(_parse(few.labels)[w] == shown[w] for w in ("gen:0", "trn:0"))
