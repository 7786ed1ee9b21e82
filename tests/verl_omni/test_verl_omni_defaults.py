"""The plan's "differences from verl-omni's defaults" (config.verl_omni.VERL_OMNI_DEFAULTS) against verl-omni's own
composed config: every value there is verl-omni's, and every key we implement whose shipped default differs from
verl-omni's is listed (so a recipe that leaves it out is told which default it gets instead)."""

from __future__ import annotations

import importlib.util

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

from digenrl_verl.config.verl_omni import (NO_EFFECT, NOT_DEFAULTS, VERL_OMNI_DEFAULTS, _unresolved,  # noqa: E402
                                          covered_by, leaf_keys, shipped_defaults)

ABSENT = object()


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


def test_each_listed_default_is_verl_omnis(theirs):
    wrong = {key: (value, _value(theirs, key)) for key, value in VERL_OMNI_DEFAULTS.items()
             if _value(theirs, key) != value}
    assert not wrong, f"key: (listed, verl-omni's): {wrong}"


def test_every_implemented_default_that_differs_from_verl_omnis_is_listed(theirs):
    ours = shipped_defaults()
    missing = {}
    for key in leaf_keys(ours):
        mine = _unresolved(ours, key)
        if covered_by(key, set(NO_EFFECT)) or key in NOT_DEFAULTS or (isinstance(mine, str) and "${" in mine):
            continue
        other = _value(theirs, key)
        if other is not ABSENT and other != mine and key not in VERL_OMNI_DEFAULTS:
            missing[key] = (mine, other)
    assert not missing, f"shipped defaults that differ from verl-omni's and are not printed by the plan: {missing}"
