"""The verl workers of a DigenRL run. Small roles composed from capabilities:

- `GenerationMixin` holds a rollout engine (`engines.base.RolloutEngine`) and serves `generate` with it; the
                   policy version a worker holds is its engine's;
- `SamplingMixin`  the policy in this process, sampled through a `DiffusersEngine` over it: trainers (TAG) and
                   colocated workers, which also train that policy and evaluate it;
- `ScoringMixin`   holds the reward and scores decoded samples (`score`): generators (the reward sits with the
                   generator), colocated workers, and trainers when no generator is left;
- `TrainingMixin`  holds the optimizer and accumulates TSP / per-timestep gradients (`update`, `opt_step`).

`GeneratorWorker = Generation + Scoring`, holding the engine `actor_rollout_ref.rollout.name` names (`diffusers`:
its own copy of the policy; with `vllm_omni`, verl-omni's rollout: its replicas or its in-process pipeline, engines
`verl_omni_replica` / `verl_omni` in `integrations`, bound on first use); `TrainerWorker = Sampling + Training
(+ send_weights, + lazy Scoring)`, `ColocatedWorker = TrainerWorker` with its reward built up front. The runtime calls
these methods on individual actors (`actor.method.remote`) as the schedule dictates; worker-group-wide methods
(`join`, `checksum`, ...) use verl's `@register` dispatch.

DataProto keys produced by `generate` (B samples, K trained steps, latent shape L; its third return is a small dict
of facts, the only part the driver fetches):

| key | dtype / shape | meaning |
|---|---|---|
| `latents` | fp32 [B, K, *L] | x at σ of each trained step |
| `next_latents` | fp32 [B, K, *L] | x' the SDE step drew |
| `sigmas`, `next_sigmas` | fp32 [B, K] | σ and σ' of each trained step |
| `rollout_log_probs` | fp32 [B, K] | log-prob of x' under the sampling policy |
| `step_index` | int64 [B, K] | index of the step in the sampling schedule |
| `policy_version` | int64 [B] | the weights version that generated the sample |
| `sample_id` | int64 [B] | row of the step batch (prompt i // n, sample i % n) |
| non-tensor `raw_prompt`, `uid`, `sample_index`, `data_source` | object [B] | carried from the step batch |
| meta `sde_type`, `noise_level`, `global_step` | | how it was sampled |

and a second DataProto for scoring: `responses` uint8 [B, 3, H, W] (video [B, T, 3, H, W]), `sample_id`,
non-tensor `raw_prompt`, `data_source`. Prompt embeddings are not shipped: the trainer re-encodes `raw_prompt`
with its own (frozen, identical) text encoders, which costs less than moving embeddings between pools.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import time
from typing import Any, Callable

import psutil
import ray
import torch
from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import Trajectory, rollout
from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients, compute_log_probs, count_passes
from digenrl_verl.engines.base import ENGINES, RolloutEngine, RolloutRows
from digenrl_verl.engines.diffusers import DiffusersEngine, load_policy
from digenrl_verl.rewards.compose import RewardConfig, build_reward
from digenrl_verl.weights.state import load_trainer_state, save_trainer_state, swapped_in
from digenrl_verl.weights.sync import CollectiveSpec, Collectives, state_checksum
from digenrl_verl.workers.batch import TRAJECTORY_KEYS, concat_rows, generation_batches, reward_extras
from digenrl_verl.workers.calls import unpack
from digenrl_verl.workers.dispatch import ROWS_KEY, assigned_dispatch_mode
from digenrl_verl.workers.judge import RemoteJudge
from digenrl_verl.workers.sharding import (FullyShardedDataParallel, GradientSync, ReplicatedDataParallel,
                                           full_state)
from digenrl_verl.workers.specs import OptimSpec, PolicySpec, TrainSpec

#: meta_info key of `evaluate`'s batch: the RolloutConfig its samples are drawn with (validation's `val_kwargs`)
SAMPLING_KEY = "digenrl_sampling"

_T_IMPORTED = time.time()  # the worker's imports are done once this module is (start-up timings)

#: the engine classes this layer binds to their names in `ENGINES` (verl-omni's engines bind on first use)
ENGINE_CLASSES = (DiffusersEngine,)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def check_generation_version(worker: Any, version: int) -> None:
    """A GEN/TAG task names the version its trajectories must carry; the worker must hold exactly that one."""
    if version != worker.version:
        raise RuntimeError(f"{type(worker).__name__} rank {worker.rank} holds policy version {worker.version} but the "
                           f"schedule asked for version {version}: a trajectory must carry one version")


def check_device(worker: Any, spec: PolicySpec) -> None:
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{type(worker).__name__} rank {worker.rank} was asked for cuda but sees no GPU "
                           "(is its pool declared with use_gpu=true?)")


def build_engine(policy: PolicySpec) -> RolloutEngine:
    """A generator's engine, the one `policy.engine.name` (`actor_rollout_ref.rollout.name`) names."""
    return ENGINES.engine_class(policy.engine.name).from_policy(policy)


