"""The paper's Sec. 5.4 shape in the simulator (`digenrl_verl.sim.hetero`): 8 + 8 GPUs of two kinds."""

from __future__ import annotations

import json

import pytest

from digenrl_verl.sim.hetero import hetero_report, main


def test_hetero_8p8_simulation_reports_the_gain_over_colocated(capsys):
    """Gains over colocated-best under the calibrated colocation costs (the default)."""
    report = hetero_report()
    assert report["costs"] == "calibrated" and report["baseline"] == "colocated-best"
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
