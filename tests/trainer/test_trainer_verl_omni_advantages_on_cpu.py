"""Advantages as verl-omni computes them when a sample trains T > 1 timesteps (issue 21).

verl-omni's Flow-GRPO estimator takes its stds over the [B, T] `sample_level_rewards` (each sample's reward
repeated over its T trained timesteps) with Bessel's correction, so its global std is the std over the B rewards
times sqrt(T(B-1)/(BT-1)), and a group's std likewise over G x T elements. The run's T is its trained steps per
sample. The comparison with verl-omni's own code: tests/verl_omni/test_verl_omni_advantages.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from digenrl_verl.diffusion.advantages import AdvantageConfig, normalize_rewards
from digenrl_verl.errors import ConfigError
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run

REWARDS = torch.tensor([0.1, 0.4, 0.35, 0.9, 0.2, 0.25, 0.7, 0.6], dtype=torch.float64)  # B = 8
UIDS = ["a"] * 4 + ["b"] * 4


def _adv(t: int, global_std: bool = True) -> torch.Tensor:
    cfg = AdvantageConfig(global_std=global_std, adv_clip_max=None, timesteps_per_sample=t)
    return normalize_rewards(REWARDS, UIDS, cfg).advantages.double()


def _expanded_std(x: torch.Tensor, t: int) -> float:
    """torch.std of the [n, T] tensor of `x` repeated over T columns (verl-omni's rows)."""
    return float(x[:, None].expand(-1, t).std())


@pytest.mark.parametrize("global_std", [True, False])
def test_std_is_over_the_b_x_t_elements(global_std):
    t = 3
    centred = REWARDS.clone()
    for g in ("a", "b"):
        rows = torch.tensor([u == g for u in UIDS])
        centred[rows] -= REWARDS[rows].mean()
    if global_std:
        want = centred / (_expanded_std(REWARDS, t) + 1e-4)
    else:
        want = centred.clone()
        for g in ("a", "b"):
            rows = torch.tensor([u == g for u in UIDS])
            want[rows] = centred[rows] / (_expanded_std(REWARDS[rows], t) + 1e-4)
    assert torch.allclose(_adv(t, global_std), want, atol=1e-6)


def test_global_std_ratio_at_b8_t3():
    b, t = 8, 3
    ratio = _adv(t) / _adv(1)
    want = math.sqrt((b * t - 1) / ((b - 1) * t))
    assert want == pytest.approx(1.0465, abs=1e-4)
    nonzero = _adv(1).abs() > 1e-9
    assert torch.allclose(ratio[nonzero], torch.full_like(ratio[nonzero], want), rtol=1e-4)


def test_timesteps_per_sample_must_be_positive():
    with pytest.raises(ConfigError, match="timesteps_per_sample"):
        AdvantageConfig(timesteps_per_sample=0)


@pytest.mark.parametrize("overrides, k", [([], 5),  # tiny_cpu: 6 steps x timestep_fraction 0.99 -> 5
                                          (["actor_rollout_ref.rollout.algo.sde_window_size=2"], 2),
                                          (["algorithm.timestep_fraction=0.5"], 3)])
def test_the_run_weights_rewards_by_its_trained_steps(tiny_flux_dir, overrides, k):
    run = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", *overrides]))
    assert run.policy.rollout.num_train_steps == k
    assert run.advantage.timesteps_per_sample == k


def test_dance_grpo_advantages_always_use_the_global_std_as_verl_omni(tiny_flux_dir):
    """verl-omni's compute_advantage passes global_std / norm_adv_by_std_in_grpo to the flow_grpo estimator only:
    DanceGRPO runs the same estimator on its defaults. Set otherwise, the keys are warned about by name, and the
    disaggregated plan keeps the global std by the deferred scaling (issue 32: pipelined, the optimizer step waits)."""
    base = [TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", "algorithm.adv_estimator=dance_grpo",
            "actor_rollout_ref.model.algorithm=dance_grpo",
            "actor_rollout_ref.actor.diffusion_loss.loss_mode=dance_grpo",
            "actor_rollout_ref.rollout.algo.sde_type=dance_sde", "trainer.digenrl.mode=disaggregated",
            "algorithm.global_std=false", "algorithm.norm_adv_by_std_in_grpo=false"]
    with pytest.warns(UserWarning, match=r"algorithm\.global_std=False has no effect with algorithm\.adv_estimator="
                                         r"dance_grpo") as caught:
        run = build_run(compose(base))
    assert any("norm_adv_by_std_in_grpo=False has no effect" in str(w.message) for w in caught)
    assert run.advantage.global_std is True and run.advantage.norm_adv_by_std is True
    assert run.digenrl.pipeline is True and run.advantage.deferred_std and run.schedule.opt_waits_for_step
    flow = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", "algorithm.global_std=false",
                              "trainer.digenrl.mode=disaggregated"]))
    assert flow.advantage.global_std is False and flow.digenrl.pipeline is True  # flow_grpo: the key is followed


def test_a_timestep_fraction_below_one_is_a_decision_naming_verl_omnis_rule(tiny_flux_dir):
    """verl-omni's Flow-GRPO / DanceGRPO train every step whatever algorithm.timestep_fraction says (its
    _select_train_timesteps serves DiffusionNFT only); below 1 this package trains the first floor(N*f), as
    Flow-GRPO's reference code does, and the plan says so. At verl-omni's default 1.0 there is nothing to say."""
    def decisions(*extra):
        run = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", *extra]))
        return [d for d in run.decisions if d.startswith("algorithm.timestep_fraction")]

    assert decisions()[0].startswith("algorithm.timestep_fraction=0.99: 5 of the 6 steps are trained")
    assert "verl-omni reads this key for DiffusionNFT only" in decisions()[0]
    assert decisions("algorithm.timestep_fraction=1.0") == []