class GenerationMixin:
    """Holds a rollout engine and turns what it samples into the `generate` DataProtos (module docstring)."""

    engine: RolloutEngine
    policy_spec: PolicySpec
    busy_s: float

    @property
    def version(self) -> int:
        """The policy version held: the engine's."""
        return self.engine.version

    @version.setter
    def version(self, value: int) -> None:
        self.engine.version = value

    #: a colocated engine's switch before the last `sampling_engine`: ((phase, seconds), ...), sent with its samples
    switch_phases: tuple = ()

    def sampling_engine(self) -> RolloutEngine:
        """The engine `generate` samples with: this worker's own."""
        return self.engine

    def lockstep_rows(self, rows: int) -> int:
        """The rows every rank's `generate` must draw for its forwards to match the other ranks' (0: no constraint)."""
        return 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def current_version(self) -> int:
        """The policy version held (never a collective, unlike `checksum`)."""
        return self.version

    def generate_call(self, shard: DataProto, message: bytes) -> tuple[DataProto, DataProto, dict]:
        """The executor's GEN / TAG_GEN call: `generate(shard, sample_ids, version)`, the ids and version packed in
        one message (`workers.calls`)."""
        return self.generate(shard, *unpack(message))

    def generate(self, shard: DataProto, sample_ids: list[int], version: int) -> tuple[DataProto, DataProto, dict]:
        """Sample the trajectories of `shard`'s rows with the current weights, which must be `version`.

        Three returns: the trajectories (for UPDATE), the decoded samples (for SCORE) and a few facts (`samples`,
        `version`), the only one the driver reads: the data stays in Ray's object store until a later task reads it.
        """
        check_generation_version(self, version)
        t0 = time.perf_counter()
        nt = shard.non_tensor_batch
        rows = RolloutRows(list(nt["raw_prompt"]), [str(u) for u in nt["uid"]], [int(i) for i in nt["sample_index"]],
                           list(sample_ids), int(shard.meta_info["global_step"]))
        engine = self.sampling_engine()
        t_sample = time.perf_counter()
        pad = self.lockstep_rows(len(rows)) if engine is self.engine else 0
        out = engine.generate(rows, min_rows=pad) if pad else engine.generate(rows)
        t_sampled = time.perf_counter()
        got = sorted(set(out.tensors["policy_version"].tolist()))
        if got != [version]:
            raise RuntimeError(f"the {self.policy_spec.engine.name} engine of {type(self).__name__} rank {self.rank} "
                               f"sampled with versions {got}, the schedule asked for {version}")
        cfg = self.policy_spec.rollout
        trajectories, images = generation_batches(out.tensors, out.images, shard, sample_ids, cfg.sde_type,
                                                  float(cfg.noise_level))
        self.busy_s += time.perf_counter() - t0
        facts = {"samples": len(sample_ids), "version": version}
        switch = self.switch_phases if engine is not self.engine else None
        if switch is not None:  # a colocated rollout engine (hybrid): its switch and generation, for the trace
            facts.update(engine="hybrid", switch_s=sum(s for _, s in switch),
                         phases=(*switch, ("generate", t_sampled - t_sample)))
        return trajectories, images, facts


