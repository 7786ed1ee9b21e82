"""Heterogeneous pools: placement by Ray custom resources (on CPU). The Sec. 5.4 shape in the simulator is in
tests/sim/test_sim_hetero_on_cpu.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run

PROBE = Path(__file__).with_name("hetero_placement_probe.py")


@pytest.mark.slow
def test_pools_are_placed_by_custom_resources():
    """A local Ray instance advertising `kind_a` and `kind_b` (its own process: the shared test instance
    advertises none): the generator pool's bundles hold kind_a, the trainer pool's kind_b, the node's capacity
    of each resource went to its pool, and a worker group built on a pool runs inside its placement group."""
    proc = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for role, kind, n in (("generator", "kind_a", 2), ("trainer", "kind_b", 1)):
        pool = report["pools"][role]
        assert [b.get(kind) for b in pool["bundles"]] == [pytest.approx(1e-3)] * n
        other = "kind_b" if kind == "kind_a" else "kind_a"
        assert all(other not in b for b in pool["bundles"])
    workers = report["pools"]["trainer"]["workers"]
    assert len(workers) == 1 and {w["pg"] for w in workers} == set(report["pools"]["trainer"]["placement_groups"])
    assert report["available"] == {"kind_a": pytest.approx(1 - 2e-3), "kind_b": pytest.approx(1 - 1e-3)}


def test_pool_placement_keys_reach_the_run_spec(tiny_dirs):
    spec = build_run(compose([TINY_CPU,
        f"actor_rollout_ref.model.path={tiny_dirs['FluxPipeline']}", "trainer.digenrl.mode=disaggregated",
        "trainer.digenrl.pools.generator.custom_resource=kind_a",
        "trainer.digenrl.pools.trainer.custom_resource=kind_b"]))
    assert spec.digenrl.pools["generator"].custom_resource == "kind_a"
    assert {name: p.worker_class for name, p in spec.schedule.pools.items()} == {"gen": "kind_a", "trn": "kind_b"}
    with pytest.raises(ValueError, match=r"pools\.generator\.accelerator_type='A800' is invalid: needs use_gpu=true"):
        build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_dirs['FluxPipeline']}",
                           "trainer.digenrl.mode=disaggregated",
                           "trainer.digenrl.pools.generator.accelerator_type=A800"]))
