"""`trainer.digenrl.tcss.objective` / `tcss.is_cap` reach the trainers' loss (`TrainSpec.loss.stale_is_cap`), are
printed in the plan of a TCSS run, and bad values fail naming the key before any worker starts."""

from __future__ import annotations

import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run

TCSS = ("trainer.digenrl.mode=disaggregated", "trainer.digenrl.tcss.staleness=1")


def _build(model_dir, *overrides):
    return build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model_dir}", *overrides]))


def test_the_objective_reaches_the_loss_and_the_plan(tiny_flux_dir):
    run = _build(tiny_flux_dir, *TCSS)
    assert run.train.loss.stale_is_cap == 5.0  # the default: decoupled, cap 5
    assert "stale rows: decoupled, is_cap=5.0" in run.describe()
    run = _build(tiny_flux_dir, *TCSS, "trainer.digenrl.tcss.is_cap=2.5")
    assert run.train.loss.stale_is_cap == 2.5
    run = _build(tiny_flux_dir, *TCSS, "trainer.digenrl.tcss.objective=clip")
    assert run.train.loss.stale_is_cap is None
    assert "stale rows: clipped against the behaviour policy" in run.describe()
    assert "stale rows" not in _build(tiny_flux_dir, "trainer.digenrl.mode=disaggregated").describe()  # no TCSS


@pytest.mark.parametrize("override, words", [("trainer.digenrl.tcss.objective=ppo", ["'ppo'", "decoupled", "clip"]),
                                             ("trainer.digenrl.tcss.is_cap=1.0", ["1.0", "> 1"])])
def test_bad_values_name_the_key(tiny_flux_dir, override, words):
    with pytest.raises(ValueError) as e:
        _build(tiny_flux_dir, *TCSS, override)
    assert override.split("=")[0] in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_cap_without_the_decoupled_objective_warns_by_name(tiny_flux_dir):
    with pytest.warns(UserWarning, match=r"tcss\.is_cap=3\.0 has no effect with tcss\.objective=clip"):
        _build(tiny_flux_dir, *TCSS, "trainer.digenrl.tcss.objective=clip", "trainer.digenrl.tcss.is_cap=3")