class SamplingMixin(GenerationMixin):
    """The policy (a `DiffusionAdapter`) in this process, sampled through a `DiffusersEngine` over it."""

    engine: DiffusersEngine
    grad_sync: GradientSync | None = None  # a trainer's, once joined (TrainingMixin); a sampler alone has none
    scorer: Any  # ScoringMixin's (on a trainer: built on first use, see `_scorer`)
    reward_spec: RewardConfig

    def _build_policy(self, spec: PolicySpec, torch_threads: int, *, keep_reference: bool = False) -> None:
        """Load the policy. `keep_reference`: see `engines.diffusers.load_policy`."""
        torch.set_num_threads(torch_threads)
        check_device(self, spec)
        self.policy_spec = spec
        self.device = torch.device(spec.device)
        self.engine = DiffusersEngine(load_policy(spec, keep_reference=keep_reference), spec.rollout,
                                      spec.start_version)
        self.busy_s = 0.0

    @property
    def adapter(self) -> Any:
        return self.engine.adapter

    def sampling_engine(self) -> RolloutEngine:
        """The policy's diffusers engine, or, when the generators' engine runs colocated (`RolloutEngineSpec.
        colocated`: verl-omni's rollout pipeline), a copy of that engine in this process, built on first use, which
        gets the trained weights whenever it samples at a new version (verl-omni's hybrid engine: wake up, weight
        sync, generate; the time is part of the TAG task's, so BTS measures it)."""
        spec = self.policy_spec
        if not spec.engine.colocated:
            return self.engine
        if self.lockstep:
            raise RuntimeError("a colocated rollout engine on sharded trainer ranks is not supported (the config "
                               "allows it with one trainer rank only)")
        colocated = getattr(self, "_colocated_engine", None)
        phases, t0, fresh = [], time.perf_counter(), colocated is None
        if fresh:  # first use: the pipeline is built (from the model directory: the trained weights follow)
            colocated = build_engine(dataclasses.replace(spec, start_version=self.version))
            self._colocated_engine = colocated
            phases.append(("wake", time.perf_counter() - t0))
        if fresh or colocated.version != self.version:
            t1 = time.perf_counter()
            colocated.hand_over(self.full_trainable(), self.version)
            phases.append(("sync", time.perf_counter() - t1))
        self.switch_phases = tuple(phases)
        return colocated

    def trainable(self) -> dict[str, torch.Tensor]:
        """The trainable parameters as this rank holds them (shards under FSDP2)."""
        return self.engine.trainable()

    def full_trainable(self) -> dict[str, torch.Tensor]:
        """The whole trainable weights, detached (a collective on sharded trainers: every trainer rank calls it)."""
        if self.grad_sync is None:
            return {k: v.detach() for k, v in self.trainable().items()}
        return full_state(self.grad_sync, self.trainable())

    @property
    def lockstep(self) -> bool:
        """True on sharded (FSDP2) trainers: every forward is a collective over the trainer ranks."""
        return bool(self.grad_sync is not None and self.grad_sync.lockstep)

    def lockstep_rows(self, rows: int) -> int:
        """Sharded trainer ranks drawing each sample alone (`RolloutConfig.rows_alone`) run one set of forwards per
        row, so a rank with a smaller share of a TAG micro-batch pads to the largest share: the maximum over the
        trainer ranks (a collective: a TAG task calls every trainer rank). 0 otherwise (batched sampling runs the
        same forwards whatever the share)."""
        if not (self.lockstep and self.engine.rollout.rows_alone):
            return 0
        group = self.collectives.trainer_group
        count = torch.tensor([rows], dtype=torch.int64,
                             device=self.device if torch.distributed.get_backend(group) == "nccl" else "cpu")
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX, group=group)
        return int(count.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def checksum(self) -> dict[str, Any]:
        """Version and sha256 of the trainable weights (weight-sync checks), plus peak RSS."""
        return {"version": self.version, "checksum": state_checksum(self.full_trainable()), "rss_mb": _rss_mb(),
                "busy_s": self.busy_s}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v.cpu().clone() for k, v in self.full_trainable().items()}

    @register(dispatch_mode=assigned_dispatch_mode())
    def evaluate(self, shard: DataProto) -> DataProto:
        """Samples of the shard's rows (`sample_index`: a prompt's j-th sample) with the current weights, scored:
        drawn as `meta_info[SAMPLING_KEY]` says (a RolloutConfig: validation's steps, noise, seed), else
        deterministic (ODE, noise 0) with the rollout's settings. Each row's noise comes from its SampleKey.

        Called on a whole worker group as `wg.evaluate(batch, assignment)`: the DIGENRL_ASSIGNED dispatch
        mode splits the batch by the assignment and gathers the results back in row order. Output keys:
        `eval_reward` fp32 [B], `responses` uint8 [B, 3, H, W]."""
        nt = shard.non_tensor_batch
        cfg = shard.meta_info.get(SAMPLING_KEY) or dataclasses.replace(self.policy_spec.rollout, sde_type="ode",
                                                                        noise_level=0.0)
        if len(shard) == 0:
            if self.lockstep:  # the other trainer ranks' forwards are collectives: take part with a dummy sample
                rollout(self.adapter, self.adapter.encode_prompts([""]), [SampleKey(-1, "pad", 0)], cfg)
            return DataProto.from_dict(tensors={"eval_reward": torch.zeros(0)}, meta_info=dict(shard.meta_info))
        keys = [SampleKey(-1, str(u), int(i)) for u, i in zip(nt["uid"], nt["sample_index"])]
        traj = rollout(self.adapter, self.adapter.encode_prompts(list(nt["raw_prompt"])), keys, cfg)
        images = self.adapter.decode(traj.final_latents)
        scorer = self._scorer()
        extra = reward_extras(nt, list(range(len(shard))))
        rewards = scorer(images, list(nt["raw_prompt"]), extra).to(torch.float32)
        return DataProto.from_dict(tensors={"eval_reward": rewards, "responses": images},
                                   meta_info={ROWS_KEY: shard.meta_info[ROWS_KEY]})

    def _scorer(self):
        if self.scorer is None:
            self._build_scorer(self.reward_spec)
        return self.scorer


