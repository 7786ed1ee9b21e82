"""Heterogeneous pools: placement by Ray custom resources (on CPU), and the Sec. 5.4 shape in the simulator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl_verl.integrations.hetero_sim import hetero_report, main
from digenrl_verl.main import compose
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
    spec = build_run(compose([
        f"actor_rollout_ref.model.path={tiny_dirs['FluxPipeline']}", "trainer.digenrl.mode=disaggregated",
        "trainer.digenrl.pools.generator.custom_resource=kind_a", "trainer.digenrl.pools.trainer.custom_resource=kind_b"]))
    assert spec.digenrl.pools["generator"].custom_resource == "kind_a"
    assert {name: p.worker_class for name, p in spec.schedule.pools.items()} == {"gen": "kind_a", "trn": "kind_b"}
    with pytest.raises(ValueError, match=r"pools\.generator\.accelerator_type='A800' needs .*use_gpu=true"):
        build_run(compose([f"actor_rollout_ref.model.path={tiny_dirs['FluxPipeline']}",
                           "trainer.digenrl.mode=disaggregated", "trainer.digenrl.pools.generator.accelerator_type=A800"]))


def test_hetero_8p8_simulation_reports_the_gain_over_colocated(capsys):
    report = hetero_report()
    rows = {r["label"]: r for r in report["rows"]}
    scen = rows["slow generators (scenario)"]
    assert scen["cluster"] == "gen=8xA800@0.6,trn=8xH800"
    # Colocated runs the 16 ranks in lock-step at the slow class's pace, whichever class generates.
    assert scen["colocated_s"] == pytest.approx(rows["slow trainers (swapped)"]["colocated_s"])
    assert scen["colocated_s"] > rows["homogeneous reference"]["colocated_s"]
    for r in report["rows"]:
        assert r["gain_over_colocated"] == pytest.approx(r["colocated_s"] / r["digenrl_s"])
        assert r["gain_over_colocated"] > 1.0, r
    # Mixing GPU kinds costs colocated more than DigenRL (its pools run at their own speeds).
    assert scen["gain_over_colocated"] > rows["homogeneous reference"]["gain_over_colocated"]
    assert main(["--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1])["rows"][0]["gain_over_colocated"] == pytest.approx(scen["gain_over_colocated"])
    assert "gain" in out[1] and "simulated" in out[0]
