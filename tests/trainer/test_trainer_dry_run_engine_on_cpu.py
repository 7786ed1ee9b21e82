"""`rollout.name=vllm_omni` (verl-omni's rollout) on a machine without verl-omni: a dry run plans for the cluster
(on CPU verl-omni's in-process pipeline, `trainer.digenrl.generator_replicas` null), so it prints the plan with a line
naming the key and the reason; a real run stops with the key and the fixes named before any worker (or Ray) starts.
Issue 11 (c): 10 of verl-omni's 29 example scripts hit this."""

from __future__ import annotations

import warnings

import pytest

from digenrl_verl import main as entry
from digenrl_verl.engines.base import VLLM_OMNI
from digenrl_verl.main import EXIT_BAD_CONFIG, EXIT_OK, TINY_CPU, compose
from digenrl_verl.trainer.config import build_run

A = "actor_rollout_ref"
WHY = VLLM_OMNI.unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is None, reason="verl-omni is installed here: nothing to refuse")
ARGS = [f"{A}.rollout.name=vllm_omni", "trainer.digenrl.mode=disaggregated"]
LINE = f"{A}.rollout.name=vllm_omni: this machine cannot run verl-omni's rollout pipeline ({WHY})"


class _NoTrainer:
    def __init__(self, *args, **kwargs) -> None:
        raise AssertionError("a worker would start: the trainer was built")


def test_the_dry_run_plans_for_the_cluster_and_says_this_machine_cannot_run_it(tiny_flux_dir):
    cfg = compose([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", *ARGS, "trainer.digenrl.dry_run=true"])
    with pytest.warns(UserWarning, match=r"rollout\.name=vllm_omni: this machine cannot run verl-omni's rollout"):
        spec = build_run(cfg)
    assert spec.policy.engine.name == "verl_omni" and not spec.policy.engine.runs_here
    assert spec.train.recompute_old_log_probs  # planned as on the cluster: the engines' numerics differ
    assert any(d.startswith(f"{A}.rollout.name=vllm_omni on CPU (trainer.digenrl.generator_replicas=auto)")
               for d in spec.decisions), spec.decisions
    [line] = [d for d in spec.decisions if d.startswith(f"{A}.rollout.name=vllm_omni:")]
    assert line.startswith(LINE) and "a real run here stops before any worker starts" in line
    assert f"  - {line}" in spec.describe()


def test_the_dry_run_exits_0_and_prints_the_plan_with_that_line(tiny_flux_dir, capsys, monkeypatch):
    monkeypatch.setattr(entry, "DigenRLTrainer", _NoTrainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        code = entry.main([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", *ARGS, "trainer.digenrl.dry_run=true"])
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    assert "engines: generation verl_omni" in out and f"  - {LINE}" in out
    assert "dry run: config valid, no worker started" in out


def test_a_real_run_stops_naming_the_key_before_any_worker_starts(tiny_flux_dir, capsys, monkeypatch):
    monkeypatch.setattr(entry, "DigenRLTrainer", _NoTrainer)
    monkeypatch.setattr(entry, "connect_ray", _NoTrainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        code = entry.main([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", *ARGS])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_CONFIG
    assert err.startswith(f"digenrl: invalid config: {A}.rollout.name=vllm_omni cannot be used here: {WHY}"), err
    assert f"set {A}.rollout.name=diffusers" in err and "install verl-omni" in err