class ScoringMixin:
    """Holds the reward functions and scores decoded samples. `judges`: the judge pool's actors
    (`workers.judge`), asked through a `RemoteJudge` when the reward has a judge in its own pool; else None."""

    judges: list | None
    scorer: Any = None

    def _build_scorer(self, spec: RewardConfig) -> None:
        judge = RemoteJudge(self.judges, first=self.rank) if self.judges else None
        self.scorer = build_reward(spec, judge)

    def score_call(self, message: bytes, *image_parts: DataProto) -> dict[str, Any]:
        """The executor's SCORE call: `score(sample_ids, *image_parts)`, the sample ids packed in one message
        (`workers.calls`), the decoded samples as object refs."""
        return self.score(*unpack(message), *image_parts)

    def score(self, sample_ids: list[int], *image_parts: DataProto) -> dict[str, Any]:
        t0 = time.perf_counter()
        data = concat_rows(image_parts, sample_ids)
        nt = data.non_tensor_batch
        extra = reward_extras(nt, [int(i) for i in data.batch["sample_id"]])
        scores = self.scorer(data.batch["responses"], list(nt["raw_prompt"]), extra)
        self.busy_s += time.perf_counter() - t0
        return {"sample_ids": list(sample_ids), "scores": [float(x) for x in scores]}


