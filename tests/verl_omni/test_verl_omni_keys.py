"""Every key of verl-omni's own diffusion trainer config is known to digenrl_verl: it composes on our entry point
(no Hydra `+` advice) and is implemented (a builder reads it), no-effect (warned) or unsupported (rejected)."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

from omegaconf import DictConfig, OmegaConf  # noqa: E402

from digenrl_verl.config.verl_omni import (MODEL_ENGINES, NO_EFFECT, UNSUPPORTED, RecipeKeys,  # noqa: E402
                                          covered_by, leaf_keys)
from digenrl_verl.main import TINY_CPU, compose  # noqa: E402
from digenrl_verl.trainer import config as trainer_config  # noqa: E402
from digenrl_verl.trainer.config import build_run  # noqa: E402

# read by the entry point before build_run (main.resume_point), or copies of other keys (interpolations)
ENTRY_POINT_KEYS = {"trainer.resume_mode", "trainer.resume_from_path", "actor_rollout_ref.actor.rollout_n"}


def verl_omni_config(engine: str = "dp_diffusion") -> DictConfig:
    """verl-omni's diffusion trainer config, composed as its entry point does (Hydra, the package's config dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = importlib.util.find_spec("verl_omni").submodule_search_locations[0] + "/trainer/config"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return hydra_compose(config_name="diffusion_trainer", overrides=[f"diffusion/model_engine={engine}"])
    finally:
        GlobalHydra.instance().clear()


def has(cfg: DictConfig, dotted: str) -> bool:
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node.keys():
            return False
        node = node._get_node(part)
    return True


@pytest.fixture(scope="module")
def read_keys(tiny_flux_dir) -> set[str]:
    seen: list[RecipeKeys] = []
    real = trainer_config.RecipeKeys

    def recording(cfg):
        seen.append(real(cfg))
        return seen[-1]

    mp = pytest.MonkeyPatch()
    mp.setattr(trainer_config, "RecipeKeys", recording)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                               "trainer.digenrl.mode=disaggregated"]))
    finally:
        mp.undo()
    return seen[0].read | ENTRY_POINT_KEYS


@pytest.mark.parametrize("engine", MODEL_ENGINES)
def test_every_verl_omni_key_composes_on_our_entry_point(engine):
    ours = compose([TINY_CPU, f"diffusion/model_engine={engine}"])
    theirs = leaf_keys(verl_omni_config(engine))
    missing = [k for k in theirs if not has(ours, k)]
    assert not missing, f"verl-omni keys our config lacks (a recipe setting one gets Hydra's '+' advice): {missing}"
    assert ours.model_engine == engine


@pytest.mark.parametrize("engine", MODEL_ENGINES)
def test_every_verl_omni_key_is_implemented_no_effect_or_unsupported(engine, read_keys):
    keys = leaf_keys(verl_omni_config(engine))
    classes = {"implemented": read_keys, "unsupported": set(UNSUPPORTED), "no effect": set(NO_EFFECT)}
    counts = {name: 0 for name in classes}
    silent = []
    for key in keys:
        name = next((n for n, members in classes.items() if covered_by(key, members)), None)
        if name is None:
            silent.append(key)
        else:
            counts[name] += 1
    print(f"verl-omni a1139baf, model_engine={engine}: {len(keys)} leaf keys: " +
          ", ".join(f"{v} {k}" for k, v in counts.items()))
    assert not silent, f"verl-omni keys that nothing reads, warns about or rejects: {silent}"


def test_the_veomni_engine_is_rejected_by_name(tiny_flux_dir):
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                   "diffusion/model_engine=veomni_diffusion"])
    with pytest.raises(ValueError, match=r"model_engine='veomni_diffusion' is not supported"):
        build_run(cfg)


def test_verl_omni_defaults_we_copied_are_verl_omnis():
    """The keys we carry only for verl-omni (verl_omni_keys.yaml) hold verl-omni's own default values."""
    from importlib import resources

    from digenrl_verl.config.verl_omni import VERL_OMNI_KEYS_FILE, _unresolved

    VEOMNI_ONLY = tuple(f"actor_rollout_ref.{k}" for k in ("ref.optim", "actor.optim.lr_min", "actor.optim.lr_start",
                                                             "actor.optim.lr_decay_ratio", "actor.optim.fused"))

    ours = OmegaConf.create(resources.files("digenrl_verl.config").joinpath(VERL_OMNI_KEYS_FILE).read_text())
    theirs = {e: verl_omni_config(e) for e in MODEL_ENGINES}
    differ = []
    for key in leaf_keys(ours):
        engine = "veomni_diffusion" if ".veomni_config" in key or key.startswith(VEOMNI_ONLY) else "dp_diffusion"
        if isinstance(_unresolved(ours, key), str) and "${" in _unresolved(ours, key):
            continue  # a copy of another key, as in verl-omni
        mine = OmegaConf.select(ours, key, throw_on_resolution_failure=False)
        want = OmegaConf.select(theirs[engine], key, throw_on_resolution_failure=False)
        mine = OmegaConf.to_container(mine) if isinstance(mine, DictConfig) else mine
        want = OmegaConf.to_container(want, resolve=True) if isinstance(want, DictConfig) else want
        if isinstance(want, dict):
            want = {k: v for k, v in want.items() if k != "_target_"}
        if hasattr(mine, "__iter__") and not isinstance(mine, (str, dict)):
            mine, want = list(mine), list(want or [])
        if mine != want:
            differ.append((key, mine, want))
    assert not differ, differ
