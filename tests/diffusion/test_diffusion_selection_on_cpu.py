import os
import re
import subprocess
import sys

import pytest
import torch

from digenrl_verl.diffusion.noise import SampleKey, make_sample_generators, sample_seed
from digenrl_verl.diffusion.rollout import RolloutConfig
from digenrl_verl.diffusion.selection import SelectionConfig, plan_steps
from digenrl_verl.errors import ConfigError


def _keys(n, step=0, uid="p"):
    return [SampleKey(step, uid, i) for i in range(n)]


def _select(n, seed=0):
    return make_sample_generators(seed, _keys(n)).select


def test_flow_grpo_first_floor_n_f_in_order():
    cfg = SelectionConfig("flow_grpo", 10, 0.99)
    plan = plan_steps(cfg, _select(3))
    assert cfg.num_train_steps == 9
    assert plan.sde_mask.all()
    assert plan.train_steps.tolist() == [list(range(9))] * 3
    assert SelectionConfig("flow_grpo", 10, 0.7).num_train_steps == 7  # 0.7·10 is 7.000000000000001
    assert SelectionConfig("flow_grpo", 100, 0.29).num_train_steps == 29  # 0.29·100 is 28.999999999999996


def test_dance_grpo_random_permutation_of_all_but_last_per_sample():
    cfg = SelectionConfig("dance_grpo", 16, 0.6)
    plan = plan_steps(cfg, _select(8))
    assert plan.train_steps.shape == (8, 9)  # ⌊15·0.6⌋
    for row in plan.train_steps.tolist():
        assert len(set(row)) == 9 and max(row) <= 14 and min(row) >= 0
    assert len({tuple(r) for r in plan.train_steps.tolist()}) > 1  # per sample
    assert torch.equal(plan_steps(cfg, _select(8)).train_steps, plan.train_steps)  # from the seed
    assert not torch.equal(plan_steps(cfg, _select(8, seed=1)).train_steps, plan.train_steps)
    assert plan.sde_mask.all()


def test_window_start_uniform_in_range_and_ode_outside():
    cfg = SelectionConfig("window", 10, sde_window_size=2, sde_window_range=(0, 5))
    plan = plan_steps(cfg, _select(200))
    starts = plan.train_steps[:, 0]
    assert set(starts.tolist()) == {0, 1, 2, 3}
    assert torch.equal(plan.train_steps, starts[:, None] + torch.arange(2))
    expected = torch.zeros(200, 10, dtype=torch.bool)
    expected.scatter_(1, plan.train_steps, True)
    assert torch.equal(plan.sde_mask, expected)
    # default range is [0, N//2]
    default = plan_steps(SelectionConfig("window", 10, sde_window_size=3), _select(100))
    assert set(default.train_steps[:, 0].tolist()) == {0, 1, 2}


def test_window_zero_means_sde_on_all_but_last():
    plan = plan_steps(SelectionConfig("window", 6, sde_window_size=0), _select(2))
    assert plan.sde_mask.tolist() == [[True] * 5 + [False]] * 2
    assert plan.train_steps.tolist() == [list(range(5))] * 2


@pytest.mark.parametrize("kwargs,key,hint", [
    (dict(mode="window", sde_window_size=11), "sde_window_size", "valid range: 0..10"),
    (dict(mode="window", sde_window_size=3, sde_window_range=(0, 2)), "sde_window_size", "at most 2"),
    (dict(mode="window", sde_window_size=1, sde_window_range=(4, 12)), "sde_window_range", "r1"),
    (dict(mode="flow_grpo", timestep_fraction=0.0), "timestep_fraction", r"\(0, 1\]"),
    (dict(mode="dance_grpo", timestep_fraction=1.5), "timestep_fraction", r"\(0, 1\]"),
    (dict(mode="flow_grpo", timestep_fraction=0.05), "timestep_fraction", "trains no step"),
    (dict(mode="mix"), "timestep_selection", "dance_grpo"),
])
def test_selection_validation_names_the_field(kwargs, key, hint):
    """Components name their fields; the config layer names the user's keys (ConfigError.keyed)."""
    with pytest.raises(ConfigError) as err:
        SelectionConfig(num_inference_steps=10, **kwargs)
    assert err.value.path == key and str(err.value).startswith(key + "=")
    assert re.search(hint, str(err.value)), str(err.value)
    keyed = str(err.value.keyed({key: f"some.section.{key}", "num_inference_steps": "pipe.steps"}))
    assert keyed.startswith(f"some.section.{key}=") and "{" not in keyed


def test_rollout_config_validation():
    with pytest.raises(ValueError, match=r"sde_type='flow'.*\['cps', 'dance'"):
        RolloutConfig(sde_type="flow")
    with pytest.raises(ValueError, match=r"noise_level=0.0 is invalid: must be > 0 for sde_type='sde'"):
        RolloutConfig(sde_type="sde", noise_level=0.0)
    with pytest.raises(ValueError, match="sde_window_size=20"):
        RolloutConfig(timestep_selection="window", sde_window_size=20)
    assert RolloutConfig(sde_type="ode", noise_level=0.0).num_train_steps == 0
    assert RolloutConfig(sde_type="dance_sde", timestep_selection="window", sde_window_size=2).num_train_steps == 2


def test_seeds_are_distinct_per_key_and_stream_and_shared_per_group():
    k = SampleKey(3, "uid-7", 1)
    seeds = {sample_seed(0, k, s) for s in ("init", "sde", "select")}
    assert len(seeds) == 3
    assert sample_seed(0, k, "sde") != sample_seed(0, SampleKey(3, "uid-7", 2), "sde")
    assert sample_seed(0, k, "sde") != sample_seed(0, SampleKey(4, "uid-7", 1), "sde")
    assert sample_seed(0, k, "sde") != sample_seed(1, k, "sde")
    assert sample_seed(0, k, "init", shared_group=True) == sample_seed(0, SampleKey(3, "uid-7", 5), "init",
                                                                       shared_group=True)
    gens = make_sample_generators(0, [SampleKey(0, "a", 0), SampleKey(0, "a", 1), SampleKey(0, "b", 0)],
                                  init_same_noise=True)
    draws = [torch.randn(4, generator=g) for g in gens.init]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    sde = [torch.randn(4, generator=g) for g in gens.sde]
    assert not torch.equal(sde[0], sde[1])
    with pytest.raises(ValueError, match="valid"):
        sample_seed(0, k, "noise")


@pytest.mark.slow  # fresh interpreters
def test_seed_is_stable_across_processes():
    code = ("from digenrl_verl.diffusion.noise import SampleKey, sample_seed;"
            "print(sample_seed(42, SampleKey(7, 'prompt-x', 3), 'sde'))")
    outs = set()
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout.strip())
    assert outs == {str(sample_seed(42, SampleKey(7, "prompt-x", 3), "sde"))}


def test_auto_selection_follows_the_config_defaults():
    from digenrl_verl.diffusion.selection import auto_selection

    assert auto_selection("flow_grpo", 2) == "window"
    assert auto_selection("dance_grpo", None) == "dance_grpo"
    assert auto_selection("flow_grpo", None) == "flow_grpo"
