"""`trainer.digenrl.trainer_engine`: which trainer a run gets, and which keys are then verl-omni's to read.

With verl-omni's composed config handed over (`HostConfig`, a run from its entry point) `auto` is verl-omni's actor
worker, and the trainer-side features verl-omni's worker implements (VeOmni strategy, Ulysses SP, optimizer
overrides, offload, its loss modes) are accepted; on the package's own trainer they stay refused or warned by name.
What the verl-omni path cannot serve yet is refused naming the key. verl-omni itself is not needed here: its
presence is stood in for (`find_spec`), and no worker starts.
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run
from digenrl_verl.workers.specs import HostConfig

A = "actor_rollout_ref"
HOST = HostConfig(actor_rollout_ref={"actor": {"strategy": "fsdp2", "fsdp_config": {"model_dtype": "bf16"},
                                               "diffusion_loss": {"loss_mode": "flow_grpo", "clip_ratio": 0.2},
                                               "optim": {"lr": 1e-4}},
                                     "model": {"pipeline": {"height": 32, "width": 32}}})
#: trainer-side features the package's own trainer refuses (or ignores with a warning) and verl-omni's worker reads
HOST_FEATURES = [f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=2",
                 f"{A}.actor.optim.override_optimizer_config={{foreach: false}}",
                 f"{A}.actor.diffusion_loss.loss_mode=grpo_guard",
                 f"{A}.actor.fsdp_config.param_offload=true"]


@pytest.fixture
def verl_omni_present(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: object() if name == "verl_omni" else real(name, *a, **k))


def _build(model_dir, *overrides, host=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = build_run(compose([TINY_CPU, f"{A}.model.path={model_dir}", "trainer.digenrl.mode=disaggregated",
                                  *overrides]), host=host)
    return spec, [str(w.message) for w in caught]


def test_auto_is_verl_omnis_worker_from_its_entry_point_and_the_packages_otherwise(tiny_flux_dir, verl_omni_present):
    spec, _ = _build(tiny_flux_dir, host=HOST)
    assert spec.train.engine == "verl_omni" and spec.train.host_config is HOST.actor_rollout_ref
    assert any(d.startswith("trainer.digenrl.trainer_engine=verl_omni") for d in spec.decisions)
    assert "trainer verl-omni's actor worker (fsdp2, TSP engine" in spec.describe()
    assert spec.plan()["trainer_engine"] == "verl_omni"
    assert _build(tiny_flux_dir)[0].train.engine == "digenrl"
    assert _build(tiny_flux_dir, "trainer.digenrl.trainer_engine=digenrl", host=HOST)[0].train.engine == "digenrl"


@pytest.mark.parametrize("override", HOST_FEATURES)
def test_trainer_side_features_are_verl_omnis_on_its_worker(tiny_flux_dir, verl_omni_present, override):
    key = override.split("=")[0]
    try:  # the package's trainer: refused, or warned as without effect, naming the key
        _, said = _build(tiny_flux_dir, override)
        assert any(key in m for m in said), said
    except ValueError as e:
        assert key in str(e)
    spec, said = _build(tiny_flux_dir, override, host=HOST)  # verl-omni's worker reads it: accepted, not warned
    assert spec.train.engine == "verl_omni" and not any(key in m for m in said), said


@pytest.mark.parametrize("override,key", [
    (f"{A}.actor.use_kl_loss=true", f"{A}.actor.use_kl_loss"),
    (f"{A}.actor.diffusion_loss.loss_mode=diffusion_nft", f"{A}.actor.diffusion_loss.loss_mode"),
])
def test_what_the_path_cannot_serve_is_refused_by_name(tiny_flux_dir, verl_omni_present, override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        _build(tiny_flux_dir, override, f"{A}.actor.kl_loss_coef=0.1", host=HOST)


def test_verl_omni_without_its_config_or_its_package_names_the_fix(tiny_flux_dir, monkeypatch):
    with pytest.raises(ValueError, match="trainer.digenrl.trainer_engine=verl_omni.*entry point"):
        _build(tiny_flux_dir, "trainer.digenrl.trainer_engine=verl_omni")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "verl_omni" else real(name, *a, **k))
    assert _build(tiny_flux_dir, host=HOST)[0].train.engine == "digenrl"  # auto: the trainer that can run here
    with pytest.raises(ValueError, match="verl-omni is not installed"):
        _build(tiny_flux_dir, "trainer.digenrl.trainer_engine=verl_omni", host=HOST)
