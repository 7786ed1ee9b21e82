"""The run configuration: the composed Hydra tree (verl-omni's key layout) → one validated, typed `RunSpec`.

Everything a run needs is checked here, before any worker starts, and every error names the key as the user
writes it, the bad value and the fix. `build_run` is a short composition of per-component builders; the
translation of verl-omni's keys, and the classification of every key (implemented / no effect, warned /
unsupported, rejected), live in `digenrl_verl.config.verl_omni` and nowhere else. `trainer.digenrl.dry_run=true`
runs exactly this and prints the resolved plan and pools.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig

from digenrl_verl.config.digenrl import DigenRLConfig
from digenrl_verl.config.runtime import CheckpointSpec, DataSpec, LoggingSpec, ValidationSpec
from digenrl_verl.config.verl_omni import (RecipeKeys, build_advantage, build_checkpoint, build_data, build_digenrl,
                                           build_layout, build_logging, build_model, build_negative_prompt,
                                           build_policy, build_shape, build_train, build_trainer_engine,
                                           build_validation, check_unsupported, differences, honour_global_std,
                                           trainer_engine_of, warn_no_effect, warn_unknown)
from digenrl_verl.config.verl_omni_reward import build_reward
from digenrl_verl.diffusion.advantages import AdvantageConfig
from digenrl_verl.rewards.compose import RewardConfig
from digenrl_verl.schedule.config import PoolSpec, ScheduleConfig
from digenrl_verl.schedule.plan import planner_for, step_microbatches
from digenrl_verl.trainer.data import load_negative_prompts, load_prompts
from digenrl_verl.workers.specs import HostConfig, PolicySpec, TrainSpec

# the schedule's pool names per role of `trainer.digenrl.pools`
SCHEDULE_POOL_NAMES = {"colocated": "col", "generator": "gen", "trainer": "trn"}


@dataclass(frozen=True)
class RunSpec:
    """Everything a run is built from (the resolved, validated config).

    Attributes:
        digenrl: the `trainer.digenrl` section; `schedule`: what the driver runs (settings + shape).
        policy / train / reward: the worker specs. `advantage`: group normalisation.
        data / logging / checkpoint / validation: the runner's prompts, trackers, checkpoints and validation runs.
        prompts_per_step, n: step batch shape; num_steps: global steps to run from `start_step`.
        architecture: the model's `_class_name`.
        decisions: what the config layer decided for the user (fall-backs, coercions, derived pools), printed.
        differences: `key=ours (verl-omni: theirs): why` for the keys left at a default that differs from verl-omni's.
        resolved: every config key the run uses (flat dotted names), with the value it uses (`plan()`, plan.json).
    """

    digenrl: DigenRLConfig
    schedule: ScheduleConfig
    policy: PolicySpec
    train: TrainSpec
    reward: RewardConfig
    advantage: AdvantageConfig
    data: DataSpec
    logging: LoggingSpec
    checkpoint: CheckpointSpec
    prompts_per_step: int
    n: int
    num_steps: int
    architecture: str
    start_step: int = 0
    validation: ValidationSpec = ValidationSpec()
    decisions: tuple[str, ...] = ()
    differences: tuple[str, ...] = ()
    resolved: Mapping[str, Any] = field(default_factory=dict)

    @property
    def output_dir(self) -> Path:
        return Path(self.digenrl.output_dir)

    def describe(self) -> str:
        """The resolved plan and pools (what `dry_run` prints)."""
        s = self.schedule
        pools = ", ".join(f"{role}: {p.size} worker(s){' on ' + p.placement if p.placement else ''}"
                          f"{f' at {p.gpu_fraction} GPU each' if p.shares_a_device else ''}"
                          for role, p in ((r, self.digenrl.pools[r]) for r in self.digenrl.roles))
        engine = self.policy.engine
        generation_dtype = self.policy.dtype if engine.name == "diffusers" else engine.dtype
        trainer = self._trainer_engine()
        custom = self.reward.custom_reward_function_path
        lines = [
            f"model: {self.policy.model_path} ({self.architecture}), "
            f"{'LoRA r=' + str(self.policy.lora.rank) if self.policy.lora.enabled else 'full fine-tune'}",
            f"mode: {s.mode}; pools: {pools}",
            f"step: {self.prompts_per_step} prompts x n={self.n} = {self.prompts_per_step * self.n} samples; "
            f"{self.num_steps} global step(s) from step {self.start_step}",
            f"rollout: {self.policy.rollout.num_inference_steps} steps, sde_type={self.policy.rollout.sde_type}, "
            f"noise_level={self.policy.rollout.noise_level}, selection={self.policy.rollout.timestep_selection}, "
            f"K={self.policy.rollout.num_train_steps} trained steps/sample",
            f"schedule: gap={s.gap} pipeline={s.pipeline} tsp={s.tsp.enabled} tag={s.tag.policy}"
            f"{' k=' + str(s.tag.static_k) if s.tag.policy == 'static' else ''} staleness={s.tcss.staleness} "
            f"max_stale_fraction={s.tcss.max_stale_fraction} max_gen_futures={s.tcss.max_gen_futures}",
            *([self._colocated_plan()] if s.mode == "colocated" else []),
            *([self._minibatch_plan()] if s.mini_batches_per_step > 1 else []),
            f"engines: generation {self.policy.engine.name} ({generation_dtype} on {self.policy.device}); "
            f"trainer {trainer}",
            self._loss_line(),
            f"reward: {self.reward.weights()}{f' (custom: {custom})' if custom else ''}",
            f"output: {self.output_dir}",
            *_block("decisions", self.decisions),
            *_block("differences from verl-omni's defaults (keys at this plugin's default, which differs)",
                    self.differences),
        ]
        return "\n".join(lines)

    def _trainer_engine(self) -> str:
        """What trains, as the `engines:` line says it."""
        if self.train.engine == "verl_omni":
            actor = self.train.host_config["actor"]
            fsdp = actor.get("fsdp_config", {})
            strategy = actor.get("strategy")
            engine = "TSP engine" if strategy in ("fsdp", "fsdp2") else "its own engine, per-timestep loop (no TSP)"
            return (f"verl-omni's actor worker ({strategy}, {engine}; sequence parallel "
                    f"{fsdp.get('ulysses_sequence_parallel_size', 1)}, model dtype {fsdp.get('model_dtype')})")
        ranks = self.digenrl.pools["trainer"].size
        sharding = f"FSDP2 (fully_shard) over {ranks} ranks" if self.train.sharding.sharded else \
            "whole model per rank (ddp)"
        return f"{sharding}, model dtype {self.policy.dtype}"

    def _loss_line(self) -> str:
        s = self.schedule
        stale = f"; stale rows: {self._stale_objective()}" if s.tcss.staleness else ""
        old = f"{'recomputed' if self.train.recompute_old_log_probs else 'from rollout'}{self._log_prob_micro()}"
        if self.train.engine == "verl_omni":
            actor = self.train.host_config["actor"]
            loss = actor.get("diffusion_loss", {})
            return (f"loss: verl-omni's {loss.get('loss_mode', 'flow_grpo')} (clip={loss.get('clip_ratio')}){stale}; "
                    f"lr={actor.get('optim', {}).get('lr')}; old log-probs: {old}")
        return (f"loss: clip={self.train.loss.clip_ratio} kl_coef={self.train.loss.kl_coef}{stale}; "
                f"lr={self.train.optim.lr}; old log-probs: {old}")

    def plan(self) -> dict[str, Any]:
        """The machine-readable plan (`plan.json`): the resolved keys, the pools, the schedule, the decisions and the
        differences from verl-omni's defaults."""
        pools = {role: {"size": self.digenrl.pools[role].size, "placement": self.digenrl.pools[role].placement,
                        "use_gpu": self.digenrl.pools[role].use_gpu} for role in self.digenrl.roles}
        return {"config": {k: _jsonable(v) for k, v in self.resolved.items()}, "pools": pools,
                "schedule": {"mode": self.schedule.mode, "num_steps": self.num_steps, "start_step": self.start_step,
                             "prompts_per_step": self.prompts_per_step, "n": self.n,
                             "mini_batches_per_step": self.schedule.mini_batches_per_step,
                             "gap": self.schedule.gap, "pipeline": self.schedule.pipeline,
                             "tsp": self.schedule.tsp.enabled, "tag": self.schedule.tag.policy,
                             "staleness": self.schedule.tcss.staleness},
                "architecture": self.architecture, "trainer_engine": self.train.engine,
                "decisions": list(self.decisions),
                "differences_from_verl_omni": list(self.differences)}

    def write_plan(self, path: str | Path | None = None) -> Path:
        """Write `plan()` as JSON (default: `<output_dir>/plan.json`); returns the path."""
        path = Path(path) if path is not None else self.output_dir / PLAN_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.plan(), indent=1, sort_keys=True) + "\n")
        return path

    def _minibatch_plan(self) -> str:
        s = self.schedule
        ranks = s.minibatch_dp_ranks
        cut = ("in order" if ranks == 1 else f"cut as verl cuts them over {ranks} data-parallel ranks: mini-batch j "
               "is every trainer rank's j-th block of its share of the batch")
        return (f"{s.mini_batches_per_step} optimizer steps per global step (ppo_mini_batch_size="
                f"{s.prompts_per_step // s.mini_batches_per_step} prompts each, {cut}; the weights reach the "
                "generators after the last)")

    def _stale_objective(self) -> str:
        cap = self.train.loss.stale_is_cap
        return "clipped against the behaviour policy" if cap is None else f"decoupled, is_cap={cap}"

    def _colocated_plan(self) -> str:
        """The colocated plan's micro-batches (`schedule.plan.ColocatedPlanner`), as the driver will cut them."""
        s = self.schedule
        ranks = s.pools[s.trainer_pool].size
        mbs = step_microbatches(planner_for(s), s.start_step, s.prompts_per_step, s.n, ranks, s.mini_batches_per_step,
                                s.minibatch_dp_ranks)
        sizes = sorted({len(part) for mb in mbs for part in mb.split}, reverse=True)
        micro = "null (a rank's whole share)" if s.micro_batch_size is None else s.micro_batch_size
        busy = sorted({len(mb.split) for mb in mbs})
        return (f"colocated micro-batches: ppo_micro_batch_size_per_gpu={micro} -> {len(mbs)} per step of "
                f"{'/'.join(map(str, sizes))} sample(s) per rank; ranks busy in each: "
                f"{'-'.join(map(str, busy))} of {ranks}")

    def _log_prob_micro(self) -> str:
        size = self.train.log_prob_micro_batch_size
        if not self.train.recompute_old_log_probs or size is None:
            return ""
        return f" in micro-batches of {size} sample(s) per rank"


