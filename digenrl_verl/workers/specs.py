"""What a worker is built from: small, picklable, validated specs sent once at start-up.

The policy and its sampling engine (`PolicySpec`, `RolloutEngineSpec`) are specs of the engines package, which
sits below the workers; they are importable from here too, as the workers' whole start-up surface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from digenrl_verl.diffusion.loss import LossConfig
from digenrl_verl.engines.spec import PolicySpec, RolloutEngineSpec
from digenrl_verl.workers.sharding import ShardingSpec

__all__ = ["HostConfig", "OptimSpec", "PolicySpec", "RolloutEngineSpec", "TrainSpec"]


LR_SCHEDULERS = ("constant", "cosine")  # verl's lr_scheduler_type values


@dataclass(frozen=True)
class OptimSpec:
    """AdamW, gradient clipping and the learning-rate schedule (`actor_rollout_ref.actor.optim.*`, `actor.grad_clip`).

    The schedule is verl's (`verl.utils.torch_functional`: constant or cosine, with a linear warm-up of
    `lr_warmup_steps`, or `lr_warmup_steps_ratio` x `total_steps` when that is <= 0), stepped once per global step as
    verl-omni's actor steps it (after a global step's last mini-batch); `total_steps`: the run's global steps."""

    lr: float = 1e-6  # verl-omni's default (the shipped config's)
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    lr_scheduler_type: str = "constant"
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    zero_indexed_step: bool = True
    total_steps: int = 1

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"actor_rollout_ref.actor.optim.lr={self.lr!r} must be > 0")
        if self.lr_scheduler_type not in LR_SCHEDULERS:
            raise ValueError(f"actor_rollout_ref.actor.optim.lr_scheduler_type={self.lr_scheduler_type!r}; valid: "
                             f"{list(LR_SCHEDULERS)} (verl's)")
        if not 0.0 <= self.lr_warmup_steps_ratio <= 1.0:
            raise ValueError(f"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio={self.lr_warmup_steps_ratio!r} "
                             "must be in [0, 1]")

    @property
    def warmup_steps(self) -> int:
        """verl's rule: `lr_warmup_steps` when > 0, else `int(lr_warmup_steps_ratio * total_steps)`."""
        if self.lr_warmup_steps > 0:
            return self.lr_warmup_steps
        return int(self.lr_warmup_steps_ratio * self.total_steps)
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"actor_rollout_ref.actor.grad_clip={self.grad_clip!r} must be > 0 (or null: no clipping)")


@dataclass(frozen=True)
class TrainSpec:
    """How trainer workers turn micro-batches into gradients.

    Args:
        loss: clip ratio and KL.
        optim: optimizer settings.
        tsp_chunk_size: rows per TSP forward/backward (None = all rows of the micro-batch).
        recompute_old_log_probs: recompute old log-probs with the trainer's weights before the update
            (verl-omni's extra forward) instead of using the rollout ones. Only samples generated with the
            trainer's current version are recomputed; stale samples keep their behaviour log-probs.
        log_prob_micro_batch_size: samples per forward of that recompute pass, per rank (verl-omni's
            `actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu`); None = a rank's whole micro-batch.
        sharding: replicated data parallel or FSDP2 over the trainer ranks (`workers.sharding`).
        engine: what trains (`trainer.digenrl.trainer_engine` resolved): ``digenrl`` (the package's trainer, the
            fields above) or ``verl_omni`` (verl-omni's actor worker built from `host_config`; of the fields above
            it reads `tsp_chunk_size` and `recompute_old_log_probs`, verl-omni's code reads the rest from the host
            config).
        host_config: verl-omni's composed ``actor_rollout_ref`` section, resolved (engine ``verl_omni`` only).
    """

    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimSpec = field(default_factory=OptimSpec)
    tsp_chunk_size: int | None = None
    recompute_old_log_probs: bool = False
    log_prob_micro_batch_size: int | None = None
    sharding: ShardingSpec = field(default_factory=ShardingSpec)
    engine: str = "digenrl"
    host_config: Optional[Mapping[str, Any]] = None

    def __post_init__(self) -> None:
        if self.engine not in ("digenrl", "verl_omni"):
            raise ValueError(f"TrainSpec.engine={self.engine!r}: use 'digenrl' or 'verl_omni'")
        if self.engine == "verl_omni" and not self.host_config:
            raise ValueError("TrainSpec.engine='verl_omni' needs verl-omni's composed actor_rollout_ref (host_config)")


@dataclass(frozen=True)
class HostConfig:
    """What a run from verl-omni's entry point carries from verl-omni besides our translated config.

    Args:
        actor_rollout_ref: verl-omni's composed ``actor_rollout_ref`` section, resolved (its actor worker is built
            from it: `TrainSpec.host_config`).
        sigma_schedules: (N, σ_0..σ_N) of verl-omni's training adapter for each step count the run samples with
            (`PipelineConfig.host_sigmas`): the generators sample the schedule verl-omni's engine trains on.
    """

    actor_rollout_ref: Mapping[str, Any]
    sigma_schedules: tuple[tuple[int, tuple[float, ...]], ...] = ()
