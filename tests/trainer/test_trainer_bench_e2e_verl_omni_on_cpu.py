"""`python -m digenrl_verl.bench e2e --baseline verl_omni` without verl-omni: its help, its refusal naming the fix, and
its pieces that need no run (the command lines, verl's console metrics, the comparison, the JSON's shape). The runs
themselves: tests/verl_omni/test_verl_omni_flag_equals_stock_on_cpu.py (its fixture runs this bench)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from digenrl_verl.bench import e2e
from digenrl_verl.bench import e2e_verl_omni as bench

STOCK = ["data.train_files=/d/train.parquet", "data.val_files=/d/test.parquet", "data.train_batch_size=2",
         "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.model.path=/d/model", "trainer.test_freq=30",
         "trainer.total_training_steps=1", "reward.custom_reward_function.path=/d/genrm_ocr.py"]


def test_e2e_hands_baseline_verl_omni_to_its_module(capsys):
    with pytest.raises(SystemExit):
        e2e.main(["--baseline", "verl_omni", "--help"])
    assert "--flag-pythonpath" in capsys.readouterr().out
    assert e2e._baseline(["--steps", "2", "--baseline", "verl_omni", "--json"]) == ("verl_omni", ["--steps", "2",
                                                                                                   "--json"])
    assert e2e._baseline(["--steps", "2"]) == ("ladder", ["--steps", "2"])
    with pytest.raises(SystemExit):  # argparse's error, naming the option
        bench.main(["--repeat", "0"])
    assert "--repeat 0: each must be >= 1" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("verl_omni") is not None, reason="verl-omni is installed here")
def test_without_verl_omni_the_baseline_is_refused_naming_the_fix(capsys):
    assert e2e.main(["--baseline", "verl_omni", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--baseline verl_omni needs verl-omni a1139baf" in err and "scripts/test_verl_omni.sh" in err
    assert "$VERL_OMNI_PY -m digenrl_verl.bench e2e --baseline verl_omni" in err


def test_the_stock_command_line_keeps_the_recipes_order_and_validates_last(tmp_path):
    argv = bench.stock_argv(STOCK, tmp_path, 3)
    assert argv[:len(STOCK)] == [*STOCK[:5], "trainer.test_freq=3", "trainer.total_training_steps=3", STOCK[7]]
    assert f"trainer.default_local_dir={tmp_path / 'checkpoints'}" in argv and set(bench.SAME) - {
        "trainer.test_freq=-1"} <= set(argv)
    assert bench.shared_files(argv) == [STOCK[0], STOCK[1], STOCK[4], STOCK[7]]
    assert bench.value(argv, "trainer.test_freq") == "3"


def test_verls_console_step_lines_are_read_as_numbers():
    console = ("noise\n(TaskRunner pid=1) step:1 - critic/rewards/mean:0.5 - actor/grad_norm:np.float64(0.25) - "
               "timing_s/step:12.5\nstep:2 - actor/loss:-1.5e-03 - timing_s/step:10.0\n")
    assert bench.console_steps(console) == {1: {"critic/rewards/mean": 0.5, "actor/grad_norm": 0.25,
                                                "timing_s/step": 12.5},
                                            2: {"actor/loss": -1.5e-3, "timing_s/step": 10.0}}


def test_worst_and_metric_errors():
    theirs = {"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([4.0])}
    ours = {"a": torch.tensor([1.0, -2.002]), "b": torch.tensor([4.0])}
    err, name = bench.worst(ours, theirs)
    assert name == "a" and err == pytest.approx(1e-3, rel=1e-3)
    with pytest.raises(ValueError, match="only ours"):
        bench.worst({**ours, "c": torch.zeros(1)}, theirs)
    a = {k: 1.0 for k in bench.METRICS} | {"critic/advantages/max": 2.0, "actor/loss": 0.0}
    errors = bench.metric_errors(a, {**a, "actor/loss": 1e-6})
    assert errors["actor/loss"] == pytest.approx(5e-7) and max(e for k, e in errors.items() if k != "actor/loss") == 0


def _pass(stock_s: float, flag_s: float, err: float) -> dict:
    def run(step_s, wall_s):
        return {"out": "/x", "argv": bench.stock_argv(STOCK, Path("/x"), 3), "wall_s": wall_s,
                "step_s": [step_s] * 3, "step_s_median": step_s, "testing_s": 0.0}

    return {"stock": run(stock_s, 10 * stock_s), "flag": run(flag_s, 10 * flag_s), "max_weight_rel_err": err,
            "max_metric_rel_err": 0.0, "per_step": [],
            "reward_curves": {"stock": [0.40, 0.41, 0.42], "flag": [0.40, 0.43, 0.44]}}


def test_the_json_has_medians_speedups_and_the_worst_error():
    cfg = bench.BenchConfig(steps=3, repeat=3)
    out = bench.summarise([_pass(4.0, 2.0, 1e-6), _pass(6.0, 2.0, 3e-6), _pass(5.0, 4.0, 2e-6)], cfg)
    stock, flag = out["rows"]
    assert (stock["run"], stock["step_s"], stock["wall_s"], flag["step_s"]) == ("stock", 5.0, 50.0, 2.0)
    assert out["speedup"] == {"step_s": 2.5, "wall_s": 2.5}
    assert out["speedup_per_pass"]["step_s"] == [2.0, 3.0, 1.25] and out["speedup_paired_median"]["step_s"] == 2.0
    assert out["max_weight_rel_err"] == 3e-6 and out["within_tolerance"] is True
    assert out["baseline_name"] == bench.BASELINE and out["config"]["prompts_per_step"] == 2
    assert "speedup a/b: step 2.50x" in bench.table(out)


def test_staleness_one_runs_the_flag_ahead_and_reports_the_reward_curves(tmp_path):
    """`--staleness 1` (issue 30 item 2): (b)'s command line is the on-policy one plus TCSS staleness 1; its weights
    are not held to (a)'s (`within_tolerance` null) and the table shows both reward curves."""
    on = bench.flag_argv(STOCK, tmp_path, 3)
    ahead = bench.flag_argv(STOCK, tmp_path, 3, staleness=1)
    assert "trainer.digenrl.tcss.staleness=0" in on
    assert ahead == [a.replace("tcss.staleness=0", "tcss.staleness=1") for a in on]
    assert bench.ahead_overrides(20, 1) == ["trainer.save_freq=20"] and bench.ahead_overrides(20, 0) == []
    out = bench.summarise([_pass(4.0, 2.0, 0.3)], bench.BenchConfig(steps=3, repeat=1, staleness=1))
    assert out["staleness"] == 1 and out["within_tolerance"] is None
    assert "critic/rewards/mean by step, pass 1 ((b) at staleness 1): stock 0.4000 0.4100 0.4200; flag 0.4000 " \
           "0.4300 0.4400" in bench.table(out)
    with pytest.raises(ValueError, match="--staleness 2"):
        bench.BenchConfig(staleness=2)
