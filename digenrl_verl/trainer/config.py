"""The run configuration: Hydra/OmegaConf tree → validated, typed component configs.

Everything a run needs is checked here, before any worker starts, and every error names the key as the
user writes it, the bad value and the fix. `trainer.digenrl.dry_run=true` runs exactly this and prints
the resolved plan and pools.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

MODES = ("colocated", "disaggregated")
ALGORITHMS = ("flow_grpo", "dance_grpo")
ROLLOUT_BACKENDS = ("diffusers", "vllm_omni")

# verl-omni keys we accept so its recipes parse, but whose features we do not implement: enabling one
# fails with this message (never silently ignored). value → predicate telling that the feature is ON.
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "reward.reward_model.enable": (True, "model-based rewards served as vLLM replicas are not supported; use "
                                   "reward.reward_functions or reward.custom_reward_function"),
    "reward.reward_model.enable_resource_pool": (True, "a separate reward pool is not supported: the reward "
                                                 "sits with the generator (DigenRL's layout)"),
    "actor_rollout_ref.actor.ppo_epochs": ("!1", "only ppo_epochs=1 is supported (one pass over each step's samples)"),
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": (
        "!1", "Ulysses sequence parallelism is not supported; set it to 1"),
    "algorithm.trainer_type": ("!policy_gradient", "only trainer_type=policy_gradient is supported"),
    "algorithm.sample_source": ("!online", "only online sampling is supported"),
    "trainer.use_v1": (True, "verl-omni's v1 trainer selection does not apply: select DigenRL with "
                       "trainer.digenrl.mode=disaggregated on this entry point"),
}


def _key(cfg: DictConfig, dotted: str, default: Any = None) -> Any:
    v = OmegaConf.select(cfg, dotted, default=default)
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig,)) or OmegaConf.is_list(v) else v


@dataclass(frozen=True)
class PoolConfig:
    """One pool of `trainer.digenrl.pools.<role>`."""

    role: str
    nnodes: int = 1
    workers_per_node: int = 1
    use_gpu: bool = False
    accelerator_type: str | None = None
    custom_resource: str | None = None

    def __post_init__(self) -> None:
        key = f"trainer.digenrl.pools.{self.role}"
        if not isinstance(self.nnodes, int) or self.nnodes < 1:
            raise ValueError(f"{key}.nnodes={self.nnodes!r}: a pool needs at least one node")
        if not isinstance(self.workers_per_node, int) or self.workers_per_node < 1:
            raise ValueError(f"{key}.workers_per_node={self.workers_per_node!r}: an empty pool cannot run tasks; "
                             "give it at least 1 worker")
        if self.accelerator_type and not self.use_gpu:
            raise ValueError(f"{key}.accelerator_type={self.accelerator_type!r} needs {key}.use_gpu=true; on CPU "
                             f"place pools with {key}.custom_resource instead")

    @property
    def size(self) -> int:
        return self.nnodes * self.workers_per_node


SCHEDULE_KEYS = ("mode", "gap", "pipeline", "tsp", "tag", "static_k", "probe_tag", "bts_max_states", "staleness",
                 "max_stale_fraction", "max_gen_futures", "task_timeout_s")
SCHEDULE_POOL_NAMES = {"colocated": "col", "generator": "gen", "trainer": "trn"}


@dataclass(frozen=True)
class DigenRLConfig:
    """`trainer.digenrl.*`: the runtime knobs; the scheduling knobs are validated by `ScheduleConfig`.

    Args:
        schedule: the scheduling keys as written (mode, gap, pipeline, tsp, tag, static_k, ...).
        dry_run: validate, print the plan and pools, start no workers.
        output_dir: where metrics.jsonl, the trace, the PNG timeline and checkpoints go.
        pools: Ray placement per role (`colocated`, or `generator` + `trainer`).
        tsp_chunk_size: rows per TSP forward/backward chunk (0 = all).
        torch_threads: intra-op threads per worker process.
        max_nonfinite_steps: consecutive steps with NaN/inf rewards or losses before the run stops.
    """

    schedule: dict[str, Any]
    dry_run: bool = False
    output_dir: str = "outputs/run"
    pools: dict[str, PoolConfig] = field(default_factory=dict)
    tsp_chunk_size: int = 0
    torch_threads: int = 1
    max_nonfinite_steps: int = 3

    def __post_init__(self) -> None:
        k = "trainer.digenrl"
        mode = self.schedule.get("mode", "colocated")
        if mode not in MODES:
            raise ValueError(f"unknown {k}.mode={mode!r}; valid choices: {list(MODES)}")
        for role in self.roles:
            if role not in self.pools:
                raise ValueError(f"{k}.pools.{role} is missing: mode={mode} needs pools {list(self.roles)}")
        if not isinstance(self.tsp_chunk_size, int) or self.tsp_chunk_size < 0:
            raise ValueError(f"{k}.tsp_chunk_size={self.tsp_chunk_size!r} must be an int ≥ 0 (0 = all rows at once)")
        if not isinstance(self.torch_threads, int) or self.torch_threads < 1:
            raise ValueError(f"{k}.torch_threads={self.torch_threads!r} must be an int ≥ 1")
        if not isinstance(self.max_nonfinite_steps, int) or self.max_nonfinite_steps < 1:
            raise ValueError(f"{k}.max_nonfinite_steps={self.max_nonfinite_steps!r} must be an int ≥ 1")

    @property
    def mode(self) -> str:
        return self.schedule.get("mode", "colocated")

    @property
    def roles(self) -> tuple[str, ...]:
        return ("colocated",) if self.mode == "colocated" else ("generator", "trainer")

    def schedule_config(self, *, num_steps: int, start_step: int, prompts_per_step: int, n: int):
        """The validated `ScheduleConfig` of this run (ValueError naming trainer.digenrl.<key> on bad input)."""
        from digenrl_verl.schedule.config import PoolSpec as SchedulePool
        from digenrl_verl.schedule.config import ScheduleConfig

        pools = {
            SCHEDULE_POOL_NAMES[role]: SchedulePool(
                self.pools[role].size, self.pools[role].accelerator_type or self.pools[role].custom_resource or ""
            )
            for role in self.roles
        }
        return ScheduleConfig(**self.effective_schedule_keys(), pools=pools, num_steps=num_steps, start_step=start_step,
                              prompts_per_step=prompts_per_step, n=n)

    def effective_schedule_keys(self) -> dict[str, Any]:
        """The scheduling keys that apply to the mode: the YAML's defaults describe the disaggregated run,
        so one flag (`mode=disaggregated`) switches a recipe; colocated runs ignore the TAG/TCSS knobs, and
        `max_stale_fraction` only applies with staleness=1."""
        keys = dict(self.schedule)
        if keys.get("tsp") is None:
            keys["tsp"] = self.mode == "disaggregated"
        if self.mode == "colocated":
            keys = {k: v for k, v in keys.items() if k in ("mode", "tsp", "task_timeout_s")}
            keys.update(tag="off", staleness=0)
        elif keys.get("staleness", 0) == 0:
            keys.pop("max_stale_fraction", None)
        return keys

    @staticmethod
    def from_cfg(cfg: DictConfig) -> "DigenRLConfig":
        d = dict(_key(cfg, "trainer.digenrl", {}) or {})
        pools = {role: PoolConfig(role=role, **(spec or {})) for role, spec in (d.pop("pools", {}) or {}).items()}
        schedule = {k: d.pop(k) for k in SCHEDULE_KEYS if k in d}
        known = set(DigenRLConfig.__dataclass_fields__) - {"schedule", "pools"}
        extra = sorted(set(d) - known)
        if extra:
            raise ValueError(f"unknown key trainer.digenrl.{extra[0]} (unknown: {extra}); valid keys: "
                             f"{sorted(known | set(SCHEDULE_KEYS) | {'pools'})}")
        return DigenRLConfig(schedule=schedule, pools=pools, **d)
