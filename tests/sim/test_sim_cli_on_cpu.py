"""digenrl-sim and the BTS benchmark, end to end (all simulated, a few seconds)."""

from __future__ import annotations

import json

import pytest

from digenrl_verl.bench.__main__ import main as bench_main
from digenrl_verl.sim.cli import main
from digenrl_verl.sim.scenarios import LADDER, PAPER_SUITE


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


def test_paper_suite_full_digenrl_reaches_the_efficiency_target(paper):
    out, table = paper
    assert [s["scenario"] for s in out["scenarios"]] == list(PAPER_SUITE)
    for s in out["scenarios"]:
        assert [r["label"] for r in s["rows"]] == list(LADDER)
        assert s["full_efficiency"] >= 0.95, s["scenario"]
        assert all(r["efficiency"] <= 1.0 + 1e-9 for r in s["rows"])  # LB is a lower bound
    assert out["all_efficiency_at_least_target"] and out["min_full_efficiency"] >= 0.95
    assert "speedup over naive" in table and "2.49-3.34" in table and "2.44-2.85" in table


def test_paper_suite_ablation_ladder_is_monotone(paper):
    """Every ladder step is no slower than the one before, over the whole run (step 0's online profiling
    included) and after step 0, in every scenario, for every transition from naive on."""
    out, _ = paper
    chain = [label for label in LADDER if label != "colocated"]
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
