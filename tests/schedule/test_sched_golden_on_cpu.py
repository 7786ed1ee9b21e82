"""Golden schedules: small scenarios stored as text (one action per line) under schedule/golden/.

To regenerate after an intended change: ``DIGENRL_UPDATE_GOLDEN=1 pytest tests/schedule/test_sched_golden_on_cpu.py``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import digenrl_verl.schedule as schedule
from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig, TspConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.trace import parse_text
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import SimExecutor
from digenrl_verl.sim.profiles import CostProfile

GOLDEN = Path(schedule.__file__).parent / "golden"
CLUSTER = ClusterSpec.parse("gen=2xG,trn=2xT")
PROFILE = CostProfile("golden", gen=4.0, score=0.5, update_loop=2.0, update_tsp=1.0, tag_overhead=1.25, opt_step=0.5,
                      sync=1.0)
BASE = dict(mode="disaggregated", pools=CLUSTER.pools, prompts_per_step=4, n=2, num_steps=2)  # the paper's Fig. 5 batch
CASES = {
    "fig5_digenrl.txt": ("GAP + TSP + BTS + TCSS(W=1, 50%)",
                         ScheduleConfig(tcss=TcssConfig(staleness=1, max_stale_fraction=0.5), **BASE)),
    "fig5_naive.txt": ("naive disaggregation: batch-axis, full-batch barrier, per-timestep loop",
                       ScheduleConfig(gap=False, pipeline=False, tsp=TspConfig(enabled=False),
                                      tag=TagConfig(policy="off"), **BASE)),
}


def _render(title: str, cfg: ScheduleConfig) -> str:
    driver = Driver(cfg, SimExecutor(CLUSTER, PROFILE))
    driver.run()
    return f"# {title}; 2 generator + 2 trainer ranks, 4 prompts x 2 samples, 2 steps\n" + driver.trace.to_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_schedule(name):
    text = _render(*CASES[name])
    path = GOLDEN / name
    if os.environ.get("DIGENRL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with DIGENRL_UPDATE_GOLDEN=1"
    assert text == path.read_text()
    for line in parse_text(path.read_text()):  # the stored text parses back to itself
        assert line.format() in text
