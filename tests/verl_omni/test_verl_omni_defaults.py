"""verl-omni's defaults are the defaults: every key the shipped config shares with verl-omni's composed config (the
real verl-omni a1139baf, composed by Hydra as its entry point composes it) has verl-omni's value, but the few keys of
`config.verl_omni.NOT_VERL_OMNI_DEFAULTS`, whose listed verl-omni value is checked here too (and copies of them)."""

from __future__ import annotations

import importlib.util

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

from digenrl_verl.config.verl_omni import (NOT_VERL_OMNI_DEFAULTS, SAME_MEANING, _unresolved,  # noqa: E402
                                          leaf_keys, shipped_defaults)
from digenrl_verl.main import compose as compose_ours  # noqa: E402

ABSENT = object()
#: what the table may not hold (the issue's list: these always follow verl-omni)
NEVER_EXCEPTED = ("pipeline.height", "pipeline.width", "num_inference_steps", "dtype", "trainer.device",
                  "total_epochs", "total_training_steps", "optim.lr", "weight_decay", "target_modules", "seed",
                  "global_std", "norm_adv_by_std_in_grpo")


@pytest.fixture(scope="module")
def theirs() -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = importlib.util.find_spec("verl_omni").submodule_search_locations[0] + "/trainer/config"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name="diffusion_trainer")
    finally:
        GlobalHydra.instance().clear()


def _value(cfg: DictConfig, key: str):
    value = OmegaConf.select(cfg, key, default=ABSENT, throw_on_resolution_failure=False)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _copies_an_exception(cfg: DictConfig, key: str) -> bool:
    mine = _unresolved(cfg, key)
    return isinstance(mine, str) and "${" in mine and any(k in mine for k in NOT_VERL_OMNI_DEFAULTS)


def test_every_shared_default_is_verl_omnis(theirs):
    ours = compose_ours([])  # the shipped config as our entry point composes it (no preset)
    differ = {}
    for key in leaf_keys(shipped_defaults()):
        if key.startswith("trainer.digenrl") or key in NOT_VERL_OMNI_DEFAULTS or _copies_an_exception(ours, key):
            continue
        other = _value(theirs, key)
        if other is ABSENT:
            continue
        mine = _value(ours, key)
        if mine != other and SAME_MEANING.get(key) != (mine, other):
            differ[key] = (mine, other)
    assert not differ, f"shared keys whose default is not verl-omni's (ours, verl-omni's): {differ}"


def test_the_exceptions_table_states_verl_omnis_value_and_differs(theirs):
    ours = compose_ours([])
    wrong = {key: (listed, _value(theirs, key)) for key, (listed, _why) in NOT_VERL_OMNI_DEFAULTS.items()
             if _value(theirs, key) != listed and not (listed == "???" and _value(theirs, key) is ABSENT)}
    assert not wrong, f"key: (listed, verl-omni's): {wrong}"
    same = [key for key in NOT_VERL_OMNI_DEFAULTS if _value(ours, key) == _value(theirs, key)]
    assert not same, f"listed as not following verl-omni, yet equal: {same}"
    assert not [k for k in NOT_VERL_OMNI_DEFAULTS for part in NEVER_EXCEPTED if part in k]
