"""`trainer.digenrl`: the plugin's own section, one typed dataclass tree (defaults only here).

Loaded through Hydra/OmegaConf as a structured config (`digenrl_verl.config` registers it), so a key that is not
a field is rejected while the config is composed and a value of the wrong type fails there too; the checks that
span fields run in `__post_init__` when the node becomes a `DigenRLConfig` (`from_node`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from digenrl_verl.errors import ConfigError
from digenrl_verl.schedule.config import ScheduleSettings

SECTION = "trainer.digenrl"


@dataclass(frozen=True)
class PoolConfig:
    """One Ray resource pool (`trainer.digenrl.pools.<role>`).

    Args:
        nnodes, workers_per_node: the pool's shape (workers = nnodes x workers_per_node).
        use_gpu: one GPU per worker (needs `trainer.device=cuda`).
        accelerator_type: Ray accelerator type of those GPUs (heterogeneous clusters; GPU pools only).
        custom_resource: a custom Ray resource the pool's nodes advertise (placement without GPUs).
        gpu_fraction: GPUs per worker when use_gpu: 1, or 1/k to share a device (e.g. 0.5: the generator and the
            trainer pool on one GPU; their weight sync then runs over gloo, since NCCL needs one device per rank).
        max_restarts: generator pools: how many times a generator that dies is replaced by a new actor (which
            rejoins the weight sync and takes tasks again, docs/elastic.md); a worker dying once more is dropped with
            a message and the run goes on without it. No effect on trainer pools (a trainer death stops the run).
    """

    nnodes: int = 1
    workers_per_node: int = 1
    use_gpu: bool = False
    accelerator_type: Optional[str] = None
    custom_resource: Optional[str] = None
    gpu_fraction: float = 1.0
    max_restarts: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.nnodes, bool) or not isinstance(self.nnodes, int) or self.nnodes < 1:
            raise ConfigError("nnodes", self.nnodes, "a pool needs at least one node")
        if (isinstance(self.workers_per_node, bool) or not isinstance(self.workers_per_node, int)
                or self.workers_per_node < 1):
            raise ConfigError("workers_per_node", self.workers_per_node,
                              "an empty pool cannot run tasks; give it at least 1 worker")
        share = 1.0 / self.gpu_fraction if isinstance(self.gpu_fraction, (int, float)) and self.gpu_fraction > 0 else 0
        if not 0 < share or abs(share - round(share)) > 1e-9 or self.gpu_fraction > 1:
            raise ConfigError("gpu_fraction", self.gpu_fraction, "use 1/k for an integer k >= 1 (1, 0.5, 0.25, ...)")
        if self.gpu_fraction != 1.0 and not self.use_gpu:
            raise ConfigError("gpu_fraction", self.gpu_fraction, "a fraction of a GPU needs use_gpu=true")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ConfigError("max_restarts", self.max_restarts, "use an integer >= 0 (0: a dead generator is dropped)")
        if self.accelerator_type and not self.use_gpu:
            raise ConfigError("accelerator_type", self.accelerator_type,
                              "needs use_gpu=true; on CPU place pools with custom_resource instead")

    @property
    def size(self) -> int:
        return self.nnodes * self.workers_per_node

    @property
    def shares_a_device(self) -> bool:
        return self.use_gpu and self.gpu_fraction < 1.0

    @property
    def placement(self) -> str:
        """The accelerator type or custom resource the pool is placed on ('' = anywhere)."""
        return self.accelerator_type or self.custom_resource or ""


@dataclass(frozen=True)
class PoolsConfig:
    """The pools of both layouts; a run uses `colocated`, or `generator` + `trainer` (see `DigenRLConfig.roles`)."""

    colocated: PoolConfig = field(default_factory=lambda: PoolConfig(workers_per_node=2))
    generator: PoolConfig = field(default_factory=PoolConfig)
    trainer: PoolConfig = field(default_factory=PoolConfig)

    def __getitem__(self, role: str) -> PoolConfig:
        return getattr(self, role)


#: `trainer.digenrl.trainer_engine` values (`DigenRLConfig`)
TRAINER_ENGINES = ("auto", "digenrl", "verl_omni")


@dataclass(frozen=True)
class DigenRLConfig(ScheduleSettings):
    """`trainer.digenrl.*`: the scheduling settings (mode, gap, pipeline, `tsp`, `tag`, `tcss`, task_timeout_s;
    see `ScheduleSettings`) and the runtime knobs.

    Args:
        task_timeout_s: a worker call running longer fails the run, naming the worker and the task.
        dry_run: validate, print the plan and pools, start no workers.
        output_dir: where metrics.jsonl, the trace, the PNG timeline and checkpoints go.
        pools: Ray placement per role.
        torch_threads: intra-op threads per worker process.
        max_nonfinite_steps: consecutive steps with NaN/inf rewards or losses before the run stops.
        final_eval_prompts: prompts sampled deterministically (ODE) and scored with the final weights (0 = off).
        trainer_engine: what trains on the trainer pool. ``verl_omni``: verl-omni's own actor worker and training
            engine (its FSDP engine with the TSP subclass, its LoRA, optimizer, loss and checkpoints;
            `integrations.verl_omni_trainer`), reading verl-omni's composed ``actor_rollout_ref`` config: a run
            from verl-omni's entry point. ``digenrl``: the package's own trainer (the standalone entry point,
            no verl-omni installed). ``auto`` (default): ``verl_omni`` when the run comes from verl-omni's entry
            point (verl-omni installed), else ``digenrl``.
        rows_alone: the diffusers engines (generators, TAG, colocated) draw each sample in a batch of its own, so a
            sample does not depend on its batch neighbours (`diffusion.rollout.RolloutConfig.rows_alone`); costs
            the batching of the sampling forwards. Bit-identical across CPU workers (FSDP2 trainer ranks included)
            because their environment pins MKL's rounding (`digenrl_verl.platform.process_env`: ``MKL_CBWR``).
            False (default): batched, as verl-omni's rollout.
        generator_replicas: with ``actor_rollout_ref.rollout.name=vllm_omni``, whether each generator rank starts one
            of verl-omni's rollout replicas on its own bundle and device (`vLLMOmniReplica.init_colocated`: its
            server, vLLM-Omni's `AsyncOmni` and its diffusion workers) and samples through its server API (rollout
            engine ``verl_omni_replica``), or runs verl-omni's rollout pipeline in its own process (rollout engine
            ``verl_omni``, CPU only). null (default) = auto: replicas on CUDA (the path verl-omni itself takes on
            GPUs), the in-process pipeline on CPU (a replica start costs ~100 s there). true / false are honoured on
            both devices (false on CUDA is refused: the in-process pipeline is CPU only). On CPU the run's own local
            Ray instance gets one logical GPU and one more CPU per generator rank for the replicas. No effect with
            another rollout engine (warned).
    """

    task_timeout_s: Optional[float] = 600.0  # the product's default; the simulator's runs have no timeout
    dry_run: bool = False
    output_dir: str = "outputs/${trainer.experiment_name}"
    pools: PoolsConfig = field(default_factory=PoolsConfig)
    torch_threads: int = 1
    max_nonfinite_steps: int = 3
    final_eval_prompts: int = 4
    trainer_engine: str = "auto"
    rows_alone: bool = False
    generator_replicas: Optional[bool] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.trainer_engine not in TRAINER_ENGINES:
            raise ConfigError("trainer_engine", self.trainer_engine, f"use one of {list(TRAINER_ENGINES)}")
        if not isinstance(self.rows_alone, bool):
            raise ConfigError("rows_alone", self.rows_alone, "use true or false")
        if self.generator_replicas is not None and not isinstance(self.generator_replicas, bool):
            raise ConfigError("generator_replicas", self.generator_replicas, "use true, false or null (auto)")
        for name, low in (("torch_threads", 1), ("max_nonfinite_steps", 1), ("final_eval_prompts", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(name, value, f"use an integer >= {low}")
        for role in ("colocated", "trainer") if self.mode == "colocated" else ("trainer",):
            if self.pools[role].max_restarts != PoolConfig.max_restarts:
                warnings.warn(f"{SECTION}.pools.{role}.max_restarts has no effect: only generators are restarted "
                              "(a trainer death stops the run; resume from its last checkpoint)", UserWarning,
                              stacklevel=2)

    @property
    def roles(self) -> tuple[str, ...]:
        return ("colocated",) if self.mode == "colocated" else ("generator", "trainer")

    @property
    def trainer_role(self) -> str:
        return "colocated" if self.mode == "colocated" else "trainer"

    @property
    def generator_role(self) -> str:
        return "colocated" if self.mode == "colocated" else "generator"

    @staticmethod
    def from_node(node: Any) -> "DigenRLConfig":
        """The validated section from its composed node (a DictConfig of this schema, or a plain mapping);
        a ConfigError naming `trainer.digenrl.<key>` on bad input."""
        raw = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
        try:
            return _from_mapping(DigenRLConfig, raw)
        except ConfigError as e:
            raise e.under(SECTION) from None


def _from_mapping(cls: type, raw: dict[str, Any]) -> Any:
    """`cls(**raw)` with nested sections built too; unknown keys rejected naming the valid ones."""
    by_name = {f.name: f for f in fields(cls)}
    for name, value in raw.items():
        if name not in by_name:
            raise ConfigError(name, value, f"unknown key; valid keys here: {sorted(by_name)}")
    kwargs = {}
    for name, value in raw.items():
        factory = by_name[name].default_factory
        section = factory() if callable(factory) else None
        if section is not None and hasattr(section, "__dataclass_fields__") and isinstance(value, dict):
            try:
                value = _from_mapping(type(section), value)
            except ConfigError as e:  # the schedule's sections name their paths from the settings' root already
                raise (e if e.path.startswith(f"{name}.") else e.under(name)) from None
        kwargs[name] = value
    return cls(**kwargs)


def schema_node() -> DictConfig:
    """The section as an OmegaConf node for Hydra's ConfigStore: typed and closed to unknown keys, but writable
    (frozen dataclasses give read-only nodes, which overrides could not change)."""
    node = OmegaConf.structured(DigenRLConfig)
    _writable(node)
    return node


def _writable(node: DictConfig) -> None:
    OmegaConf.set_readonly(node, None)
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _writable(child)
