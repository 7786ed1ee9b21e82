"""The plan's global-std decision (issue 32) by trainer engine: verl-omni's default global std is kept by the deferred
scaling on the package's trainer and on verl-omni's actor worker (``trainer.digenrl.trainer_engine=verl_omni``, whose
equivalence the verl-omni tier shows: tests/verl_omni/test_verl_omni_global_std_deferred.py); the KL term still
keeps the step barrier, named in the plan, on both."""

from __future__ import annotations

import pytest

from digenrl_verl.config.verl_omni import RecipeKeys, build_digenrl, build_layout, honour_global_std
from digenrl_verl.main import TINY_CPU, compose

A = "actor_rollout_ref"


def _decide(model_dir: str, engine: str, *overrides: str):
    keys = RecipeKeys(compose([TINY_CPU, f"{A}.model.path={model_dir}", "trainer.digenrl.mode=disaggregated",
                               "algorithm.global_std=true", *overrides]))
    digenrl, deferred = honour_global_std(keys, build_layout(keys, build_digenrl(keys)), engine)
    found = [d for d in keys.decisions if d.startswith("algorithm.global_std=True")]
    assert len(found) == 1, keys.decisions
    return digenrl, deferred, found[0]


@pytest.mark.parametrize("engine", ["digenrl", "verl_omni"])
def test_the_deferred_scaling_is_the_mode_on_both_trainer_engines(tiny_flux_dir, engine):
    digenrl, deferred, text = _decide(tiny_flux_dir, engine)
    assert deferred and digenrl.pipeline, text
    assert "applied by deferred scaling (exact)" in text
    assert ("on verl-omni's actor worker (trainer.digenrl.trainer_engine=verl_omni" in text) == (engine == "verl_omni")


@pytest.mark.parametrize("engine", ["digenrl", "verl_omni"])
def test_the_kl_term_keeps_the_barrier_and_names_the_key(tiny_flux_dir, engine):
    digenrl, deferred, text = _decide(tiny_flux_dir, engine, f"{A}.actor.use_kl_loss=true")
    assert not deferred and not digenrl.pipeline
    assert f"{A}.actor.use_kl_loss=true" in text and "algorithm.global_std=false" in text