PLAN_FILE = "plan.json"


def _jsonable(value: Any) -> Any:
    if is_dataclass(value):
        value = asdict(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _block(title: str, items: tuple[str, ...]) -> list[str]:
    return [f"{title}:", *(f"  - {item}" for item in items)] if items else []


def schedule_of(digenrl: DigenRLConfig, **shape) -> ScheduleConfig:
    """The driver's config: the section's scheduling settings with the run's pools and shape."""
    pools = {SCHEDULE_POOL_NAMES[role]: PoolSpec(digenrl.pools[role].size, digenrl.pools[role].placement)
             for role in digenrl.roles}
    return ScheduleConfig.of(digenrl, pools=pools, **shape)


def negative_prompt_columns(data: DataSpec, validation: ValidationSpec) -> dict[str, dict[str, list[str] | None]]:
    """Each prompt file's negative prompt column (`load_negative_prompts`), by setting: the training files, and the
    validation files where validation runs on files of its own."""
    settings = {"data.train_files": data.train_files}
    if validation.enabled and data.val_files is not None:
        settings["data.val_files"] = data.val_files
    return {key: load_negative_prompts(files, data.negative_prompt_key, data.prompt_key, key=key)
            for key, files in settings.items()}


def warn_barrier_every_step(keys: RecipeKeys, digenrl: DigenRLConfig, periods: Mapping[str, int]) -> None:
    """TCSS staleness 1 with a barrier after every step (a checkpoint, `trainer.save_freq=1`, or a validation,
    `trainer.test_freq=1`) never runs a step ahead: the driver plans no step past a barrier whose work has not ended
    (`schedule.driver`), so every sample is on-policy. Warned by name and said in the plan."""
    every_step = [k for k, every in periods.items() if every == 1]
    if digenrl.tcss.staleness > 0 and every_step:
        note = (f"trainer.digenrl.tcss.staleness={digenrl.tcss.staleness} has no effect with {every_step[0]}=1: a "
                "checkpoint or validation after every step is a barrier that drains the pipeline, so generation "
                f"never runs a step ahead (every sample on-policy); set {every_step[0]} above 1 (or -1) for TCSS to "
                "overlap steps")
        warnings.warn(note, UserWarning, stacklevel=3)
        keys.decide(f"{note} (warned)")


def build_run(cfg: DictConfig, *, start_step: int = 0, host: HostConfig | None = None) -> RunSpec:
    """Validate `cfg` and build the run's specs. Raises ValueError naming the key, the value and the fix.

    `host`: what verl-omni composed (`HostConfig`) when the run comes from verl-omni's entry point; its actor worker
    then trains (`trainer.digenrl.trainer_engine`) and the generators sample its σ schedules."""
    keys = RecipeKeys(cfg)
    section = build_digenrl(keys)
    engine = trainer_engine_of(section, host)  # verl-omni's actor worker reads its keys itself (HOST_TRAINER_KEYS)
    check_unsupported(keys, engine)
    warn_no_effect(keys, engine)
    digenrl, deferred_std = honour_global_std(keys, build_layout(keys, section), engine)
    model = build_model(keys)
    policy = build_policy(keys, digenrl, path=model.path, algorithm=model.algorithm, start_version=start_step)
    if engine == "verl_omni" and host is not None and host.sigma_schedules:  # verl-omni's schedules, sampled
        policy = replace(policy, pipeline=replace(policy.pipeline, host_sigmas=host.sigma_schedules))
    data = build_data(keys)
    shape = build_shape(keys, digenrl, len(load_prompts(data.train_files, data.prompt_key)[0]))  # verl's epochs
    train = build_trainer_engine(keys, digenrl, build_train(keys, digenrl, policy, shape.n, shape.total_steps, engine),
                                 host)
    reward = build_reward(keys, digenrl)
    advantage = build_advantage(keys, deferred_std)
    checkpoint = build_checkpoint(keys)
    validation = build_validation(keys, data, policy.rollout)
    policy = replace(policy, pipeline=build_negative_prompt(keys, policy.pipeline, model.architecture,
                                                            data.negative_prompt_key,
                                                            negative_prompt_columns(data, validation)))
    num_steps = shape.total_steps - start_step
    if num_steps < 1:
        raise ValueError(f"trainer.total_training_steps={shape.total_steps} is already reached by the checkpoint "
                         f"(step {start_step}); raise it to continue training")
    logging = build_logging(keys)
    warn_barrier_every_step(keys, digenrl, {"trainer.save_freq": checkpoint.every,
                                            "trainer.test_freq": validation.every})
    warn_unknown(keys)  # after every builder: the keys nothing read are known now
    schedule = schedule_of(digenrl, num_steps=num_steps, start_step=start_step, prompts_per_step=shape.prompts,
                           n=shape.n, checkpoint_every=checkpoint.every, micro_batch_size=shape.micro_batch_size,
                           mini_batches_per_step=shape.mini_batches, opt_waits_for_step=deferred_std,
                           validate_every=validation.every)
    return RunSpec(digenrl=digenrl, schedule=schedule, policy=policy, train=train, reward=reward, advantage=advantage,
                   data=data, logging=logging, checkpoint=checkpoint, validation=validation,
                   prompts_per_step=shape.prompts, n=shape.n, num_steps=num_steps, architecture=model.architecture,
                   start_step=start_step, decisions=tuple(keys.decisions), differences=tuple(differences(keys)),
                   resolved=keys.resolved())
