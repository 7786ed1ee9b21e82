"""Advantages against the installed verl-omni a1139baf's own Flow-GRPO estimator, with T > 1 trained timesteps.

verl-omni's trainer expands each sample's reward over the T columns of its old_log_probs (`sample_level_rewards`
[B, T]) and `compute_advantage` -> `compute_flow_grpo_outcome_advantage` takes torch.std over that tensor (the
whole batch's with global_std, a group's [G, T] block without). Ours (`normalize_rewards`, T =
`AdvantageConfig.timesteps_per_sample`, the run's trained steps per sample) must give the same advantages. The
main-suite twin of the formula: tests/trainer/test_trainer_verl_omni_advantages_on_cpu.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

from verl import DataProto  # noqa: E402
from verl_omni.trainer.diffusion import ray_diffusion_trainer  # noqa: E402

from digenrl_verl.diffusion.advantages import AdvantageConfig, normalize_rewards  # noqa: E402
from digenrl_verl.main import TINY_CPU, compose  # noqa: E402
from digenrl_verl.trainer.config import build_run  # noqa: E402

# B = 9: two groups of 4 and a group of one sample (advantage 0 in both)
REWARDS = [0.1, 0.4, 0.35, 0.9, 0.2, 0.25, 0.7, 0.6, 0.5]
UIDS = ["a"] * 4 + ["b"] * 4 + ["c"]


def _verl_omni(t: int, global_std: bool) -> torch.Tensor:
    """verl-omni's advantages of REWARDS with T = t trained timesteps (its trainer's expand), column 0."""
    scores = torch.tensor(REWARDS, dtype=torch.float32)[:, None]
    batch = DataProto.from_dict({"sample_level_rewards": scores.expand(-1, t)},
                                non_tensors={"uid": np.array(UIDS, dtype=object)})
    batch = ray_diffusion_trainer.compute_advantage(batch, "flow_grpo", norm_adv_by_std_in_grpo=True,
                                                    global_std=global_std)
    adv = batch.batch["advantages"]
    assert adv.shape == (len(REWARDS), t) and bool((adv == adv[:, :1]).all())
    return adv[:, 0].double()


def _ours(t: int, global_std: bool) -> torch.Tensor:
    cfg = AdvantageConfig(global_std=global_std, adv_clip_max=None, timesteps_per_sample=t)
    return normalize_rewards(torch.tensor(REWARDS), UIDS, cfg).advantages.double()


@pytest.mark.parametrize("global_std", [True, False])
@pytest.mark.parametrize("t", [1, 3, 10])
def test_advantages_are_verl_omnis(global_std, t):
    theirs, ours = _verl_omni(t, global_std), _ours(t, global_std)
    print(f"T={t} global_std={global_std}\n verl-omni {theirs.tolist()}\n ours      {ours.tolist()}")
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)


def test_global_std_with_t_differs_from_the_std_over_the_rewards():
    """The case the fix is about: at T = 3 verl-omni's advantages are not those of the std over the B rewards."""
    assert not torch.allclose(_verl_omni(3, True), _ours(1, True), atol=1e-3)


@pytest.mark.parametrize("overrides", [["actor_rollout_ref.rollout.algo.sde_window_size=3"],
                                       ["algorithm.timestep_fraction=1.0"]])
def test_a_runs_advantages_are_verl_omnis(tiny_flux_dir, overrides):
    """A run's T is its trained steps per sample: the old_log_probs columns verl-omni's rollout records (the SDE
    window, else every step); build_run's advantage config gives verl-omni's advantages for that T."""
    run = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", "algorithm.global_std=true",
                             *overrides]))
    t = run.policy.rollout.num_train_steps
    assert run.advantage.timesteps_per_sample == t > 1
    cfg = AdvantageConfig(global_std=True, adv_clip_max=None, timesteps_per_sample=run.advantage.timesteps_per_sample)
    ours = normalize_rewards(torch.tensor(REWARDS), UIDS, cfg).advantages.double()
    assert torch.allclose(ours, _verl_omni(t, True), atol=1e-6, rtol=0)


