"""Model-agnostic diffusion RL math (torch, fp32), talking to models only through `DiffusionAdapter`.

    sde         one reverse step + log-prob: `sde_step` (kinds sde, cps, dance/dance_sde, ode)
    noise       per-sample deterministic generators: `SampleKey`, `make_sample_generators`
    selection   which steps use the SDE / are trained: `SelectionConfig`, `plan_steps`
    rollout     sample trajectories: `RolloutConfig`, `rollout` → `Trajectory`
    advantages  group-normalised advantages: `AdvantageConfig`, `normalize_rewards`, `combine_rewards`
    loss        clipped objective + KL, step-level normalisation: `LossConfig`, `policy_loss`, `LossStats`
    tsp         micro-batch training pass: `TSPConfig`, `accumulate_gradients`, `compute_log_probs`
"""

from digenrl_verl.diffusion.advantages import AdvantageConfig, AdvantageResult, combine_rewards, normalize_rewards
from digenrl_verl.diffusion.loss import LossConfig, LossStats, policy_loss
from digenrl_verl.diffusion.noise import SampleGenerators, SampleKey, make_sample_generators, sample_seed
from digenrl_verl.diffusion.rollout import RolloutConfig, Trajectory, make_plan, rollout
from digenrl_verl.diffusion.sde import StepOutput, get_sde_kind, register_sde_kind, sde_kinds, sde_step
from digenrl_verl.diffusion.selection import SelectionConfig, StepPlan, auto_selection, plan_steps
from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients, compute_log_probs

__all__ = [
    "AdvantageConfig",
    "AdvantageResult",
    "LossConfig",
    "LossStats",
    "RolloutConfig",
    "SampleGenerators",
    "SampleKey",
    "SelectionConfig",
    "StepOutput",
    "StepPlan",
    "TSPConfig",
    "Trajectory",
    "accumulate_gradients",
    "auto_selection",
    "combine_rewards",
    "compute_log_probs",
    "get_sde_kind",
    "make_plan",
    "make_sample_generators",
    "normalize_rewards",
    "plan_steps",
    "policy_loss",
    "register_sde_kind",
    "rollout",
    "sample_seed",
    "sde_kinds",
    "sde_step",
]
