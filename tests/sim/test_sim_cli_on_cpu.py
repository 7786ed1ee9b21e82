"""digenrl-sim and the BTS benchmark, end to end (all simulated, a few seconds)."""

from __future__ import annotations

import json

import pytest

from digenrl_verl.bench.__main__ import main as bench_main
from digenrl_verl.sim.cli import main
from digenrl_verl.sim.scenarios import (COSTS, DISAGGREGATED_LADDER, HEADLINE_ROWS, IDEAL_PARITY_TARGET, LADDER,
                                        PAPER_FIGURES, PAPER_SUITE)


def _last_json(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    """One run of ``digenrl-sim --suite paper --json``, shared by the checks below."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--suite", "paper", "--json"]) == 0
    lines = buf.getvalue().strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


@pytest.mark.slow  # a whole simulator suite
def test_paper_suite_every_scenario_has_the_three_rows_keys_and_costs(paper):
    out, table = paper
    assert [(s["scenario"], s["costs"]) for s in out["scenarios"]] == [(n, c) for n in PAPER_SUITE for c in COSTS]
    for s in out["scenarios"]:
        labels = [r["label"] for r in s["rows"]]
        assert labels == list(LADDER) and set(HEADLINE_ROWS) <= set(labels)
        assert s["costs"] in ("ideal", "calibrated")
        by = {r["label"]: r["makespan_s"] for r in s["rows"]}
        assert s["digenrl_vs_colocated_best"] == pytest.approx(by["colocated-best"] / by["digenrl"])
        assert s["digenrl_vs_colocated_verl_omni"] == pytest.approx(by["colocated-verl-omni"] / by["digenrl"])
        assert s["full_efficiency"] >= 0.95, (s["scenario"], s["costs"])
        assert all(r["efficiency"] <= 1.0 + 1e-9 for r in s["rows"])  # LB is a lower bound
        if s["costs"] == "calibrated" and s["scenario"] in PAPER_FIGURES:
            assert s["paper"]["source"] and len(s["paper"]["vs_colocated"]) == 2
            assert s["paper_check"]["vs_colocated"]["where"] in ("inside", "above", "below")
        if s["costs"] == "ideal":
            assert "paper" not in s
    assert out["all_efficiency_at_least_target"] and out["min_full_efficiency"] >= 0.95
    assert "digenrl/col-best" in table and "held-out" in table and "calibration:" in table


@pytest.mark.slow  # a whole simulator suite
def test_ideal_homogeneous_digenrl_reaches_parity_with_colocated_best(paper):
    """On identical devices without switching costs colocated-best is the limit; DigenRL reaches >= 0.97 of it in
    every homogeneous scenario. FLUX.1 needs the TCSS guard's slack (`tcss.guard_slack`, default 0.1): with a strict
    guard (0.965) the generators idle ~12 s per step (last UPDATE + OPT_STEP + SYNC) because a stale GEN (8.3 s)
    would end 0.3 s after the trainer's estimated end."""
    out, _ = paper
    ideal = {s["scenario"]: s for s in out["scenarios"] if s["costs"] == "ideal"}
    for name, s in ideal.items():
        if name.startswith("hetero-"):
            assert s["digenrl_vs_colocated_best"] > 1.2  # the slow class paces colocated
        else:
            assert s["digenrl_vs_colocated_best"] >= IDEAL_PARITY_TARGET, name
        # ideal: no switch, the memory model is off, TAG pays no context switch
        rows = {r["label"]: r for r in s["rows"]}
        assert rows["colocated-best"]["cost_model"]["memory_mode"] == "ideal"
        assert rows["digenrl"]["cost_model"]["tag_overhead"] == 1.0
    assert out["ideal_below_parity_target"] == {}
    assert out["ideal_min_digenrl_vs_colocated_best"] >= IDEAL_PARITY_TARGET


@pytest.mark.slow  # a whole simulator suite
def test_calibration_fits_one_figure_and_reports_held_out_errors(paper):
    out, _ = paper
    cal = out["calibration"]
    assert cal["figure"] == "flux.1" and cal["parameter"] == "switch_gb_s" and cal["value"] > 0
    assert cal["reached"] == pytest.approx(cal["target"], rel=1e-3)
    flux = next(s for s in out["scenarios"] if s["scenario"] == "flux.1" and s["costs"] == "calibrated")
    assert flux["digenrl_vs_colocated_best"] == pytest.approx(cal["target"], rel=1e-3)
    preds = {(p["metric"], tuple(p["scenarios"])): p for p in out["predictions"]}
    held = [p for p in out["predictions"] if p["held_out"]]
    assert [p for p in out["predictions"] if not p["held_out"]][0]["scenarios"] == ["flux.1"]
    assert len(held) >= 5  # HunyuanVideo and Wan2.1 with and without TCSS, heterogeneous, over veRL-Omni
    hetero = next(p for p in held if p["scenarios"] == ["hetero-paper-a+c"])
    assert hetero["paper"] == [1.46, 1.85] and hetero["metric"] == "digenrl_vs_colocated_best"
    assert set(out["hetero_digenrl_vs_colocated_best"]) == {"hetero-8+8", "hetero-paper-a+c"}
    # the alternative model: the colocated generator's slowdown fitted on the same figure, the same figures predicted
    alt = out["alternative_calibration"]
    assert alt["calibration"]["parameter"] == "colocated_gen_factor" and alt["costs"]["colocated_gen_factor"] > 1
    assert alt["calibration"]["reached"] == pytest.approx(cal["target"], rel=1e-3)
    assert [(p["metric"], p["scenarios"]) for p in alt["predictions"]] == [(p["metric"], p["scenarios"])
                                                                            for p in out["predictions"]]
    for p in held:
        lo, hi = p["paper"]
        mid = (lo + hi) / 2
        assert p["error_vs_midpoint"] == pytest.approx(p["simulated_mean"] / mid - 1)
        assert p["where"] in ("inside", "above", "below")
    # the measured predictions (docs/benchmarks.md states them): Wan2.1 and HunyuanVideo are under-predicted,
    # the gain over veRL-Omni lands inside the paper's range
    wan = preds[("digenrl_vs_colocated_best", ("wan2.1",))]
    assert wan["where"] == "below" and wan["simulated_mean"] == pytest.approx(1.008, abs=0.01)
    vo = next(p for p in held if p["metric"] == "digenrl_vs_colocated_verl_omni")
    assert vo["where"] == "inside" and vo["range_overlap"]
    # calibrated colocated rows pay the switch; verl-omni's row also recomputes old log-probs
    rows = {r["label"]: r for r in flux["rows"]}
    assert rows["colocated-best"]["cost_model"]["switch_s"] > 0
    assert rows["colocated-verl-omni"]["cost_model"]["recompute"] is True
    assert set(rows["colocated-best"]["cost_model"]["modes_makespan_s"]) == {"offload", "resident"}


@pytest.mark.slow  # a whole simulator suite
def test_paper_suite_ablation_ladder_is_monotone(paper):
    """Every disaggregated ladder step is no slower than the one before, over the whole run (step 0's online
    profiling included) and after step 0, in every scenario and cost setting, for every transition from naive on."""
    out, _ = paper
    chain = list(DISAGGREGATED_LADDER)
    for s in out["scenarios"]:
        rows = {r["label"]: r for r in s["rows"]}
        for a, b in zip(chain, chain[1:]):
            assert rows[b]["makespan_s"] <= rows[a]["makespan_s"] * (1 + 1e-9), (s["scenario"], a, b)
            after_a = rows[a]["makespan_s"] - rows[a]["step_s"][0]
            after_b = rows[b]["makespan_s"] - rows[b]["step_s"][0]
            assert after_b <= after_a * (1 + 1e-9), (s["scenario"], a, b, "after step 0")
        assert s["monotone"] and not s["violations"], s["violations"]
        assert s["monotone_after_step0"], s["violations_after_step0"]
        assert rows["naive"]["speedup_vs_naive"] == 1.0
    assert out["all_monotone"] and out["all_monotone_after_step0"] and not out["violations"]


def test_ladder_writes_trace_png_and_text(tmp_path, capsys):
    trace, png, text = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "s.txt"
    assert main(["--suite", "ladder", "--scenario", "flux.1", "--steps", "2", "--prompts", "8", "--json",
                 "--trace", str(trace), "--png", str(png), "--schedule-text", str(text)]) == 0
    out = _last_json(capsys)
    assert out["suite"] == "ladder" and out["scenario"] == "flux.1" and len(out["rows"]) == len(LADDER)
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert " SYNC s1 " in text.read_text()
    assert main(["--suite", "ladder", "--scenario", "flux.1", "--steps", "1", "--prompts", "8", "--costs", "calibrated",
                 "--json"]) == 0
    out = _last_json(capsys)
    assert out["costs"] == "calibrated" and "digenrl_vs_colocated_best" in out and "paper_check" in out


def test_single_run_overrides_and_errors(capsys):
    assert main(["--scenario", "qwen-image", "--cluster", "gen=4xA800@0.6,trn=2xH800@1.5", "--tag-policy", "static",
                 "--tag-static-k", "3", "--tcss-staleness", "0", "--steps", "2", "--jitter", "0.1", "--json"]) == 0
    out = _last_json(capsys)
    assert out["config"]["tag"]["policy"] == "static" and out["config"]["pools"]["trn"]["size"] == 2
    assert out["efficiency"] > 0 and out["tag_microbatches"] <= 2 * 3  # jitter: LB is from mean costs
    assert main(["--scenario", "nope"]) == 2
    assert "valid names" in capsys.readouterr().err
    assert main(["--list"]) == 0 and "hunyuanvideo-20-0.6" in capsys.readouterr().out


def test_colocated_cluster_single_run(capsys):
    assert main(["--scenario", "flux.1", "--cluster", "col=8xH800", "--steps", "1", "--json"]) == 0
    out = _last_json(capsys)
    assert out["config"]["mode"] == "colocated" and out["efficiency"] == pytest.approx(1.0)


def test_bench_bts_json(capsys):
    assert bench_main(["bts", "--json", "--repeat", "1"]) == 0
    out = _last_json(capsys)
    assert {(r["B"], r["ratio"]) for r in out["rows"]} == {(b, r) for b in (8, 32, 128) for r in (0.1, 0.5, 1.0)}
    for r in out["rows"]:
        assert r["makespan"] <= r["no_tag_makespan"] + 1e-9 and r["makespan"] <= r["best_static_makespan"] + 1e-9
        assert r["exact_makespan"] <= r["makespan"] + 1e-9
    assert out["headline"]["B"] == 128 and "ms_median" in out["headline"]


@pytest.mark.slow  # a whole simulator suite
def test_scale_suite_reports_driver_and_bts_costs(capsys):
    """1024 GPUs, 1024 micro-batches per step: the run completes and reports the per-decision figures
    (the speed targets themselves are checked by reading the report, not here)."""
    assert main(["--suite", "scale", "--steps", "1", "--json"]) == 0
    out = _last_json(capsys)
    assert out["gpus"] == 1024 and out["microbatches_per_step"] == 1024 and out["lanes"] == 32
    assert out["decisions"] > 2 * 1024 and out["bts_solves"] > 0
    for key in ("driver_ms_per_decision", "bts_max_ms", "bts_mean_ms", "driver_ok", "bts_ok"):
        assert key in out
    assert 0.9 <= out["efficiency"] <= 1.0


def test_checkpoint_barriers_cost_the_modelled_drain(capsys):
    spans = {}
    for every in (0, 2):
        assert main(["--scenario", "flux.1", "--steps", "4", "--checkpoint-every", str(every), "--json"]) == 0
        spans[every] = _last_json(capsys)["makespan_s"]
    assert spans[2] > spans[0]  # two barriers (after steps 1 and 3), each at least the profile's checkpoint time