class TrainingMixin:
    """Holds the optimizer; accumulates gradients per micro-batch, steps once per global step."""

    adapter: Any
    version: int
    collectives: Collectives

    def _build_training(self, spec: TrainSpec) -> None:
        """Keep the spec; the model is sharded and the optimizer built in `_build_parallel`, once the trainer
        process group exists (FSDP2 needs it, and the optimizer must see the sharded parameters)."""
        self.train_spec = spec
        self.optimizer = None
        self.lr_factor: Callable[[int], float] | None = None  # global step -> LR factor (`lr_schedule`)
        self.grad_sync: GradientSync | None = None
        self.skipped_steps = 0
        # the weights of `version` while the trainer is between two optimizer steps of one global step (several
        # mini-batches): later mini-batches recompute their old log-probs with them, as verl computes the whole
        # batch's before its first update; empty otherwise
        self.step_start_weights: dict[str, torch.Tensor] = {}

    def _build_parallel(self, collectives: Collectives) -> None:
        spec = self.train_spec
        if spec.sharding.sharded:
            self.grad_sync = FullyShardedDataParallel(self.adapter.transformer, self.adapter.denoiser,
                                                      collectives.trainer_group, spec.sharding, self.device)
        else:
            self.grad_sync = ReplicatedDataParallel(collectives)
        o = spec.optim
        params = list(self.trainable().values())
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                           weight_decay=o.weight_decay)
        self.lr_factor = lr_schedule(self.optimizer, o)
        self.optimizer.zero_grad(set_to_none=True)

    def update_call(self, message: bytes, *traj_parts: DataProto) -> dict[str, float]:
        """The executor's UPDATE call: `update(sample_ids, advantages, loss_denominator, tsp, version, max_share,
        *traj_parts)`, the plain arguments packed in one message (`workers.calls`; the advantages as floats, made the
        fp32 tensor here), the trajectories as object refs. Calls this class's `update` (verl-omni's: its own)."""
        sample_ids, advantages, *rest = unpack(message)
        return self.update(sample_ids, torch.tensor(advantages, dtype=torch.float32), *rest, *traj_parts)

    def update(self, sample_ids: list[int], advantages: torch.Tensor, loss_denominator: float, tsp: bool,
               version: int, max_share: int, *traj_parts: DataProto) -> dict[str, float]:
        """Forward/backward over this rank's share of one micro-batch with weights `version`; grads accumulate.

        `max_share`: the largest share of this micro-batch over the trainer ranks; sharded ranks pad their
        passes up to it (lock-step, see `workers.sharding`)."""
        if version != self.version:
            raise RuntimeError(f"trainer rank {self.rank} holds version {self.version}, the UPDATE expects {version}")
        t0 = time.perf_counter()
        data = concat_rows(traj_parts, sample_ids)
        meta = traj_parts[0].meta_info
        tensors = {k: data.batch[k] for k in TRAJECTORY_KEYS}
        # final_latents are not shipped to the trainer (only the scorer needs the clean sample); training never
        # reads them, so a placeholder of the right shape fills the field
        tensors.update(log_probs=data.batch["rollout_log_probs"], final_latents=data.batch["latents"][:, 0])
        traj = Trajectory.from_tensors(tensors, meta["sde_type"], meta["noise_level"]).to(self.device)
        cond = self.adapter.encode_prompts(list(data.non_tensor_batch["raw_prompt"]))
        tsp_cfg = TSPConfig("batched", self.train_spec.tsp_chunk_size) if tsp else TSPConfig("per_timestep")
        passes = count_passes(max_share, traj.num_steps, tsp_cfg) if self.lockstep else 0
        old = traj.log_probs
        if self.train_spec.recompute_old_log_probs:
            fresh = data.batch["policy_version"] == self.version
            if bool(fresh.any()) or self.lockstep:  # lock-step ranks all run the pass, needed or not
                old = old.clone()
                with self._weights_of_version():
                    old[fresh] = self._old_log_probs(cond, traj, tsp_cfg, max_share)[fresh]
        stale = data.batch["policy_version"] < self.version  # TCSS rows: clip stats apart (`LossStats`)
        stats = accumulate_gradients(self.adapter, cond, traj, advantages.to(self.device, torch.float32),
                                     self.train_spec.loss, tsp_cfg, loss_denominator, old_log_probs=old,
                                     min_passes=passes, stale=stale)
        self.busy_s += time.perf_counter() - t0
        return dict(vars(stats))  # LossStats sums: the driver side merges them across micro-batches and ranks

    def _weights_of_version(self):
        """The weights of `self.version` in place for the block: after a mini-batch's optimizer step (the global
        step's earlier ones) the step-start weights are swapped in, and the current ones back after."""
        return swapped_in(self.trainable(), self.step_start_weights)

    def _old_log_probs(self, cond: Any, traj: Trajectory, tsp_cfg: TSPConfig, max_share: int) -> torch.Tensor:
        """The recompute pass: log-probs [B, K] under the current weights, in chunks of
        `log_prob_micro_batch_size` samples (verl-omni's `rollout.log_prob_micro_batch_size_per_gpu`; None: all B at
        once). Lock-step (FSDP2) ranks pad to the passes the largest share (`max_share`) runs."""
        size = self.train_spec.log_prob_micro_batch_size or max(traj.batch_size, max_share, 1)
        k = traj.num_steps

        def passes_of(samples: int) -> int:
            return sum(count_passes(min(size, samples - i), k, tsp_cfg) for i in range(0, samples, size))

        target = passes_of(max_share) if self.lockstep else 0
        starts = range(0, traj.batch_size, size)
        out, done = [], 0
        for j, first in enumerate(starts):
            idx = torch.arange(first, min(first + size, traj.batch_size))
            pad = target - done if j == len(starts) - 1 else 0
            out.append(compute_log_probs(self.adapter, cond.index_select(idx), traj.index_select(idx),
                                         tsp_cfg=tsp_cfg, min_passes=pad))
            done += count_passes(len(idx), k, tsp_cfg)
        return torch.cat(out)

    def accumulated_gradients(self) -> dict[str, torch.Tensor]:
        """This rank's gradients accumulated since the last optimizer step, before the all-reduce (FSDP2: this
        rank's shards), on the CPU; parameters without a gradient are left out. Actor calls run in order, so called
        just before an OPT_STEP it returns what that step will reduce (inspection, equivalence tests)."""
        out = {}
        for name, p in self.trainable().items():
            if p.grad is not None:
                grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                out[name] = grad.detach().to("cpu", copy=True)
        return out

    def save_checkpoint(self, path: str) -> int:
        """Rank 0 writes weights, optimizer moments and RNG into `path`; returns the version saved. Every
        trainer rank is called (sharded ranks take part in the gathers of whole tensors).

        Actor calls run one at a time, so this sees the state after the last completed optimizer step
        (gradients accumulated since are transient and not saved)."""
        if self.rank == 0 or self.lockstep:
            save_trainer_state(path, self.trainable(), self.optimizer, full=self.grad_sync.full, write=self.rank == 0)
        return self.version

    def load_checkpoint(self, path: str, version: int) -> int:
        load_trainer_state(path, self.trainable(), self.optimizer, place=self.grad_sync.place)
        self.optimizer.zero_grad(set_to_none=True)
        self.version = version
        return version

    def opt_step(self, version: int, grad_scale: float = 1.0) -> dict[str, float]:
        """All-reduce the accumulated gradients, scale them by `grad_scale` (the deferred global std's 1/(σ + ε),
        `diffusion.advantages`; before the clip, so the clip sees the barrier's gradient), clip, step; the weights
        become `version`: ``self.version + 1`` at a global step's last optimizer step, ``self.version`` at the step
        of one of its earlier mini-batches (versions count global steps, `ScheduleConfig.mini_batches_per_step`)."""
        if version not in (self.version, self.version + 1):
            raise RuntimeError(f"trainer rank {self.rank} at version {self.version} asked to produce version {version} "
                               f"(want {self.version + 1}, or {self.version} for a mini-batch's optimizer step)")
        t0 = time.perf_counter()
        params = list(self.trainable().values())
        self.grad_sync.reduce_grads(params)
        grads = [p.grad for p in params if p.grad is not None]
        if grad_scale != 1.0:
            for g in grads:
                g.mul_(grad_scale)
        clip = self.train_spec.optim.grad_clip
        norm = 0.0
        if grads:
            # the global norm (all-reduced over shards under FSDP2) is finite iff every gradient is, so every rank
            # takes the same decision; with a non-finite norm no step is taken and the gradients are dropped
            total = torch.nn.utils.clip_grad_norm_(params, clip if clip is not None else math.inf)
            norm = float(self.grad_sync.full(total))
        finite = math.isfinite(norm)
        if version == self.version and not self.step_start_weights and self.train_spec.recompute_old_log_probs:
            with torch.no_grad():  # the step's first mini-batch: keep `version`'s weights for the later recomputes
                self.step_start_weights = {name: p.detach().clone() for name, p in self.trainable().items()}
        elif version == self.version + 1:
            self.step_start_weights = {}
        lr = self.train_spec.optim.lr * self.lr_factor(self.version)  # global step `self.version`'s rate
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if grads and finite:
            self.optimizer.step()
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.version = version
        self.busy_s += time.perf_counter() - t0
        return {"grad_norm": norm, "skipped": float(not (grads and finite)),
                "version": float(version), "lr": lr}


