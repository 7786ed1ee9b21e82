"""The names a run's step metrics are logged under: the single table the runner, the reporter, the loss stats, the
benches, the tests and docs/verl_omni.md ("Metric names") follow.

`VERL_OMNI`: each quantity verl-omni (a1139baf) also logs, under verl-omni's own name and with its aggregation:
`critic/*`, `perf/*`, `timing_s/*` and `training/*` from its diffusion trainer
(`verl_omni.trainer.diffusion.diffusion_metric_utils` and the trainers' loops), `actor/*` from its diffusion losses
(`diffusion_algos`, `workers/utils/losses.py`) and its engine worker (`loss`, `grad_norm`, `lr`, renamed `actor/*`),
plus `actor/pg_loss`, verl's name for the policy-gradient term that verl-omni's Flow-GRPO loss does not log apart.
`DIGENRL`: what only DigenRL computes, under `digenrl/`. Keys are quantities, values the logged names.
tests/verl_omni/test_verl_omni_metric_names.py checks `VERL_OMNI` against the real verl-omni, names and values.
"""

from __future__ import annotations

VERL_OMNI: dict[str, str] = {
    # rewards of the step batch, one per sample (verl-omni: sequence-level rewards, mean over the timesteps)
    "reward_mean": "critic/rewards/mean",
    "reward_max": "critic/rewards/max",
    "reward_min": "critic/rewards/min",
    "reward_zero_std_ratio": "critic/rewards/zero_std_ratio",  # prompt groups whose rewards all equal
    "reward_std_mean": "critic/rewards/std_mean",  # mean over prompt groups of the group's (population) std
    "reward_group_size": "critic/rewards/group_size",  # samples per prompt group
    # advantages (before the loss's clamp) and returns (= advantages for GRPO), over samples x trained steps
    "advantage_mean": "critic/advantages/mean",
    "advantage_max": "critic/advantages/max",
    "advantage_min": "critic/advantages/min",
    "return_mean": "critic/returns/mean",
    "return_max": "critic/returns/max",
    "return_min": "critic/returns/min",
    # time and throughput of the step
    "step_s": "timing_s/step",
    "time_per_step": "perf/time_per_step",
    "num_images": "perf/total_num_images",
    "throughput": "perf/throughput",  # images / (step seconds x devices)
    "global_step": "training/global_step",  # 1-based, verl's count
    # off-policy staleness of the step's trajectories (trainer version - generation version), verl-omni's v1 names
    "staleness_mean": "training/off_policy/trajectory_staleness/mean",
    "staleness_max": "training/off_policy/trajectory_staleness/max",
    "staleness_min": "training/off_policy/trajectory_staleness/min",
    # the actor's update
    "loss": "actor/loss",
    "pg_loss": "actor/pg_loss",
    "kl_loss": "actor/kl_loss",
    "kl_coef": "actor/kl_coef",
    "pg_clipfrac": "actor/pg_clipfrac",
    "approx_kl": "actor/approx_kl",
    "ratio_mean": "actor/ratio_mean",
    "ratio_min": "actor/ratio_min",
    "ratio_max": "actor/ratio_max",
    "grad_norm": "actor/grad_norm",
    "lr": "actor/lr",
}

DIGENRL: dict[str, str] = {
    "reward_std": "digenrl/reward/std",  # population std of the step's finite rewards
    "reward_nonfinite": "digenrl/reward/nonfinite_samples",
    "rows": "digenrl/actor/rows",  # loss rows (samples x trained steps) of the step
    "skipped_step": "digenrl/actor/skipped_step",  # optimizer steps skipped for a non-finite gradient
    "pg_zero_grad_frac": "digenrl/actor/pg_zero_grad_frac",
    "onpolicy_clip_frac": "digenrl/actor/onpolicy_clip_frac",
    "stale_clip_frac": "digenrl/actor/stale_clip_frac",
    "stale_zero_grad_frac": "digenrl/actor/stale_zero_grad_frac",
    "stale_rows": "digenrl/actor/stale_rows",
    "stale_is_weight_mean": "digenrl/actor/stale_is_weight_mean",
    "stale_is_weight_max": "digenrl/actor/stale_is_weight_max",
    "stale_is_capped_frac": "digenrl/actor/stale_is_capped_frac",
    "microbatches": "digenrl/schedule/microbatches",
    "tag_microbatches": "digenrl/schedule/tag_microbatches",
    "stale_samples": "digenrl/schedule/stale_samples",
    "stale_fraction": "digenrl/schedule/stale_fraction",
    "generators_used": "digenrl/schedule/generators_used",
    "policy_version": "digenrl/policy/version",
    "workers_dead": "digenrl/workers/dead",
    "workers_generators": "digenrl/workers/generators",
}

METRICS: dict[str, str] = {**VERL_OMNI, **DIGENRL}
"""Quantity -> logged name, every step metric of a run."""
