"""The trainer pool on verl-omni's own actor worker: `VerlOmniTrainerWorker` (``trainer.digenrl.trainer_engine``
``verl_omni``, the default of a run from verl-omni's entry point).

Imports verl-omni at module level: the runner imports it only in runs that select it (`trainer.runner`).

What trains. verl-omni's `ActorRolloutRefWorker` (role ``actor``), built from the ``actor_rollout_ref`` section
verl-omni composed (`TrainSpec.host_config`) by verl-omni's own ``init_model``: its engine from verl's registry (the
TSP subclass, vendor ``digenrl_tsp``, `integrations.verl_omni_tsp`), its LoRA, optimizer, LR scheduler, grad clip,
loss (``diffusion_loss``: ``loss_mode``, clip ratio, ``adv_clip_max``, ...) and checkpoint manager. Only its
`TrainingWorker` is made the accumulating `TSPActorWorker` (`TSPActorWorker.adopt`), so every ``actor.*``,
``model.*``, ``fsdp_config.*`` key is read by verl-omni's code. The package's sharding, LoRA, optimizer and loss
code is not used on this path.

The Ray-facing interface is the package trainer's (`workers.roles.TrainerWorker`), so the executor, the driver
and the runner cannot tell the two apart:

| call | here |
|---|---|
| `join(spec)` | the trainer process group (gloo / NCCL), then verl-omni's ``init_model`` on it; the sampling copy
  takes the engine's initial trainable weights (verl-omni's own LoRA init: seeded by its ``fsdp_config.seed`` with
  ``full_determinism``, else by the process's random state, as in verl-omni), which the runner sends to the
  generators before the first step |
| `update(...)` | the UPDATE data in verl-omni's batch layout (`verl_omni_batch`), old log-probs recomputed by
  verl-omni's `infer_batch` where the config says so, then `TSPActorWorker.accumulate`, the loss scaled to the
  mini-batch; advantages beyond ``adv_clip_max`` (the deferred global std's, already clamped in its units) go in
  divided by a power of two κ with the loss times κ, so verl-omni's clamp leaves them alone |
| `opt_step(version, grad_scale)` | `TSPActorWorker.optimizer_step` (the gradients times `grad_scale`, the deferred
  global std's 1/(σ + ε); then verl-omni's clip, non-finite skip, LR scheduler once per global step), then the
  engine's export (`get_per_tensor_param`) into the sampling copy |
| `send_weights`, `generate` (TAG), `checksum` | the sampling copy (`SamplingMixin`), equal to the engine's weights
  after every step |
| `save_checkpoint(path)` | verl-omni's layout: ``path/actor/`` by the engine's own ``save_checkpoint``, plus the
  trainable weights as the generators load them (``model.safetensors``, `weights.state`) |
| `load_checkpoint(path, version)` | the engine's ``load_checkpoint`` of ``path/actor``, then the sampling copy |

Loss scale. The executor asks for the gradient of (sum over the mini-batch's rows and trained steps of the loss) /
`loss_denominator` (= mini-batch samples x K). verl-omni's loss is the mean over a loss call's rows divided by
``gradient_accumulation_steps``, and FSDP averages the gradients over the data-parallel ranks, so each loss call
gets ``gradient_accumulation_steps = loss_denominator / (rows x dp_size)``: with equal micro-batches that is
verl-omni's own micro-batches x T.

The sampling copy. TAG samples, weight sends and checksums use a full copy of the policy in the package's diffusers
adapter (as on the package's own trainer), refreshed from the engine after every optimizer step: one export per step
(the one SYNC needs anyway) and one more copy of the trainable weights in memory.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from verl import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils import tensordict_utils as tu
from verl_omni.trainer.diffusion.diffusion_algos import get_diffusion_loss_fn
from verl_omni.workers.engine_workers import ActorRolloutRefWorker

from digenrl_verl.diffusion.loss import loss_stats as shared_loss_stats
from digenrl_verl.integrations.verl_omni_batch import to_verl_omni_batch, with_engine_meta
from digenrl_verl.integrations.verl_omni_names import canonical_name
from digenrl_verl.integrations.verl_omni_tsp import TSP_VENDOR
from digenrl_verl.integrations.verl_omni_worker import TSPActorWorker, mark_advantage_divisor
from digenrl_verl.trainer.checkpoint import HOST_ACTOR_DIR
from digenrl_verl.weights.state import WEIGHTS_FILE, swapped_in
from digenrl_verl.weights.sync import CollectiveSpec, Collectives
from digenrl_verl.workers.batch import concat_rows
from digenrl_verl.workers.roles import ColocatedWorker, TrainerWorker
from digenrl_verl.workers.specs import PolicySpec, TrainSpec


def host_actor_config(host_config: Any):
    """verl-omni's ``actor_rollout_ref`` for its actor worker, as composed, but for the checkpoint engine: the
    trainer's weights reach DigenRL's generators through the package's transport (`weights.sync`), so verl-omni's
    checkpoint engine (built by ``init_model``, for its rollout replicas) is the in-process ``naive`` one."""
    config = OmegaConf.create(dict(host_config))
    config.rollout.checkpoint_engine.backend = "naive"
    return config


class DigenRLActorWorker(ActorRolloutRefWorker):
    """verl-omni's actor worker (role ``actor``) whose `TrainingWorker` accumulates across calls: verl-omni's
    ``init_model`` builds everything, then `TSPActorWorker.adopt` adds accumulate / optimizer_step / export."""

    def init_model(self):
        super().init_model()
        TSPActorWorker.adopt(self.actor)


class VerlOmniTrainerWorker(TrainerWorker):
    """Trainer pool rank on verl-omni's actor worker (module docstring); the package trainer's interface."""

    role = "trainer"

    def __init__(self, policy: PolicySpec, train: TrainSpec, reward: Any, torch_threads: int = 1,
                 judges: list | None = None) -> None:
        if train.engine != "verl_omni":
            raise ValueError(f"VerlOmniTrainerWorker needs TrainSpec.engine='verl_omni', got {train.engine!r}")
        super().__init__(policy, train, reward, torch_threads, judges)
        self.host: Optional[DigenRLActorWorker] = None
        self._step_start: dict[str, torch.Tensor] = {}  # the engine's weights of `version` between mini-batches

    @property
    def actor(self) -> TSPActorWorker:
        return self.host.actor

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join(self, spec: CollectiveSpec) -> int:
        """The trainer process group, then verl-omni's actor worker on it (its engine sees that group as its
        world); the sampling copy starts from the engine's trainable weights, as verl-omni's ``init_model`` built
        them: a fresh LoRA adapter is drawn by verl-omni's code, as in its own run (the runner then sends these weights
        to the generators, `Runner.sync_generators`)."""
        self._startup_mark("join_start")
        self.collectives = Collectives(spec, "trainer", self.rank)
        os.environ["VERL_ENGINE_VENDOR"] = TSP_VENDOR  # verl's registry: the TSP engine (verl_omni_tsp)
        self.host = DigenRLActorWorker(config=host_actor_config(self.train_spec.host_config), role="actor")
        self.host.init_model()
        self._refresh_sampling_copy()
        self._startup_mark("join_end")
        return self.collectives.global_rank

    # ------------------------------------------------------------------ weights between the two copies
    def _engine_params(self) -> dict[str, torch.nn.Parameter]:
        return {canonical_name(n): p for n, p in self.actor.engine.module.named_parameters() if p.requires_grad}

    def _matched(self, theirs: dict[str, Any]) -> dict[str, str]:
        """canonical name -> our parameter name, for the weights both sides train. verl-omni may adapt modules whose
        output never reaches the velocity (the package's policy leaves those frozen: its adapter's
        `_unused_modules`, e.g. Qwen-Image's last text-stream layers): they change nothing and are left out. Any
        other difference is a RuntimeError naming the keys that decide the adapted modules."""
        ours = {canonical_name(n): n for n in self.trainable()}
        unused = tuple(f"{m}." for m in self.adapter._unused_modules())
        dead = {k for k in theirs.keys() - ours.keys() if k.startswith(unused)} if unused else set()
        if ours.keys() != theirs.keys() - dead:
            only_ours, only_theirs = sorted(ours.keys() - theirs.keys()), sorted(theirs.keys() - ours.keys() - dead)
            raise RuntimeError(
                f"the package's policy and verl-omni's engine train different weights ({len(ours)} vs {len(theirs)}; "
                f"only ours: {only_ours[:3]}, only verl-omni's: {only_theirs[:3]}): check "
                "actor_rollout_ref.model.lora_rank / target_modules / exclude_modules")
        return ours

    def _refresh_sampling_copy(self) -> None:
        """The engine's trainable weights (its export, every rank) into the sampling copy."""
        exported = {canonical_name(k): v for k, v in self.actor.export_weights().items()}
        names = self._matched(exported)
        params = self.trainable()
        with torch.no_grad():
            for key, ours in names.items():
                param = params[ours]
                param.copy_(exported[key].to(param.device, param.dtype))

    # ------------------------------------------------------------------ training
    def update(self, sample_ids: list[int], advantages: torch.Tensor, loss_denominator: float, tsp: bool,
               version: int, max_share: int, *traj_parts: DataProto) -> dict[str, float]:
        """Forward/backward of this rank's share of one micro-batch through verl-omni's engine; no step."""
        if version != self.version:
            raise RuntimeError(f"trainer rank {self.rank} holds version {self.version}, the UPDATE expects {version}")
        if not sample_ids:  # every FSDP rank must run every forward: verl-omni's engine cannot take an empty share
            raise RuntimeError(f"trainer rank {self.rank} got no row of this micro-batch: verl-omni's engine needs "
                               "rows on every rank; use at most as many trainer ranks as a micro-batch has samples "
                               "(actor_rollout_ref.rollout.n per prompt group), or trainer.digenrl.trainer_engine="
                               "digenrl")
        t0 = time.perf_counter()
        data = concat_rows(traj_parts, sample_ids)
        cond = self.adapter.encode_prompts(list(data.non_tensor_batch["raw_prompt"]))
        engine = self.actor.engine
        batch = to_verl_omni_batch(data.batch, {k: v.detach().cpu() for k, v in cond.tensors.items()}, advantages,
                                   engine.scheduler)
        pipeline = self.train_spec.host_config["model"]["pipeline"]
        rows = len(sample_ids)
        meta = dict(micro_batch_size=micro_batch_size(rows, self.actor.engine_config.micro_batch_size_per_gpu),
                    height=int(pipeline["height"]), width=int(pipeline["width"]))
        with_engine_meta(batch, **meta)
        self._old_log_probs(batch, data.batch["policy_version"] == self.version, meta)
        loss = self.train_spec.host_config["actor"].get("diffusion_loss", {})
        divisor = mark_advantage_divisor(batch, loss.get("adv_clip_max"))  # verl-omni's clamp leaves them alone
        tu.assign_non_tensor(batch, loss_denominator=float(loss_denominator))
        engine.tsp_chunk_rows = (self.train_spec.tsp_chunk_size or 0) if tsp else 1  # 1 row: one timestep a forward
        output = self.actor.accumulate(batch)
        self.busy_s += time.perf_counter() - t0
        if output is None:  # not the source rank of its sequence-parallel group: that rank reports the rows
            return {"rows": 0.0}
        policy = policy_loss_sum(self.actor, output, batch)
        stats = loss_stats(output, batch, data.batch["policy_version"] < self.version, float(loss.get("clip_ratio")),
                           policy_sum=policy)
        return {**stats, "pg_sum": stats["pg_sum"] * divisor}  # verl-omni's per-row pg loss saw advantages / κ

    def _old_log_probs(self, batch, fresh: torch.Tensor, meta: dict) -> None:
        """verl-omni's recompute (`infer_batch`) when asked, or when the loss needs the old SDE means: fresh rows
        take the recomputed log-probs, stale rows (TCSS) keep their behaviour log-probs."""
        needs_mean = "old_prev_sample_mean" in get_diffusion_loss_fn(self._loss_mode()).required_data_keys
        if not self._needs_recompute():
            return
        probe = with_engine_meta(batch.clone(), **meta)
        with self._weights_of_version():
            output = self.actor.recompute(probe)
        if self.train_spec.recompute_old_log_probs:
            recomputed = tu.get(output, "log_probs").to(torch.float32)
            batch["old_log_probs"][fresh] = recomputed[fresh]
        if needs_mean:
            batch["old_prev_sample_mean"] = tu.get(output, "prev_sample_mean").to(torch.float32)

    def _needs_recompute(self) -> bool:
        return self.train_spec.recompute_old_log_probs or \
            "old_prev_sample_mean" in get_diffusion_loss_fn(self._loss_mode()).required_data_keys

    def _weights_of_version(self):
        """The engine's weights of `self.version` in place for the block: after a mini-batch's optimizer step (a
        global step's earlier ones) the step-start weights, so later mini-batches recompute with the weights verl-omni
        computes the whole batch's old log-probs with."""
        return swapped_in(self._engine_params(), self._step_start)

    def _loss_mode(self) -> str:
        return str(self.train_spec.host_config["actor"].get("diffusion_loss", {}).get("loss_mode", "flow_grpo"))

    def opt_step(self, version: int, grad_scale: float = 1.0) -> dict[str, float]:
        """One optimizer step over what `update` accumulated, times `grad_scale` first (the deferred global std's
        1/(σ + ε), before verl-omni's clip and non-finite skip; its LR scheduler once per global step, at the step's
        last mini-batch), then the sampling copy from the engine."""
        if version not in (self.version, self.version + 1):
            raise RuntimeError(f"trainer rank {self.rank} at version {self.version} asked to produce version {version} "
                               f"(want {self.version + 1}, or {self.version} for a mini-batch's optimizer step)")
        t0 = time.perf_counter()
        if version == self.version and not self._step_start and self._needs_recompute():
            with torch.no_grad():  # the step's first mini-batch: keep `version`'s weights for the later recomputes
                self._step_start = {k: p.detach().clone() for k, p in self._engine_params().items()}
        elif version == self.version + 1:
            self._step_start = {}
        out = self.actor.optimizer_step(update_lr_scheduler=version == self.version + 1, grad_scale=grad_scale)
        norm = float(out["grad_norm"]) if out["grad_norm"] is not None else 0.0
        skipped = not math.isfinite(norm)
        if skipped:
            self.skipped_steps += 1
        self._refresh_sampling_copy()
        self.version = version
        self.busy_s += time.perf_counter() - t0
        return {"grad_norm": norm, "skipped": float(skipped), "version": float(version),
                "lr": float(out["lr"]) if out["lr"] is not None else float("nan")}

    def accumulated_gradients(self) -> dict[str, torch.Tensor]:
        """This rank's gradients accumulated since the last step (its shards), our names, on the CPU."""
        params = self._engine_params()
        names = self._matched(params)
        grads = {k: params[k].grad for k in names}
        return {names[k]: (g.to_local() if isinstance(g, DTensor) else g).detach().to("cpu", copy=True)
                for k, g in grads.items() if g is not None}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str) -> int:
        """verl-omni's checkpoint of the actor in ``path/actor`` (every rank writes its part), plus the trainable
        weights the generators load on resume (``model.safetensors``, rank 0)."""
        self.host.save_checkpoint(str(Path(path) / HOST_ACTOR_DIR), global_step=self.version)
        if self.rank == 0:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.trainable().items()},
                      str(Path(path) / WEIGHTS_FILE))
        return self.version

    def load_checkpoint(self, path: str, version: int) -> int:
        self.host.load_checkpoint(str(Path(path) / HOST_ACTOR_DIR))
        self._refresh_sampling_copy()
        self.version = version
        return version