def lr_schedule(optimizer: torch.optim.Optimizer, optim: OptimSpec) -> Callable[[int], float]:
    """The learning-rate factor of global step k (0-based), from verl's own schedules (constant or cosine, with
    warm-up), as verl-omni's actor builds them (`_build_lr_scheduler`). Stateless in k, so a resumed trainer is on the
    schedule by its version alone."""
    if optim.lr_scheduler_type == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=optim.warmup_steps)
    else:
        scheduler = get_cosine_schedule_with_warmup(
            optimizer, num_warmup_steps=optim.warmup_steps, num_training_steps=optim.total_steps,
            min_lr_ratio=optim.min_lr_ratio, num_cycles=optim.num_cycles, zero_indexed_step=optim.zero_indexed_step)
    return scheduler.lr_lambdas[0]


def process_start() -> float:
    """Wall-clock time this process started (its spawn, as the OS saw it)."""
    return float(psutil.Process().create_time())


class _Base(Worker):
    role = "base"

    def __init__(self) -> None:
        super().__init__()
        # wall-clock marks of this worker's start-up (`startup_timings`): process start, imports done, __init__, ...
        self._startup: dict[str, float] = {"process_start": process_start(), "imported": _T_IMPORTED,
                                           "init_start": time.time()}

    def _startup_mark(self, name: str) -> None:
        self._startup[name] = time.time()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def startup_timings(self) -> dict[str, float]:
        """Wall-clock (time.time) marks: process_start, imported (this module's imports done), init_start, model_loaded,
        init_end, and join_start / join_end once joined."""
        return dict(self._startup)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def placement(self) -> tuple[str, list[str]]:
        """(Ray node id, the GPU ids Ray gave this worker; none on CPU): where a colocated judge can share devices."""
        context = ray.get_runtime_context()
        return context.get_node_id(), [str(g) for g in context.get_accelerator_ids().get("GPU", [])]


