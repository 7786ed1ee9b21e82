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
DEFAULT_REWARD = {"brightness": 1.0}
ALGORITHMS = ("flow_grpo", "dance_grpo")

# verl-omni keys we accept so its recipes parse, but whose features we do not implement: enabling one
# fails with the message (never silently ignored). The first element tells when the feature is ON: a value
# (ON when equal), "!value" (ON when different), or a predicate `(value, cfg) -> bool`.
def _algorithm(cfg: DictConfig) -> Any:  # (an unknown model.algorithm is reported by build_run itself)
    return OmegaConf.select(cfg, "actor_rollout_ref.model.algorithm", default=None)


def _any_gpu_pool(cfg: DictConfig) -> bool:
    pools = OmegaConf.select(cfg, "trainer.digenrl.pools", default=None) or {}
    return any(bool((spec or {}).get("use_gpu")) for spec in pools.values())


_BACKENDS_OK = ("naive", "nccl")  # our weight sync is a torch.distributed group (gloo on CPU, NCCL on GPU)
_PIXEL_OUTPUTS = ("image", "video", "pil", "np", "pt")
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
    "algorithm.adv_estimator": (lambda v, cfg: v not in ALGORITHMS and v != _algorithm(cfg),
                                f"only the group-relative estimators {list(ALGORITHMS)} are implemented"),
    "actor_rollout_ref.actor.diffusion_loss.loss_mode": (
        lambda v, cfg: v not in ALGORITHMS and v != _algorithm(cfg),
        f"only the clipped Flow-GRPO/DanceGRPO loss {list(ALGORITHMS)} is implemented"),
    "trainer.use_v1": (True, "verl-omni's v1 trainer selection does not apply: select DigenRL with "
                       "trainer.digenrl.mode=disaggregated on this entry point (or trainer.v1.trainer_mode=digenrl "
                       "on verl-omni's entry point, see digenrl_verl.integrations.verl_omni)"),
    "actor_rollout_ref.model.lora_adapter_path": (lambda v, cfg: v is not None,
                                                  "loading a pre-trained LoRA adapter is not supported; set it to "
                                                  "null (LoRA starts from its seeded init)"),
    "trainer.val_before_train": (True, "validation runs are not implemented; set it to false"),
    "trainer.test_freq": (lambda v, cfg: isinstance(v, int) and v > 0,
                          "validation runs are not implemented; set it to -1"),
    "trainer.device": (lambda v, cfg: v not in ("cpu", "cuda", "gpu") or (v != "cpu" and not _any_gpu_pool(cfg)),
                       "valid devices: cpu, cuda (alias gpu); cuda needs GPU pools: set "
                       "trainer.digenrl.pools.<role>.use_gpu=true, or trainer.device=cpu"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": (
        "!1", "tensor-parallel generation is not implemented: each generator rank holds a whole model; set it to 1"),
    "actor_rollout_ref.rollout.data_parallel_size": ("!1", "generation is data parallel over "
                                                     "trainer.digenrl.pools.generator; set it to 1"),
    "actor_rollout_ref.rollout.nnodes": (
        lambda v, cfg: isinstance(v, int) and v > 0
        and OmegaConf.select(cfg, "trainer.digenrl.mode", default="colocated") != "disaggregated",
        "standalone rollout nodes are verl-omni's separate layout: set trainer.digenrl.mode=disaggregated and size "
        "trainer.digenrl.pools.generator / .trainer"),
    "actor_rollout_ref.rollout.checkpoint_engine.backend": (
        lambda v, cfg: v not in _BACKENDS_OK, f"weights sync through our process group; valid: {list(_BACKENDS_OK)}"),
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module": (
        lambda v, cfg: v is not None, "custom checkpoint-engine backends are not supported; set it to null"),
    "actor_rollout_ref.rollout.pipeline.video_flow_shift": (
        lambda v, cfg: v is not None, "the flow shift comes from the model's scheduler_config.json; set it to null "
        "(or edit the scheduler config of the model directory)"),
    "actor_rollout_ref.rollout.pipeline.aspect_ratio": (
        lambda v, cfg: v is not None, "give actor_rollout_ref.rollout.pipeline.height/width instead"),
    "actor_rollout_ref.rollout.pipeline.output_type": (
        lambda v, cfg: v not in _PIXEL_OUTPUTS, f"rewards score decoded pixels; valid: {list(_PIXEL_OUTPUTS)}"),
}