class VerlOmniColocatedWorker(VerlOmniTrainerWorker, ColocatedWorker):
    """The colocated layout on verl-omni's actor worker: every rank generates, scores and trains (the package's
    `ColocatedWorker` start-up, its scorer built up front, under verl-omni's training)."""

    role = "colocated"


def micro_batch_size(rows: int, configured: int) -> int:
    """The micro-batch size for a call of `rows` rows: the largest divisor of `rows` up to the configured
    ``ppo_micro_batch_size_per_gpu`` (verl's `prepare_micro_batches` needs an even cut; a GAP share can be smaller
    than a configured micro-batch). The gradient does not depend on the cut (the loss is scaled per row)."""
    return max(d for d in range(1, min(rows, max(configured, 1)) + 1) if rows % d == 0)


def policy_loss_sum(actor: Any, output: Any, batch: Any) -> Optional[float]:
    """verl-omni's policy term over the rows and steps of one UPDATE, as a sum: the loss class its actor worker's
    `diffusion_loss` uses (the config that loss is bound with), called as `diffusion_loss` calls it, on the log-probs
    the engine returned (no gradient). Its
    diffusion losses log no policy-loss metric of their own (`DiffusionLossResult.add_loss_metric` is False), so
    this is where the policy loss the run reports comes from. None when the loss needs a model output the engine did
    not return."""
    actor_config = actor.loss_fn.keywords["config"]  # functools.partial(diffusion_loss, config=...)
    loss_fn = get_diffusion_loss_fn(actor_config.diffusion_loss.get("loss_mode", "flow_grpo"))
    if any(key not in output.keys() for key in loss_fn.required_model_output_keys):
        return None
    model_output = {key: tu.get(output, key).detach() for key in loss_fn.required_model_output_keys}
    with torch.no_grad():
        result = loss_fn(config=actor_config, model_output=model_output, data=batch)
    return float(result.loss) * tu.get(output, "log_probs").numel()