class GeneratorWorker(_Base, GenerationMixin, ScoringMixin):
    """Generator pool rank: samples with its engine, scores, receives weights after every optimizer step."""

    role = "generator"

    def __init__(self, policy: PolicySpec, reward: RewardConfig, torch_threads: int = 1,
                 judges: list | None = None) -> None:
        super().__init__()
        torch.set_num_threads(torch_threads)
        check_device(self, policy)
        self.policy_spec = policy
        self.engine = build_engine(policy)
        self._startup_mark("model_loaded")
        self.busy_s = 0.0
        self.reward_spec = reward
        self.judges = judges
        self._build_scorer(reward)
        self._startup_mark("init_end")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join(self, spec: CollectiveSpec, epoch: int = 0) -> int:
        """The engine joins the weight sync as this generator rank; `epoch`: which incarnation of the rank this
        actor is (0 at start-up, +1 per replacement; see `weights.sync`). Its pair group with trainer rank 0 is
        built by the first weight broadcast, so a replacement joins without any other worker taking part."""
        self._startup_mark("join_start")
        out = int(self.engine.join(spec, self.rank, epoch))
        self._startup_mark("join_end")
        return out

    def receive_weights(self, version: int) -> int:
        t0 = time.perf_counter()
        self.engine.receive_weights(version)
        self.busy_s += time.perf_counter() - t0
        return version

    def load_weights(self, path: str, version: int) -> int:
        """Load the trainable weights of a checkpoint directory; the engine then holds `version`."""
        return self.engine.load_weights(path, version)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def checksum(self) -> dict[str, Any]:
        """Version and sha256 of the engine's weights (weight-sync checks), plus peak RSS."""
        return {"version": self.version, "checksum": self.engine.checksum(), "rss_mb": _rss_mb(),
                "busy_s": self.busy_s}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The engine's weights (those its next generation uses), on the CPU."""
        return self.engine.trainable_state()


