"""`python -m digenrl_verl.bench tcss`: its pair parsing, its per-arm comparison and its argument errors (the runs
themselves are the slow test `test_trainer_tcss_learning_on_cpu.py`'s, repeated over pairs)."""

from __future__ import annotations

import pytest

from digenrl_verl.bench import tcss


def _run(prompts, seed, arm, first, last):
    rewards = [first] * 3 + [last] * 3
    return {"prompts": prompts, "n": 4, "seed": seed, "arm": arm, "last3": last, "gain": last - first,
            "rewards": rewards}


def test_pairs_parse_and_bad_items_name_the_format():
    assert tcss.parse_pairs("2x4:42,4x4:1") == [(2, 4, 42), (4, 4, 1)]
    with pytest.raises(ValueError, match=r"'2x4'.*PROMPTSxN:SEED"):
        tcss.parse_pairs("2x4")


def test_compare_pairs_each_arm_with_the_on_policy_run_of_its_seed():
    runs = [_run(2, 42, "on", 0.50, 0.54), _run(2, 42, "clip", 0.50, 0.51), _run(2, 42, "decoupled", 0.50, 0.545),
            _run(2, 1, "on", 0.40, 0.42), _run(2, 1, "clip", 0.40, 0.40), _run(2, 1, "decoupled", 0.40, 0.41)]
    c = tcss.compare(runs)
    assert c["clip"]["gaps"] == [pytest.approx(0.02), pytest.approx(0.03)]  # pairs sorted by (prompts, n, seed)
    assert c["clip"]["gain_share"] == pytest.approx(0.01 / 0.06)
    assert c["decoupled"]["mean_gap"] == pytest.approx((0.01 - 0.005) / 2)
    assert c["decoupled"]["max_abs_gap"] == pytest.approx(0.01) and c["decoupled"]["pairs"] == 2
    assert "on" not in c


@pytest.mark.parametrize("argv, message", [(["--arms", "clip,decoupled"], "including on"),
                                           (["--arms", "on,ppo"], "ppo"),
                                           (["--steps", "4"], "--steps"),
                                           (["--pairs", "2:42"], "PROMPTSxN:SEED")])
def test_bad_arguments_fail_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit):
        tcss.main(argv)
    assert message in capsys.readouterr().err
