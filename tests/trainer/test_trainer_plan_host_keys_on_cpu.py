"""plan.json shows every key that takes effect, whoever reads it: with verl-omni's actor worker training
(`trainer.digenrl.trainer_engine=verl_omni`), the keys that worker reads (`actor.fsdp_config.param_offload`,
`optimizer_offload`, its optimizer and loss keys) are the run's keys even where this package reads none of them."""

from __future__ import annotations

import warnings

from digenrl_verl.config.verl_omni import RecipeKeys, host_reads, warn_no_effect
from digenrl_verl.main import TINY_CPU, compose

A = "actor_rollout_ref"
OFFLOAD = (f"{A}.actor.fsdp_config.param_offload", f"{A}.actor.fsdp_config.optimizer_offload")


def _keys(tiny_flux_dir, *overrides) -> RecipeKeys:
    return RecipeKeys(compose([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", *overrides]))


def test_the_host_workers_keys_are_in_the_plan_on_its_engine(tiny_flux_dir):
    keys = _keys(tiny_flux_dir, f"{OFFLOAD[0]}=true", f"{OFFLOAD[1]}=true")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # read by verl-omni's worker: no "has no effect" warning
        warn_no_effect(keys, "verl_omni")
    resolved = keys.resolved()
    assert {k: resolved.get(k) for k in OFFLOAD} == dict.fromkeys(OFFLOAD, True)
    assert f"{A}.actor.optim.lr" in resolved and f"{A}.actor.diffusion_loss.loss_mode" in resolved
    assert all(host_reads(k) for k in resolved if k.startswith(f"{A}.actor.fsdp_config."))


def test_on_the_packages_trainer_they_have_no_effect_and_say_so(tiny_flux_dir):
    keys = _keys(tiny_flux_dir, f"{OFFLOAD[0]}=true")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warned = warn_no_effect(keys, "digenrl")
    assert OFFLOAD[0] in warned and any(OFFLOAD[0] in str(w.message) for w in caught)
    assert OFFLOAD[0] not in keys.resolved()
