"""Every registered benchmark runs from the command line at tiny sizes (issue 31): `python -m digenrl_verl.bench
<name> ... --json` in a fresh process, each phase it has included (e2e: its start-up phase and a ladder row), so a
change of defaults cannot break a benchmark silently. Figures are not checked here (speed goals live in the benches),
only that each run ends with the JSON object its docstring promises.

To add a benchmark: register it in `digenrl_verl.bench.BENCHMARKS` and add its tiny case to `SMOKE` below
(`test_every_registered_bench_has_a_smoke_case` fails until then).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import pytest

from digenrl_verl.bench import BENCHMARKS
from digenrl_verl.bench import driver as bench_driver
from digenrl_verl.bench.__main__ import main as bench_main


@dataclass(frozen=True)
class Smoke:
    argv: tuple[str, ...]  # after `python -m digenrl_verl.bench <name>`; `--json` is added
    check: Callable[[dict], None]  # asserts on the last line's JSON object
    timeout_s: float = 600.0


def _check_tsp(out: dict) -> None:
    assert out["per_step_ms"] > 0 and out["tsp_ms"] > 0 and out["grad_max_rel_err"] < 1e-3


def _check_bts(out: dict) -> None:
    assert out["rows"] and isinstance(out["headline"]["meets_target"], bool)


def _check_driver(out: dict) -> None:
    assert out["bench"] == "driver" and [r["actors"] for r in out["rows"]] == [4]
    assert len(out["load_avg"]) == 3 and out["headline"]["actors"] == 4
    for key in (*bench_driver.CEILING_KEYS, *bench_driver.RATIOS):
        assert out["headline"][key] == out["rows"][-1]["medians"][key]
    assert out["headline"]["target_tasks_per_s"] == 500.0 and isinstance(out["headline"]["meets_target"], bool)
    best = out["headline"]["best_vs_lane_ceiling_by_actors"]  # issue 31's goal: driver or leaders, every row
    assert best == {"4": max(out["rows"][0]["medians"]["vs_lane_ceiling"],
                             out["rows"][0]["medians"]["leaders_vs_lane_ceiling"])}
    assert out["headline"]["target_vs_lane_ceiling"] == 0.9
    assert out["headline"]["meets_vs_lane_target"] == (best["4"] >= 0.9)
    for r in out["rows"]:
        assert r["generators"] + r["trainers"] == r["actors"] and r["steps_measured"] == 1
        # one measured step: every micro-batch GEN + SCORE + UPDATE, then OPT_STEP and SYNC, all completed
        assert r["tasks"] == 3 * r["prompts_per_step"] + 2
        assert r["actor_calls"] >= r["tasks"] and r["decisions"] >= r["tasks"]
        assert r["tasks_per_s"] == pytest.approx(r["tasks"] / r["wall_s"])
        assert r["calls_per_task"] == pytest.approx(r["actor_calls"] / r["tasks"])
        # the ceilings were measured on the same actors: bare round trips, lanes of calls, compiled graphs
        assert min(r[k] for k in bench_driver.CEILING_KEYS) > 0
        # each ratio is taken within one run; the row is the run of median rate, `medians` over both runs
        assert len(r["runs"]) == 2 and r["repeat"] == 2
        for run in r["runs"]:
            for key, (rate, ceiling) in bench_driver.RATIOS.items():
                assert run[key] == pytest.approx(run[rate] / run[ceiling])
        assert r["medians"]["tasks_per_s"] == pytest.approx(sum(x["tasks_per_s"] for x in r["runs"]) / 2)
        assert r["tasks_per_s"] == min(x["tasks_per_s"] for x in r["runs"])  # the lower middle of two
        # the time accounting covers the wall time: its parts are non-negative and add up to it
        parts = [r[k] for k in bench_driver.TIME_KEYS]
        assert min(parts) >= 0 and sum(parts) == pytest.approx(r["wall_s"], rel=1e-6)
        assert set(r["shares"]) == set(bench_driver.TIME_KEYS)


def _check_e2e(out: dict) -> None:
    assert out["bench"] == "e2e" and [r["config"] for r in out["rows"]] == ["colocated-best", "digenrl"]
    for r in out["rows"]:
        assert r["samples_per_s"] > 0 and 0 < r["busy_utilisation"] <= 1.0 + 1e-6 and math.isfinite(r["reward_mean"])
        assert r["samples_per_worker_s"] == pytest.approx(r["samples_per_s"] / 2)
        phases = r["runs"][0]["startup"]
        for k in ("pools_s", "workers_ready_s", "first_step_s", "worker_boot_imports_s", "model_load_s",
                  "group_join_s"):
            assert k in phases and phases[k] >= 0, (k, phases)
    assert out["vs_colocated_best"] == pytest.approx(out["rows"][1]["samples_per_s"] / out["rows"][0]["samples_per_s"])
    assert out["vs_colocated_best_per_pass"] == [pytest.approx(out["vs_colocated_best"])]  # one pass: the same ratio
    assert out["vs_colocated_best_paired_median"] == pytest.approx(out["vs_colocated_best"])
    s = out["startup"]  # the start-up phase: the tiny demo (recipes/run_tiny_cpu.sh settings) and the reference
    assert len(s["demo_runs"]) == 1 and len(s["reference_runs"]) == 1
    assert s["demo_median"]["time_to_first_step_s"] > 0 and s["reference_median"]["time_to_first_step_s"] > 0


def _check_tcss(out: dict) -> None:
    assert out["bench"] == "tcss" and [r["arm"] for r in out["runs"]] == ["on", "clip"]
    assert "clip" in out["compare"]


def _check_global_std(out: dict) -> None:
    assert out["bench"] == "global_std" and [r["arm"] for r in out["runs"]] == ["per-group", "barrier", "deferred"]
    assert out["summary"]["barrier_over_deferred"] > 0 and out["runs"][1]["update_overlap"] == 0.0


def _check_rollout(out: dict) -> None:
    """The package's own engine (the main suite has no verl-omni; the tier runs verl-omni's engines against each other:
    tests/verl_omni/test_verl_omni_replica_engine.py)."""
    assert out["bench"] == "rollout" and out["baseline"] == "diffusers" and out["within_tolerance"] is None
    [row] = out["rows"]
    assert row["engine"] == "diffusers" and row["start_s"] > 0 and row["samples_per_s"] > 0 and row["update_s"] > 0
    assert len(row["round_s"]) == 1 and out["parity"] == {} and out["speedup"] == {}


SMOKE: dict[str, Smoke] = {
    "tsp": Smoke(("--repeats", "1", "--no-memory"), _check_tsp),
    "bts": Smoke(("--repeat", "1"), _check_bts, timeout_s=120),
    "driver": Smoke(("--actors", "4", "--steps", "2", "--n", "2", "--ceiling-s", "0.2", "--cgraph", "--repeat", "2"),
                    _check_driver),
    "e2e": Smoke(("--repeat", "1", "--steps", "2", "--warmup", "1", "--prompts", "2", "--num-inference-steps", "2",
                  "--only", "colocated-best", "digenrl", "--startup-repeat", "1"), _check_e2e, timeout_s=900),
    "tcss": Smoke(("--pairs", "2x2:0", "--arms", "on,clip", "--steps", "6"), _check_tcss, timeout_s=900),
    "global_std": Smoke(("--rounds", "1", "--steps", "2", "--warmup", "1", "--prompts", "2", "--n", "2"),
                        _check_global_std, timeout_s=900),
    "rollout": Smoke(("--engines", "diffusers", "--rounds", "1", "--samples", "2", "--steps", "3"), _check_rollout,
                     timeout_s=300),
}


def test_every_registered_bench_has_a_smoke_case():
    missing = sorted(set(BENCHMARKS) - set(SMOKE))
    assert not missing, (f"benchmarks {missing} are registered in digenrl_verl.bench.BENCHMARKS but have no tiny "
                         f"case in SMOKE ({__name__}): add one")
    extra = sorted(set(SMOKE) - set(BENCHMARKS))
    assert not extra, f"SMOKE names unregistered benchmarks {extra}"


def test_help_lists_every_registered_bench(capsys):
    assert bench_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in BENCHMARKS), out
    assert bench_main(["nope"]) == 2 and "valid names" in capsys.readouterr().err


@pytest.mark.slow  # a fresh process per bench; driver, e2e and tcss start Ray and workers, e2e runs the demo
@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_bench_runs_at_tiny_size(name):
    if name not in SMOKE:
        pytest.fail(f"bench {name!r} has no smoke case in SMOKE: add one")
    case = SMOKE[name]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "TORCH_COMPILE_DISABLE": "1"}
    env.pop("RAY_ADDRESS", None)  # its own Ray instance, as from a shell
    proc = subprocess.run([sys.executable, "-m", "digenrl_verl.bench", name, *case.argv, "--json"], env=env,
                          capture_output=True, text=True, timeout=case.timeout_s)
    assert proc.returncode == 0, f"bench {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines, f"bench {name} printed no JSON object:\n{proc.stdout[-2000:]}"
    case.check(json.loads(lines[-1]))
