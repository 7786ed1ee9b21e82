"""verl-omni's `actor_rollout_ref.rollout.val_kwargs` are applied to validation runs (n samples per prompt, their
steps, noise level / SDE kind and seed), reported as verl-omni reports them (verl's `process_validation_metrics`:
mean@n, std@n, best@k / worst@k; val-core / val-aux as verl-omni's `_val_metrics_update`, under the same names when
some rewards are non-finite), and bad values fail by name; with validation off they are not built and warn. The Ray
run of such a validation is in test_trainer_validation_on_cpu.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.runner import validation_metrics

A = "actor_rollout_ref"
V = f"{A}.rollout.val_kwargs"
VALIDATE = ["trainer.test_freq=2"]


def _build(model_dir, *overrides):
    return build_run(compose([TINY_CPU, f"{A}.model.path={model_dir}", *overrides]))


def test_defaults_are_verl_omnis_deterministic_sample_with_its_seed(tiny_flux_dir):
    run = _build(tiny_flux_dir, *VALIDATE)
    v = run.validation
    assert v.n == 1 and v.rollout.sde_type == "ode" and v.rollout.noise_level == 0.0
    assert v.rollout.seed == 42  # verl-omni's DiffusionSamplingConfig.seed
    assert v.rollout.num_inference_steps == 50  # the shipped val_kwargs.pipeline.num_inference_steps, verl-omni's
    [line] = [d for d in run.decisions if d.startswith("validation:")]
    assert "1 deterministic (ODE) sample(s) per prompt" in line and "mean@1" in line


def test_val_kwargs_are_applied_without_a_no_effect_warning(tiny_flux_dir):
    overrides = [*VALIDATE, f"{V}.n=4", f"{V}.pipeline.num_inference_steps=8", f"{V}.algo.noise_level=0.5",
                 f"+{V}.seed=7", f"{A}.rollout.algo.sde_type=cps"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _build(tiny_flux_dir, *overrides)
    assert not [str(w.message) for w in caught if "val_kwargs" in str(w.message)]
    v = run.validation
    assert v.n == 4 and v.rollout.num_inference_steps == 8 and v.rollout.noise_level == 0.5
    assert v.rollout.sde_type == "cps" and v.rollout.seed == 7  # val_kwargs.algo.sde_type follows the rollout's
    assert run.policy.rollout.num_inference_steps == 6 and run.policy.rollout.noise_level != 0.5  # training: as set
    [line] = [d for d in run.decisions if d.startswith("validation:")]
    assert "4 cps noise_level=0.5 sample(s) per prompt" in line and "8 steps, seed 7" in line and "mean@4" in line
    assert "verl-omni seeds every validation request with the seed alone" in line


def test_val_kwargs_the_samples_cannot_honour_warn_by_name(tiny_flux_dir):
    with pytest.warns(UserWarning, match=rf"{V}\.pipeline\.height=64 has no effect.*rollout's height"):
        run = _build(tiny_flux_dir, *VALIDATE, f"{V}.pipeline.height=64")
    assert run.validation.rollout.num_inference_steps == 50


@pytest.mark.parametrize("override,key", [(f"{V}.n=0", f"{V}.n"), (f"{V}.algo.noise_level=-1", f"{V}.algo.noise_level"),
                                          (f"{V}.pipeline.num_inference_steps=0", f"{V}.pipeline.num_inference_steps")])
def test_bad_val_kwargs_fail_by_name(tiny_flux_dir, override, key):
    with pytest.raises(ValueError) as err:
        _build(tiny_flux_dir, *VALIDATE, override)
    assert str(err.value).startswith(key), str(err.value)


# an SDE validation of 1 step cannot take the training rollout's window of 2 steps (training: 6 steps, fine)
WINDOW_TOO_WIDE = [f"{A}.rollout.algo.sde_window_size=2", f"{V}.pipeline.num_inference_steps=1",
                   f"{V}.algo.noise_level=0.5"]


def test_a_validation_the_training_window_does_not_fit_fails_naming_val_kwargs(tiny_flux_dir):
    with pytest.raises(ValueError) as err:
        _build(tiny_flux_dir, *VALIDATE, *WINDOW_TOO_WIDE)
    msg = str(err.value)
    assert msg.startswith(f"{V}.pipeline.num_inference_steps=1 with {V}.algo.noise_level=0.5"), msg
    assert "sde_window_size=2 is invalid" in msg and f"{V}.algo.noise_level=0" in msg, msg


def test_with_validation_off_val_kwargs_are_not_built_and_warn_by_name(tiny_flux_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _build(tiny_flux_dir, *WINDOW_TOO_WIDE, f"{V}.n=4", f"+{V}.seed=7")  # test_freq=-1, no val_before_train
    assert not run.validation.enabled and run.validation.rollout is None
    off = [str(w.message) for w in caught if "validation is off" in str(w.message)]
    for key in (f"{V}.n=4", f"{V}.pipeline.num_inference_steps=1", f"{V}.algo.noise_level=0.5", f"{V}.seed=7"):
        assert any(m.startswith(f"{key} has no effect") for m in off), (key, off)
    assert not [d for d in run.decisions if d.startswith("validation:")]
    with warnings.catch_warnings(record=True) as caught:  # left at the shipped values: nothing to say
        warnings.simplefilter("always")
        _build(tiny_flux_dir)
    assert not [str(w.message) for w in caught if "val_kwargs" in str(w.message)]


def test_an_sde_type_for_deterministic_validation_samples_warns(tiny_flux_dir):
    with pytest.warns(UserWarning, match=rf"{V}\.algo\.sde_type='cps' has no effect with {V}\.algo\.noise_level=0"):
        run = _build(tiny_flux_dir, *VALIDATE, f"{V}.algo.sde_type=cps")
    assert run.validation.rollout.sde_type == "ode"
    with warnings.catch_warnings(record=True) as caught:  # the rollout's sde_type, followed by val_kwargs: no warning
        warnings.simplefilter("always")
        _build(tiny_flux_dir, *VALIDATE, f"{A}.rollout.algo.sde_type=cps")
    assert not [str(w.message) for w in caught if "sde_type" in str(w.message)]


def test_metrics_are_verl_omnis_names_and_values():
    one = validation_metrics(["a", "a", "b"], ["p0", "p1", "p2"], [0.1, 0.3, 0.5], 1)
    assert one == pytest.approx({"val-core/a/reward/mean@1": 0.2, "val-core/b/reward/mean@1": 0.5,
                                 "val-aux/reward/nonfinite_samples": 0.0})
    four = validation_metrics(["a"] * 8, [f"p{i // 4}" for i in range(8)], [0.0, 0.2, 0.4, 0.6, 1.0, 1.0, 1.0, 1.0], 4)
    assert four["val-core/a/reward/mean@4"] == pytest.approx(0.65)
    assert four["val-aux/a/reward/std@4"] == pytest.approx(0.2236068 / 2)  # mean over prompts of each one's std
    assert {k for k in four if k.startswith("val-core/")} == {
        "val-core/a/reward/mean@4", "val-core/a/reward/best@4/mean", "val-core/a/reward/best@4/std"}
    assert {"val-aux/a/reward/best@2/mean", "val-aux/a/reward/worst@4/mean"} <= set(four)


def test_non_finite_rewards_keep_the_metric_names():
    """A NaN among a prompt's n rewards: the series stay @n (verl's own grouping would file that prompt under
    mean@(n - 1)); mean@n is over the source's finite rewards, the prompt is left out of std/best/worst."""
    sources, uids = ["a"] * 8 + ["b"] * 4, [f"p{i // 4}" for i in range(12)]
    clean = [0.0, 0.2, 0.4, 0.6, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    nan, inf = float("nan"), float("inf")
    broken = [0.0, nan, 0.4, 0.6, 1.0, 1.0, 1.0, 1.0, nan, inf, nan, nan]
    got, want = validation_metrics(sources, uids, broken, 4), validation_metrics(sources, uids, clean, 4)
    assert {k for k in got if "/a/" in k} == {k for k in want if "/a/" in k}  # same names, nothing at @3
    assert not [k for k in got if "@3" in k]
    assert got["val-core/a/reward/mean@4"] == pytest.approx(5.0 / 7)  # the 7 finite rewards of source a
    assert got["val-core/a/reward/best@4/mean"] == pytest.approx(1.0)  # p1 only: p0 has a NaN
    assert got["val-aux/a/reward/std@4"] == pytest.approx(0.0)
    assert np.isnan(got["val-core/b/reward/mean@4"])  # no finite reward: NaN, still logged under its name
    assert got["val-aux/reward/nonfinite_samples"] == 5.0