class TrainerWorker(_Base, SamplingMixin, TrainingMixin, ScoringMixin):
    """Trainer pool rank: TSP updates, optimizer step, weight sender; generates TAG micro-batches.

    It scores only when no generator is left alive (the driver's fallback); the reward is then built on
    first use, so a healthy run never loads it on the trainer.
    """

    role = "trainer"

    def __init__(self, policy: PolicySpec, train: TrainSpec, reward: RewardConfig, torch_threads: int = 1,
                 judges: list | None = None) -> None:
        super().__init__()
        self._build_policy(policy, torch_threads, keep_reference=train.loss.kl_coef > 0)
        self._startup_mark("model_loaded")
        self._build_training(train)
        self.reward_spec = reward
        self.judges = judges
        self.scorer = None
        self.collectives: Collectives | None = None
        self.failed_sends: list[tuple[int, int, str]] = []
        self._startup_mark("init_end")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join(self, spec: CollectiveSpec) -> int:
        """Join the trainer world (collective over the trainer ranks; rank 0 serves the rendezvous store the
        generators' weight-sync pairs use too), then shard the model (FSDP2) or not, and build the optimizer."""
        self._startup_mark("join_start")
        self.collectives = Collectives(spec, "trainer", self.rank)
        self._build_parallel(self.collectives)
        self._startup_mark("join_end")
        return self.collectives.global_rank

    def score(self, sample_ids: list[int], *image_parts: DataProto) -> dict[str, Any]:
        self._scorer()
        return super().score(sample_ids, *image_parts)

    def expect_generator(self, generator: int, epoch: int) -> None:
        """Generator rank `generator` was replaced by a new actor of `epoch`: rank 0's next send to it builds a
        fresh pair group (`weights.sync`). Called before the SYNC that includes it (actor calls run in order)."""
        if self.rank == 0:
            self.collectives.expect(generator, epoch)

    def send_weights(self, version: int, generators: list[int]) -> int:
        """Rank 0 sends to each listed generator in turn; a failed pair does not stop the others (its
        generator's own receive_weights call reports the failure, or its death)."""
        if version != self.version:
            raise RuntimeError(f"trainer rank {self.rank} holds version {self.version}, asked to send {version}")
        t0 = time.perf_counter()
        weights = self.full_trainable() if self.rank == 0 or self.lockstep else {}
        if self.rank == 0:
            for g in generators:
                try:
                    self.collectives.send_weights(weights, [g])
                except RuntimeError as e:  # gloo/NCCL error towards a generator that died mid-sync
                    self.failed_sends.append((version, g, str(e)))
        self.busy_s += time.perf_counter() - t0
        return version


class ColocatedWorker(TrainerWorker):
    """verl-omni's layout: every rank generates, scores, then trains (the baseline)."""

    role = "colocated"

    def __init__(self, policy: PolicySpec, train: TrainSpec, reward: RewardConfig, torch_threads: int = 1,
                 judges: list | None = None) -> None:
        super().__init__(policy, train, reward, torch_threads, judges)
        self._build_scorer(reward)
        self._startup_mark("init_end")
