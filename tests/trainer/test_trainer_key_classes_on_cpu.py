"""Every key of the shipped config is implemented, no-effect (warned) or unsupported (rejected): nothing is ignored
silently; the shipped YAML agrees with the dataclass defaults."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
from omegaconf import DictConfig, OmegaConf

from digenrl_verl.config.digenrl import DigenRLConfig
from digenrl_verl.config.verl_omni import NO_EFFECT, UNSUPPORTED, RecipeKeys, covered_by, leaf_keys, shipped_defaults
from digenrl_verl.diffusion.loss import LossConfig
from digenrl_verl.models.config import LoraConfig
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer import config as trainer_config
from digenrl_verl.trainer.config import build_run
from digenrl_verl.workers.specs import OptimSpec


def _keys_read_by_build_run(model_dir, monkeypatch) -> set[str]:
    seen: list[RecipeKeys] = []
    real = trainer_config.RecipeKeys

    def recording(cfg):
        keys = real(cfg)
        seen.append(keys)
        return keys

    monkeypatch.setattr(trainer_config, "RecipeKeys", recording)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model_dir}",
                           "trainer.digenrl.mode=disaggregated"]))
    return seen[0].read


def test_every_shipped_key_is_implemented_no_effect_or_unsupported(tiny_flux_dir, monkeypatch):
    read = _keys_read_by_build_run(tiny_flux_dir, monkeypatch)
    classified = read | set(NO_EFFECT) | set(UNSUPPORTED)
    # entry-point keys read before build_run (main.resume_point) and interpolation sources
    classified |= {"trainer.resume_mode", "trainer.resume_from_path", "actor_rollout_ref.actor.rollout_n"}
    leaves = [k for k in leaf_keys(shipped_defaults()) if not k.startswith("defaults")]
    silent = [k for k in leaves if not covered_by(k, classified)]
    assert not silent, f"keys of the shipped config that nothing reads, warns about or rejects: {silent}"
    assert not set(NO_EFFECT) & (set(UNSUPPORTED) | read), "a key in two classes"


@pytest.fixture(scope="module")
def composed(tiny_flux_dir) -> DictConfig:
    """The tiny config, composed once for the module's per-key cases (each changes one key of a copy)."""
    return compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}"])


def _changed(key: str, default):
    """(key, value) that moves `key` off its shipped `default`: a new entry under a mapping, the other bool, a number
    + 3, a string otherwise."""
    if isinstance(default, DictConfig):
        return f"{key}.digenrl_probe", 1
    if isinstance(default, bool):
        return key, not default
    if isinstance(default, (int, float)):
        return key, default + 3
    return key, "probe_value"


@pytest.mark.parametrize("key", sorted(NO_EFFECT))
def test_each_no_effect_key_warns_by_name(key, composed):
    # the key set as a user's override sets it (Hydra's composition of overrides has its own tests: the recipes'
    # golden plans, the config tests); the config is composed once for the ~200 keys
    cfg = copy.deepcopy(composed)
    OmegaConf.update(cfg, *_changed(key, OmegaConf.select(shipped_defaults(), key)), merge=False, force_add=True)
    with pytest.warns(UserWarning, match=key.replace(".", r"\.") + ".*has no effect"):
        build_run(cfg)


def test_the_shipped_yaml_has_no_plugin_section_and_agrees_with_dataclass_defaults():
    yaml = shipped_defaults()
    assert "digenrl" not in yaml.trainer, "trainer.digenrl's defaults live only in Python (config/digenrl.py)"
    composed = compose([TINY_CPU])
    assert DigenRLConfig.from_node(composed.trainer.digenrl) == dataclasses.replace(
        DigenRLConfig(), output_dir=f"outputs/{composed.trainer.experiment_name}")
    a = "actor_rollout_ref"
    agree = {  # shipped key -> the dataclass default it must equal
        f"{a}.actor.optim.lr": OptimSpec().lr, f"{a}.actor.optim.weight_decay": OptimSpec().weight_decay,
        f"{a}.actor.optim.eps": OptimSpec().eps, f"{a}.actor.grad_clip": OptimSpec().grad_clip,
        f"{a}.actor.diffusion_loss.clip_ratio": LossConfig().clip_ratio,
        f"{a}.actor.kl_loss_type": LossConfig().kl_type,
        f"{a}.model.lora_rank": LoraConfig().rank, f"{a}.model.lora_alpha": LoraConfig().alpha,
        f"{a}.model.lora_init_weights": LoraConfig().init_weights,
    }
    for key, default in agree.items():
        assert OmegaConf.select(yaml, key) == default, key
    assert list(OmegaConf.select(yaml, f"{a}.actor.optim.betas")) == list(OptimSpec().betas)


def test_verl_omnis_rollout_correction_default_is_accepted_and_said(tiny_flux_dir):
    """bypass_mode=false (verl-omni's default: the trainer recomputes old log-probs) is what the diffusers fp32 path
    computes anyway: accepted, with a decision; an importance-sampling correction still fails by name."""
    spec = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                              "algorithm.rollout_correction.bypass_mode=false"]))
    assert any(d.startswith("algorithm.rollout_correction.bypass_mode=False") for d in spec.decisions)
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                   "algorithm.rollout_correction.rollout_is=token"])
    with pytest.raises(ValueError, match=r"algorithm\.rollout_correction\.rollout_is='token' is not supported"):
        build_run(cfg)


def test_a_key_absent_from_the_config_reads_as_the_shipped_files_value():
    """Builders give no literal defaults: a key missing from the config (deleted with `~key`) reads as the shipped
    config files' value, an explicit default still wins, and a key set to null stays null."""
    cfg = OmegaConf.create({"trainer": {"project_name": None}, "actor_rollout_ref": {"actor": {}}})
    keys = RecipeKeys(cfg)
    shipped = shipped_defaults()
    assert keys("trainer.experiment_name") == shipped.trainer.experiment_name
    assert keys.number("actor_rollout_ref.actor.kl_loss_coef") == shipped.actor_rollout_ref.actor.kl_loss_coef
    assert keys("trainer.logger") == OmegaConf.to_container(shipped.trainer.logger)
    assert keys("trainer.experiment_name", "mine") == "mine"
    assert keys("trainer.project_name") is None
    assert keys("trainer.no_such_key") is None
    assert {"trainer.experiment_name", "trainer.no_such_key"} <= keys.read
    cfg = compose([TINY_CPU, "~actor_rollout_ref.actor.kl_loss_coef"])
    assert RecipeKeys(cfg).number("actor_rollout_ref.actor.kl_loss_coef") == 0.001
    # a shipped `${...}` value resolves in the user's config, not in the shipped files
    cfg = compose([TINY_CPU, "~trainer.default_local_dir", "~algorithm.adv_estimator", "trainer.project_name=p",
                   "actor_rollout_ref.model.algorithm=dance_grpo"])
    assert RecipeKeys(cfg)("trainer.default_local_dir") == "checkpoints/p/tiny"
    assert RecipeKeys(cfg)("algorithm.adv_estimator") == "dance_grpo"
    assert not OmegaConf.is_readonly(shipped_defaults())
