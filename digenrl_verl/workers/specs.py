"""What a worker is built from: small, picklable, validated specs sent once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from digenrl_verl.diffusion.loss import LossConfig
from digenrl_verl.diffusion.rollout import RolloutConfig
from digenrl_verl.models.config import LoraConfig, PipelineConfig
from digenrl_verl.workers.sharding import ShardingSpec


ROLLOUT_BACKENDS = ("diffusers", "vllm_omni")


@dataclass(frozen=True)
class RolloutEngineSpec:
    """The generators' sampling engine (`actor_rollout_ref.rollout.*`).

    Args:
        name: `diffusers` (the policy in the generator process, CPU or GPU) or `vllm_omni` (a vLLM-Omni engine
            per generator rank running DigenRL's pipeline; GPU only), `actor_rollout_ref.rollout.name`.
        dtype: the engine's model dtype (`actor_rollout_ref.rollout.dtype`; vllm_omni only).
        engine_kwargs: `actor_rollout_ref.rollout.engine_kwargs.vllm_omni`, passed to `AsyncOmni`.
    """

    name: str = "diffusers"
    dtype: str = "bfloat16"
    engine_kwargs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in ROLLOUT_BACKENDS:
            raise ValueError(f"unknown actor_rollout_ref.rollout.name={self.name!r}; valid choices: "
                             f"{list(ROLLOUT_BACKENDS)}")


@dataclass(frozen=True)
class PolicySpec:
    """The sampling policy every worker holds (generators, trainers for TAG, colocated workers).

    Args:
        model_path: local diffusers model directory (model_index.json).
        lora: LoRA settings, or full fine-tune (rank 0).
        pipeline: image size, guidance, text length.
        rollout: SDE kind, noise level, timestep selection, seeds.
        dtype: model dtype ("float32"; the SDE math is fp32 whatever this is).
        start_version: policy version of the weights at start (the global step resumed from).
        device: "cpu", or "cuda" for workers placed on GPU bundles (each sees its one GPU as cuda:0).
        engine: the generators' sampling engine (trainers always sample TAG micro-batches in-process).
    """

    model_path: str
    lora: LoraConfig
    pipeline: PipelineConfig
    rollout: RolloutConfig
    dtype: str = "float32"
    start_version: int = 0
    device: str = "cpu"
    engine: RolloutEngineSpec = field(default_factory=RolloutEngineSpec)


@dataclass(frozen=True)
class OptimSpec:
    """AdamW and gradient clipping (`actor_rollout_ref.actor.optim.*`, `actor.grad_clip`)."""

    lr: float = 1e-4
    weight_decay: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"actor_rollout_ref.actor.optim.lr={self.lr!r} must be > 0")
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
        sharding: replicated data parallel or FSDP2 over the trainer ranks (`workers.sharding`).
    """

    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimSpec = field(default_factory=OptimSpec)
    tsp_chunk_size: int | None = None
    recompute_old_log_probs: bool = False
    sharding: ShardingSpec = field(default_factory=ShardingSpec)