def test_dance_grpo_ignores_the_std_keys_in_verl_omni_and_here(tiny_flux_dir):
    """verl-omni's compute_advantage with adv_estimator=dance_grpo and global_std / norm_adv_by_std_in_grpo False:
    the estimator runs on its defaults (the global std, divided by). A DanceGRPO run config with those keys False
    gives the same advantages here."""
    scores = torch.tensor(REWARDS, dtype=torch.float32)[:, None]
    batch = DataProto.from_dict({"sample_level_rewards": scores.expand(-1, 3)},
                                non_tensors={"uid": np.array(UIDS, dtype=object)})
    theirs = ray_diffusion_trainer.compute_advantage(batch, "dance_grpo", norm_adv_by_std_in_grpo=False,
                                                     global_std=False).batch["advantages"][:, 0].double()
    with pytest.warns(UserWarning, match="has no effect with algorithm.adv_estimator=dance_grpo"):
        run = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                                 "algorithm.adv_estimator=dance_grpo", "actor_rollout_ref.model.algorithm=dance_grpo",
                                 "actor_rollout_ref.actor.diffusion_loss.loss_mode=dance_grpo",
                                 "actor_rollout_ref.rollout.algo.sde_type=dance_sde", "algorithm.global_std=false",
                                 "algorithm.norm_adv_by_std_in_grpo=false"]))
    cfg = replace(run.advantage, adv_clip_max=None, timesteps_per_sample=3)
    ours = normalize_rewards(torch.tensor(REWARDS), UIDS, cfg).advantages.double()
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)
    assert torch.allclose(theirs, _verl_omni(3, True), atol=1e-6, rtol=0)  # = flow_grpo with the global std


#: rewards of two groups that differ in their 3rd-4th digit (the tiny Qwen-Image run's step 1, issue 30): r − mean
#: loses ~3e-5 of its value to float32's rounding of the mean, which verl-omni's advantages carry
CLOSE = [0.40530407428741455, 0.4075367748737335, 0.4070197641849518, 0.40891674160957336]
CLOSE_UIDS = ["p0", "p0", "p1", "p1"]


@pytest.mark.parametrize("t", [1, 2, 3])
def test_close_rewards_give_verl_omnis_advantages_bit_for_bit(t):
    """verl-omni computes the advantages in float32 (its reward tensor); with rewards this close its rounding moves
    them away from the exact (float64) ones by more than the equivalence with verl-omni's trainer allows (1e-5).
    Ours are its float32 values, bit for bit; the deferred global std's centred rewards are its r − mean, bit for
    bit, and their quotient by the step's σ + ε within 1e-7 of its advantages."""
    from digenrl_verl.diffusion.advantages import centred_rewards, step_scale

    scores = torch.tensor(CLOSE, dtype=torch.float32)[:, None].expand(-1, t).contiguous()
    uids = np.array(CLOSE_UIDS, dtype=object)
    theirs = ray_diffusion_trainer.compute_advantage(
        DataProto.from_dict({"sample_level_rewards": scores}, non_tensors={"uid": uids}), "flow_grpo"
    ).batch["advantages"][:, 0]
    cfg = AdvantageConfig(adv_clip_max=None, timesteps_per_sample=t)
    assert torch.equal(normalize_rewards(torch.tensor(CLOSE, dtype=torch.float64), CLOSE_UIDS, cfg).advantages, theirs)
    r64 = torch.tensor(CLOSE, dtype=torch.float64)
    exact = (r64 - r64.view(2, 2).mean(1).repeat_interleave(2)) / step_scale(CLOSE, cfg)
    drift = float((theirs.double() - exact).abs().max() / exact.abs().max())
    print(f"T={t}: verl-omni's float32 advantages {theirs.tolist()}, {drift:.1e} from the float64 ones")
    assert drift > 1e-6  # what the float64 arithmetic would lose
    centred = centred_rewards(dict(reversed(list(enumerate(CLOSE)))), CLOSE_UIDS, t)  # any order of arrival
    means = torch.stack([scores[:2].mean(), scores[2:].mean()]).repeat_interleave(2)  # verl-omni's [n, T] means
    assert [centred[i] for i in range(4)] == (scores[:, 0] - means).tolist()
    deferred = torch.tensor([centred[i] / step_scale(CLOSE, cfg) for i in range(4)], dtype=torch.float64)
    assert float((deferred - theirs.double()).abs().max() / theirs.abs().max()) < 1e-7