# verl-omni keys that are accepted but have no effect here (memory/engine hints of its FSDP and vLLM engines):
# a non-default value warns once per run, so nothing is ignored silently. key → (default, why).
NO_EFFECT: dict[str, tuple[Any, str]] = {
    "actor_rollout_ref.actor.fsdp_config.param_offload": (False, "parameter CPU offload is not implemented"),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": (False, "optimizer CPU offload is not implemented"),
    "actor_rollout_ref.rollout.layered_summon": (False, "weights reach the generators through the trainer → "
                                                 "generator process group, not vLLM's layered summon"),
}
# verl-omni pipeline keys that PipelineConfig does not take (validated through UNSUPPORTED above).
VERL_OMNI_PIPELINE_KEYS = ("frame_rate", "video_flow_shift", "aspect_ratio", "output_type")


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


SCHEDULE_KEYS = ("mode", "gap", "pipeline", "tsp", "tag", "static_k", "probe_tag", "bts_max_states", "tcss_guard",
                 "staleness",
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
        final_eval_prompts: prompts sampled deterministically (ODE) and scored with the final weights (0 = off).
    """

    schedule: dict[str, Any]
    dry_run: bool = False
    output_dir: str = "outputs/run"
    pools: dict[str, PoolConfig] = field(default_factory=dict)
    tsp_chunk_size: int = 0
    torch_threads: int = 1
    max_nonfinite_steps: int = 3
    final_eval_prompts: int = 4

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


# ---------------------------------------------------------------------------------------------------------
# The whole run, validated before any worker starts.
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RunSpec:
    """Everything a run is built from (the resolved, validated config).

    Attributes:
        digenrl: runtime knobs; `schedule`: the validated ScheduleConfig.
        policy / train / reward: the worker specs. `advantage`: group normalisation.
        prompts_per_step, n: step batch shape; num_steps: global steps to run from `start_step`.
        architecture: the model's `_class_name`.
    """

    cfg: DictConfig
    digenrl: DigenRLConfig
    schedule: Any
    policy: Any
    train: Any
    reward: Any
    advantage: Any
    prompts_per_step: int
    n: int
    num_steps: int
    architecture: str
    start_step: int = 0

    @property
    def output_dir(self) -> Path:
        return Path(self.digenrl.output_dir)

    def describe(self) -> str:
        """The resolved plan and pools (what `dry_run` prints)."""
        s = self.schedule
        pools = ", ".join(f"{role}: {p.size} worker(s){' on ' + str(p.accelerator_type or p.custom_resource) if (p.accelerator_type or p.custom_resource) else ''}"
                          for role, p in ((r, self.digenrl.pools[r]) for r in self.digenrl.roles))
        lines = [
            f"model: {self.policy.model_path} ({self.architecture}), "
            f"{'LoRA r=' + str(self.policy.lora.rank) if self.policy.lora.enabled else 'full fine-tune'}",
            f"mode: {s.mode}; pools: {pools}",
            f"step: {self.prompts_per_step} prompts x n={self.n} = {self.prompts_per_step * self.n} samples; "
            f"{self.num_steps} global step(s) from step {self.start_step}",
            f"rollout: {self.policy.rollout.num_inference_steps} steps, sde_type={self.policy.rollout.sde_type}, "
            f"noise_level={self.policy.rollout.noise_level}, selection={self.policy.rollout.timestep_selection}, "
            f"K={self.policy.rollout.num_train_steps} trained steps/sample",
            f"schedule: gap={s.gap} pipeline={s.pipeline} tsp={s.tsp} tag={s.tag}"
            f"{' k=' + str(s.static_k) if s.tag == 'static' else ''} staleness={s.staleness} "
            f"max_stale_fraction={s.max_stale_fraction} max_gen_futures={s.max_gen_futures}",
            f"engines: generation {self.policy.engine.name} ({self.policy.dtype if self.policy.engine.name == 'diffusers' else self.policy.engine.dtype}"
            f" on {self.policy.device}); trainer "
            f"{'FSDP2 (fully_shard) over ' + str(self.digenrl.pools['trainer'].size) + ' ranks' if self.train.sharding.sharded else 'whole model per rank (ddp)'}"
            f", model dtype {self.policy.dtype}",
            f"loss: clip={self.train.loss.clip_ratio} kl_coef={self.train.loss.kl_coef}; lr={self.train.optim.lr}; "
            f"old log-probs: {'recomputed' if self.train.recompute_old_log_probs else 'from rollout'}",
            f"reward: {self.reward.weights()}"
            f"{' (custom: ' + str(self.reward.custom_reward_function_path) + ')' if self.reward.custom_reward_function_path else ''}",
            f"output: {self.output_dir}",
        ]
        return "\n".join(lines)


def _check_unsupported(cfg: DictConfig) -> None:
    """ValueError naming the first UNSUPPORTED key that is ON; a warning per NO_EFFECT key set off its default."""
    import warnings

    for dotted, (bad, why) in UNSUPPORTED.items():
        v = OmegaConf.select(cfg, dotted, default=None)
        if v is None:
            continue
        if callable(bad):
            on = bad(v, cfg)
        else:
            on = (v != bad[1:] and str(v) != bad[1:]) if isinstance(bad, str) and bad.startswith("!") else v == bad
        if on:
            raise ValueError(f"{dotted}={v!r} is not supported by digenrl_verl: {why}")
    for dotted, (default, why) in NO_EFFECT.items():
        v = OmegaConf.select(cfg, dotted, default=default)
        if v != default:
            warnings.warn(f"{dotted}={v!r} has no effect in digenrl_verl: {why}", UserWarning, stacklevel=3)


def _device(cfg: DictConfig, digenrl: DigenRLConfig) -> str:
    """cuda when `trainer.device` asks for it and every pool holds GPUs; all workers share one device kind (NCCL
    or gloo spans both pools)."""
    gpu = [digenrl.pools[r].use_gpu for r in digenrl.roles]
    if _key(cfg, "trainer.device", "cpu") in ("cuda", "gpu"):
        if not all(gpu):
            raise ValueError("trainer.device=cuda needs GPUs in every pool: set trainer.digenrl.pools.<role>.use_gpu=true "
                             f"for {[r for r in digenrl.roles if not digenrl.pools[r].use_gpu]}")
        return "cuda"
    if any(gpu):
        raise ValueError("trainer.digenrl.pools.<role>.use_gpu=true needs trainer.device=cuda")
    return "cpu"


def _sharding(cfg: DictConfig, digenrl: DigenRLConfig, n: int) -> "ShardingSpec":
    """`actor_rollout_ref.actor.strategy` → how the trainer pool splits its model (see `workers.sharding`).

    FSDP2 applies to the trainer pool of a disaggregated run with more than one rank. A single trainer rank has
    nothing to shard with; colocated ranks sample their own micro-batches, which sharded forwards (collectives
    over all ranks) cannot do, so they keep a whole model each (the data-parallel baseline)."""
    import warnings

    from digenrl_verl.workers.sharding import STRATEGIES, STRATEGY_KEY, ShardingSpec

    strategy = _key(cfg, STRATEGY_KEY, "fsdp")
    if strategy not in STRATEGIES:
        raise ValueError(f"{STRATEGY_KEY}={strategy!r}; valid: {list(STRATEGIES)} (fsdp and fsdp2 both mean FSDP2 "
                         "fully_shard over the trainer pool; ddp keeps a whole model per trainer rank)")
    if strategy == "ddp":
        return ShardingSpec("ddp")
    if digenrl.mode != "disaggregated":
        if strategy == "fsdp2" and digenrl.pools["colocated"].size > 1:
            warnings.warn(f"{STRATEGY_KEY}=fsdp2 in trainer.digenrl.mode=colocated: colocated ranks keep a whole "
                          "model each and all-reduce gradients (FSDP2 applies to the trainer pool of mode="
                          "disaggregated)", UserWarning, stacklevel=3)
        return ShardingSpec("ddp")
    trainers = digenrl.pools["trainer"].size
    fsdp_size = _key(cfg, "actor_rollout_ref.actor.fsdp_config.fsdp_size", -1)
    if fsdp_size not in (-1, None, trainers):
        raise ValueError(f"actor_rollout_ref.actor.fsdp_config.fsdp_size={fsdp_size}: hybrid sharding is not "
                         f"implemented; use -1 (shard over the whole trainer pool, {trainers} ranks)")
    if trainers == 1:
        return ShardingSpec("ddp")
    if n < trainers:
        raise ValueError(f"{STRATEGY_KEY}={strategy} shards the model over {trainers} trainer ranks, which run every "
                         f"forward together, so each needs a sample of every micro-batch, but actor_rollout_ref."
                         f"rollout.n={n} < {trainers}: raise rollout.n, shrink trainer.digenrl.pools.trainer, or set "
                         f"{STRATEGY_KEY}=ddp")
    prefixes = _key(cfg, "actor_rollout_ref.model.fsdp_layer_prefixes")
    if isinstance(prefixes, str):
        prefixes = [prefixes]
    wrap = _key(cfg, "actor_rollout_ref.actor.fsdp_config.wrap_policy", {}) or {}
    return ShardingSpec(strategy, tuple(prefixes) if prefixes else None, int(wrap.get("min_num_params") or 0),
                        bool(_key(cfg, "actor_rollout_ref.actor.fsdp_config.reshard_after_forward", True)))


def build_run(cfg: DictConfig, *, start_step: int = 0) -> RunSpec:
    """Validate `cfg` and build the run's specs. Raises ValueError naming the key, the value and the fix."""
    from digenrl_verl.diffusion.advantages import AdvantageConfig
    from digenrl_verl.diffusion.loss import LossConfig
    from digenrl_verl.diffusion.rollout import RolloutConfig
    from digenrl_verl.diffusion.selection import auto_selection
    from digenrl_verl.models.config import LoraConfig, PipelineConfig
    from digenrl_verl.models.registry import get_adapter_class, read_model_index
    from digenrl_verl.rewards.compose import RewardConfig
    from digenrl_verl.workers.specs import OptimSpec, PolicySpec, RolloutEngineSpec, TrainSpec

    _check_unsupported(cfg)
    digenrl = DigenRLConfig.from_cfg(cfg)

    algorithm = _key(cfg, "actor_rollout_ref.model.algorithm", "flow_grpo")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown actor_rollout_ref.model.algorithm={algorithm!r}; valid choices: {list(ALGORITHMS)}")
    engine = RolloutEngineSpec(  # validates actor_rollout_ref.rollout.name
        name=_key(cfg, "actor_rollout_ref.rollout.name", "diffusers"),
        dtype=str(_key(cfg, "actor_rollout_ref.rollout.dtype", "bfloat16")),
        engine_kwargs=dict(_key(cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm_omni", {}) or {}))
    backend = engine.name
    tag = digenrl.schedule.get("tag", "bts")
    if backend == "vllm_omni" and digenrl.mode == "disaggregated" and tag != "off":
        raise ValueError(f"trainer.digenrl.tag={tag!r} needs trainer workers that can hold the rollout model, but "
                         "with actor_rollout_ref.rollout.name=vllm_omni the trainer has no vLLM-Omni engine to "
                         "generate with; set trainer.digenrl.tag=off (or rollout.name=diffusers)")
    if backend == "vllm_omni":
        from digenrl_verl.integrations.vllm_omni import require_vllm_omni

        require_vllm_omni()

    # model directory and architecture
    path = _key(cfg, "actor_rollout_ref.model.path")
    if path is None or path == "???":
        raise ValueError("actor_rollout_ref.model.path is not set: give a local diffusers model directory "
                         "(build a tiny one with `python -m digenrl_verl.models.tiny FluxPipeline <dir>`)")
    index = read_model_index(path)  # ValueError naming the key when it is not a diffusers model directory
    architecture = index["_class_name"]
    want = _key(cfg, "actor_rollout_ref.model.architecture")
    if want is not None and want != architecture:
        raise ValueError(f"actor_rollout_ref.model.architecture={want!r} but {path}/model_index.json names "
                         f"{architecture!r}; drop the key or point model.path at a {want} directory")
    get_adapter_class(architecture)  # lists the valid architectures on a miss

    # batch shape and pools
    n = _key(cfg, "actor_rollout_ref.rollout.n")
    prompts = _key(cfg, "data.train_batch_size")
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"actor_rollout_ref.rollout.n={n!r}: group-relative advantages need at least 2 samples "
                         "per prompt; set rollout.n >= 2")
    if not isinstance(prompts, int) or prompts < 1:
        raise ValueError(f"data.train_batch_size={prompts!r} must be a positive number of prompts")
    mini = _key(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size")
    if mini is not None and mini != prompts:
        raise ValueError(f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must equal data.train_batch_size="
                         f"{prompts} (one optimizer step per global step: the pipeline overlaps a step's "
                         "generation with its own update); set it to null or to the train batch size")
    trainer_role = "colocated" if digenrl.mode == "colocated" else "trainer"
    micro = _key(cfg, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    share = -(-n // digenrl.pools[trainer_role].size)
    if micro is not None and micro < share:
        raise ValueError(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro} is smaller than one prompt "
                         f"group's share per {trainer_role} rank (ceil(rollout.n={n} / "
                         f"{digenrl.pools[trainer_role].size} ranks) = {share}): a micro-batch is one group; raise it "
                         f"to >= {share} or null")
    total_workers = sum(digenrl.pools[r].size for r in digenrl.roles)
    if not any(digenrl.pools[r].use_gpu for r in digenrl.roles):
        limit = max(4 * (os.cpu_count() or 1), 8)
        if total_workers > limit:
            raise ValueError(f"trainer.digenrl.pools: {total_workers} CPU worker processes on a machine with "
                             f"{os.cpu_count()} cores (limit {limit}); shrink pools.*.workers_per_node")
    gen_ranks = digenrl.pools["generator" if digenrl.mode == "disaggregated" else "colocated"].size
    if gen_ranks > prompts * n:
        raise ValueError(f"trainer.digenrl.pools: {gen_ranks} generator ranks for {prompts * n} samples per step; "
                         "some ranks would never get a sample: shrink the pool or raise data.train_batch_size")

    # algorithm pieces
    if digenrl.mode == "disaggregated" and _key(cfg, "algorithm.global_std"):
        raise ValueError("algorithm.global_std=true needs every group's reward of a step before any update, which "
                         "disables pipelining in trainer.digenrl.mode=disaggregated; set algorithm.global_std=false "
                         "(per-group std), or use mode=colocated")
    algo = lambda k, d=None: _key(cfg, f"actor_rollout_ref.rollout.algo.{k}", d)  # noqa: E731
    pipe = dict(_key(cfg, "actor_rollout_ref.rollout.pipeline", {}) or {})
    num_steps = pipe.get("num_inference_steps") or 10
    window = algo("sde_window_range")
    if isinstance(window, str):  # verl-omni's recipes pass it quoted: sde_window_range="[0,5]"
        try:
            window = json.loads(window)
        except json.JSONDecodeError:
            raise ValueError(f"actor_rollout_ref.rollout.algo.sde_window_range={window!r}: give two ints, e.g. "
                             "[0,5]") from None
    rollout_cfg = RolloutConfig(
        num_inference_steps=int(num_steps), sde_type=algo("sde_type", "sde"), noise_level=float(algo("noise_level", 0.7)),
        timestep_selection=algo("timestep_selection") or auto_selection(algorithm, algo("sde_window_size")),
        timestep_fraction=float(_key(cfg, "algorithm.timestep_fraction", 0.99)),
        sde_window_size=int(algo("sde_window_size") or 0),
        sde_window_range=tuple(window) if window is not None else None,
        seed=int(_key(cfg, "actor_rollout_ref.rollout.seed", 0) or 0),
        init_same_noise=bool(algo("init_same_noise", False)),
    )
    if rollout_cfg.num_train_steps < 1:
        raise ValueError(f"actor_rollout_ref.rollout.algo.sde_type={rollout_cfg.sde_type!r} trains no step; use sde, "
                         "cps or dance_sde for training")
    model = dict(_key(cfg, "actor_rollout_ref.model", {}) or {})
    lora = LoraConfig.from_dict(model)
    pipeline = PipelineConfig.from_dict({k: v for k, v in pipe.items() if k not in VERL_OMNI_PIPELINE_KEYS})
    dtype = {"fp32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16", "float32": "float32",
             "fp16": "float16", "float16": "float16"}
    model_dtype = _key(cfg, "actor_rollout_ref.actor.fsdp_config.model_dtype", "fp32")
    if model_dtype not in dtype:
        raise ValueError(f"actor_rollout_ref.actor.fsdp_config.model_dtype={model_dtype!r}; valid: {sorted(dtype)}")
    policy = PolicySpec(model_path=str(path), lora=lora, pipeline=pipeline, rollout=rollout_cfg,
                        dtype=dtype[model_dtype], start_version=start_step,
                        device=_device(cfg, digenrl), engine=engine)

    actor = lambda k, d=None: _key(cfg, f"actor_rollout_ref.actor.{k}", d)  # noqa: E731
    loss = LossConfig(clip_ratio=float(actor("diffusion_loss.clip_ratio", 1e-4)),
                      kl_coef=float(actor("kl_loss_coef", 0.0)) if actor("use_kl_loss", False) else 0.0,
                      kl_type=actor("kl_loss_type", "flow_grpo"))
    optim = OptimSpec(lr=float(actor("optim.lr", 1e-4)), weight_decay=float(actor("optim.weight_decay", 1e-4)),
                      betas=tuple(actor("optim.betas", [0.9, 0.999])), eps=float(actor("optim.eps", 1e-8)),
                      grad_clip=actor("grad_clip", 1.0))
    recompute = _key(cfg, "actor_rollout_ref.rollout.recompute_old_log_probs")
    if recompute is None:  # auto: the diffusers fp32 path shares the trainer's numerics
        recompute = backend != "diffusers" or policy.dtype != "float32"
    train = TrainSpec(loss=loss, optim=optim, tsp_chunk_size=digenrl.tsp_chunk_size,
                      recompute_old_log_probs=bool(recompute), sharding=_sharding(cfg, digenrl, int(n)))

    custom = dict(_key(cfg, "reward.custom_reward_function", {}) or {})
    reward_fns = _key(cfg, "reward.reward_functions")
    if reward_fns is None:  # the YAML default (a dict default would be struct: no other name could be set)
        reward_fns = {} if custom.get("path") else dict(DEFAULT_REWARD)
    reward_fns = dict(reward_fns)
    reward = RewardConfig(reward_functions=reward_fns, aggregation=_key(cfg, "reward.aggregation", "weighted_sum"),
                          custom_reward_function_path=custom.get("path"),
                          custom_reward_function_name=custom.get("name") or "compute_score")
    from digenrl_verl.rewards.base import get_reward, reward_names

    for name in reward.weights():
        if name == "custom":
            continue
        if name not in reward_names():
            get_reward(name)  # ValueError listing the valid reward names
        if name == "ocr":  # checked without loading the OCR models (that happens on the generators)
            import importlib.util

            from digenrl_verl.rewards.ocr import INSTALL_HINT

            if importlib.util.find_spec("rapidocr_onnxruntime") is None:
                raise ValueError(f"reward.reward_functions names 'ocr': {INSTALL_HINT}")
    if reward.custom_reward_function_path and not Path(reward.custom_reward_function_path).is_file():
        raise ValueError(f"reward.custom_reward_function.path={reward.custom_reward_function_path!r} is not a file")

    advantage = AdvantageConfig(global_std=bool(_key(cfg, "algorithm.global_std", False)),
                                norm_adv_by_std=bool(_key(cfg, "algorithm.norm_adv_by_std_in_grpo", True)),
                                adv_clip_max=actor("diffusion_loss.adv_clip_max", 5.0))

    total = _key(cfg, "trainer.total_training_steps")
    if not isinstance(total, int) or total < 1:
        raise ValueError(f"trainer.total_training_steps={total!r} must be a positive number of global steps")
    num = total - start_step
    if num < 1:
        raise ValueError(f"trainer.total_training_steps={total} is already reached by the checkpoint (step "
                         f"{start_step}); raise it to continue training")
    schedule = digenrl.schedule_config(num_steps=num, start_step=start_step, prompts_per_step=prompts, n=n)
    return RunSpec(cfg=cfg, digenrl=digenrl, schedule=schedule, policy=policy, train=train, reward=reward,
                   advantage=advantage, prompts_per_step=prompts, n=n, num_steps=num, architecture=architecture,
                   start_step=start_step)