def loss_stats(output: Any, batch: Any, stale: torch.Tensor, clip_ratio: float,
               policy_sum: Optional[float] = None) -> dict[str, float]:
    """The UPDATE's result as `diffusion.loss.LossStats` sums (what the runner merges), by the package's own
    `diffusion.loss.loss_stats` on the log-probs verl-omni's engine returned for the batch's rows and steps (with
    verl-omni's clip ratio; stale rows apart, their importance weights π_θ/π_b included), the policy loss
    (`policy_sum`, else a policy-loss metric verl-omni logged: ``actor/pg_loss``) and the loss from verl-omni's own
    metrics (means over its micro-batches). KL stays 0 (no reference on this path)."""
    metrics = tu.get(output, "metrics")
    log_ratio = tu.get(output, "log_probs").float() - batch["old_log_probs"].float()

    def mean(name: str) -> float:
        values = _floats(metrics.get(name, 0.0))
        return float(sum(values) / max(len(values), 1))

    pg_sum = policy_sum if policy_sum is not None else mean("actor/pg_loss") * log_ratio.numel()
    stats = shared_loss_stats(clip_ratio, log_ratio, batch["advantages"].float(), stale=stale.reshape(-1, 1),
                              pg_sum=pg_sum, loss_sum=mean("loss"))
    return dict(vars(stats))


def _floats(value: Any) -> list[float]:
    """The numbers in a metric value: a number, verl's `Metric` (its ``values``), or lists of them."""
    value = getattr(value, "values", value)
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _floats(item)]
    return [float(value)]
