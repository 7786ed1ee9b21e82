"""The accumulating actor worker ("TSP actor worker") on verl-omni's training engine: `TSPActorWorker`.

Imports verl-omni at module level: import it only where verl-omni is installed (the verl-omni tier, a worker process
of a verl-omni run). Importing it also registers the TSP engine (`verl_omni_tsp`, vendor ``digenrl_tsp``).

What it is. verl-omni's trainer builds its actor as `ActorRolloutRefWorker` (verl_omni/workers/engine_workers.py),
whose ``self.actor`` is verl-omni's `TrainingWorker` (its copy of verl's, with the diffusion flops counter): the
Ray-facing ``update_actor`` calls ``self.actor.train_mini_batch(data)``, which per mini-batch runs
``engine.train_batch`` = zero grad, `forward_backward_batch` over the mini-batch's micro-batches (each
micro-batch x timestep loss divided by ``gradient_accumulation_steps`` = micro-batches x T), ``optimizer_step``
(grad clip at ``actor.grad_clip`` -> ``optim.clip_grad``, non-finite skip) and, after the last mini-batch,
``lr_scheduler_step``. `TSPActorWorker` subclasses that `TrainingWorker` (engine built the same way, by verl's
`EngineRegistry`: the TSP engine when ``VERL_ENGINE_VENDOR=digenrl_tsp``) and splits that step for GAP pipelining:

- `accumulate(micro_batch)`: `forward_backward_batch` of the rows given (one micro-batch, or several of
  ``micro_batch_size_per_gpu`` rows) with NO optimizer step; gradients add up across calls. Each loss is divided by
  ``num_micro_batches x T`` where ``num_micro_batches`` is how many micro-batches (per data-parallel rank) the next
  `optimizer_step` covers (the non-tensor key ``grad_accum_micro_batches`` of the batch, else `set_accumulation`'s
  value): the scaling verl-omni's `train_mini_batch` applies to a mini-batch of that many micro-batches, so A then B
  then one step equals one mini-batch A+B. The non-tensor key ``advantage_divisor`` (κ, DIVISOR_KEY) trains
  advantages / κ with the loss times κ: the gradient of the advantages given, verl-omni's clamp (``adv_clip_max``)
  seeing them / κ (the deferred global std's values, up to c·s: `diffusion.advantages.unclamped_divisor`).
  Returns verl-omni's per-micro-batch metrics (its `_postprocess_output`).
- `optimizer_step(update_lr_scheduler=True, grad_scale=1.0)`: the accumulated gradients times `grad_scale` (the
  deferred global std's 1/(σ + ε)), then the engine's own ``optimizer_step`` (verl-omni's clip, non-finite skip) and
  ``lr_scheduler_step``, then the gradients are zeroed; returns ``{"grad_norm", "lr", "micro_batches"}``. As in
  `train_mini_batch` the scheduler steps once per PPO update: pass False for all but the update's last step.
- `export_weights()`: the engine's ``get_per_tensor_param(base_sync_done=True)`` (the LoRA tensors when LoRA, as
  verl-omni's own LoRA sync gathers them, else the full state; names prefixed ``transformer.`` as verl-omni sends
  them to its rollout). Found here (fsdp2, CPU, world size 1 and 2): verl-omni's LoRA collector
  (`collect_lora_params`, base_sync_done=True, layered or not) raises "collected 0 parameters" on the tiny
  Qwen-Image (PEFT >= 0.20; `patches/verl-omni-a1139baf/0003`); the worker then gathers the adapter's parameters
  itself, under the collector's names, and whatever the collector leaves out (the FSDP2 root's own layers, `0004`)
  it adds the same way, named in a warning. Returned as
  a name -> CPU tensor dict, the form `digenrl_verl.weights.sync.Collectives.send_weights`
  takes. Every rank must call it (FSDP gathers).

The train mode. verl-omni's `EngineTrainModeCtx` zeroes the gradients on exit (and offloads when offload is on),
so the worker enters it at the first `accumulate` after a step and leaves it in `optimizer_step`: the gradients
live between calls, parameters stay loaded. Do not run `infer_batch` / eval-mode calls between `accumulate` and
`optimizer_step` with param offload on (their exit offloads the module, gradients included).

Dispatch: `accumulate` uses verl's ``make_nd_compute_dataproto_dispatch_fn(mesh_name="train")`` like
`train_batch` (each data-parallel rank gets its chunk); `optimizer_step`, `set_accumulation` and `export_weights`
are ``Dispatch.ONE_TO_ALL``, so a `RayWorkerGroup` of this class works as one of verl-omni's `TrainingWorker`.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch
from codetiming import Timer
from tensordict import TensorDict
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id
from verl_omni.utils.mfu import collect_diffusion_flops_meta
from verl_omni.workers.engine_workers import TrainingWorker

import digenrl_verl.integrations.verl_omni_tsp  # noqa: F401  (registers the TSP engine under vendor digenrl_tsp)
from digenrl_verl.diffusion.advantages import unclamped_divisor

ACCUM_KEY = "grad_accum_micro_batches"
DENOMINATOR_KEY = "loss_denominator"
DIVISOR_KEY = "advantage_divisor"


def mark_advantage_divisor(data: TensorDict, clip: Optional[float]) -> float:
    """For advantages already clamped in their own unit (the executor's: the barrier's A_i within ±`clip`, or the
    deferred global std's values up to c·s), the divisor κ (`diffusion.advantages.unclamped_divisor`) `accumulate`
    applies, set as the batch's DIVISOR_KEY; returns κ (1: verl-omni's loss sees the advantages as they are)."""
    divisor = unclamped_divisor(data["advantages"], clip)
    tu.assign_non_tensor(data, **{DIVISOR_KEY: divisor})
    return divisor


def scaled_loss(loss_function: Callable, gradient_accumulation_steps: int, divisor: float = 1.0) -> Callable:
    """`loss_function` seeing ``gradient_accumulation_steps`` (micro-batches of the step x timesteps) in place of
    the count of the call's own micro-batches that verl-omni's `_run_forward_backward_batch` writes; the loss times
    `divisor` (the advantages' κ, `accumulate`)."""

    def loss(model_output, data: TensorDict, dp_group=None):
        tu.assign_non_tensor(data, gradient_accumulation_steps=gradient_accumulation_steps / divisor)
        return loss_function(model_output=model_output, data=data, dp_group=dp_group)

    return loss


def row_scaled_loss(loss_function: Callable, denominator: float, dp_size: int, divisor: float = 1.0) -> Callable:
    """`loss_function` scaled so that the gradient is (sum over rows and timesteps of the loss) / `denominator`
    whatever the cut into calls and micro-batches: a call's mean over its `rows` is divided by
    ``denominator / (rows x dp_size)`` (FSDP then averages over the `dp_size` data-parallel ranks); times
    `divisor` (the advantages' κ, `accumulate`)."""

    def loss(model_output, data: TensorDict, dp_group=None):
        rows = int(data["advantages"].shape[0])
        tu.assign_non_tensor(data, gradient_accumulation_steps=denominator / (rows * dp_size) / divisor)
        return loss_function(model_output=model_output, data=data, dp_group=dp_group)

    return loss


class TSPActorWorker(TrainingWorker):
    """verl-omni's `TrainingWorker` with gradient accumulation across calls (see the module docstring)."""

    def __init__(self, config, num_micro_batches: Optional[int] = None):
        super().__init__(config)
        self._init_accumulation(num_micro_batches)

    def _init_accumulation(self, num_micro_batches: Optional[int]) -> None:
        self.num_micro_batches = num_micro_batches
        self._train_ctx = None
        self._accumulated_rows = 0

    @classmethod
    def adopt(cls, worker: TrainingWorker, num_micro_batches: Optional[int] = None) -> "TSPActorWorker":
        """Make the `TrainingWorker` verl-omni's `ActorRolloutRefWorker.init_model` built (its engine, loss and
        dispatch already set up by verl-omni's code) this accumulating worker, in place: the class adds methods and
        three fields only, so nothing is built twice."""
        if not isinstance(worker, TrainingWorker):
            raise TypeError(f"adopt: expected verl-omni's TrainingWorker, got {type(worker).__name__}")
        worker.__class__ = cls
        worker._init_accumulation(num_micro_batches)
        return worker

    def recompute(self, data: TensorDict) -> TensorDict:
        """verl-omni's old-log-prob pass on `data` (no loss): ``log_probs`` and ``prev_sample_mean`` [B, T, ...] with
        the current weights. With no accumulation open it is verl-omni's `infer_batch` (eval mode, its offload
        around it). Between `accumulate` and `optimizer_step` the parameters are loaded (the open train context) and
        the same engine pass runs under no_grad in train mode: an eval context's exit would offload parameters and
        the accumulated gradients when offload is on (diffusion transformers compute the same in both modes)."""
        tu.assign_non_tensor(data, compute_loss=False)
        shapes = {"log_probs": tuple(data["all_timesteps"].shape),
                  "prev_sample_mean": (*data["all_timesteps"].shape, *data["all_latents"].shape[2:])}
        if self._train_ctx is None:
            return self._share_in_sp_group(self.infer_batch(data), shapes)
        return self._share_in_sp_group(self._recompute_in_train_mode(data), shapes)

    def _share_in_sp_group(self, output: Optional[TensorDict], shapes: dict) -> Optional[TensorDict]:
        """Under Ulysses sequence parallelism only an SP group's source rank returns outputs (verl-omni's
        `is_mp_src_rank_with_outputs`); the others need the same old log-probs and means for their loss: the
        source rank broadcasts them in the group. Without SP: `output` as it is."""
        if self.engine.ulysses_sequence_parallel_size <= 1:
            return output
        group = self.engine.ulysses_device_mesh.get_group(mesh_dim="ulysses")
        src = torch.distributed.get_global_rank(group, 0)
        device = get_device_id() if torch.distributed.get_backend(group) == "nccl" else "cpu"
        shared = {}
        for name, shape in shapes.items():
            tensor = (tu.get(output, name).float().contiguous().to(device) if output is not None
                      else torch.empty(shape, dtype=torch.float32, device=device))
            torch.distributed.broadcast(tensor, src=src, group=group)
            shared[name] = tensor.cpu()
        return tu.get_tensordict(tensor_dict=shared)

    def _prepare(self, data: TensorDict, *, infer: bool):
        """The per-batch settings verl-omni's `train_batch` / `infer_batch` put on a batch that lacks them (micro-batch
        size, token budget, ...), then its flops meta of the batch."""
        config = self.engine_config
        defaults = dict(use_remove_padding=self.model_config.get("use_remove_padding", False),
                        use_dynamic_bsz=config.use_dynamic_bsz,
                        max_token_len_per_gpu=(config.infer_max_token_len_per_gpu if infer
                                               else config.max_token_len_per_gpu),
                        micro_batch_size_per_gpu=(config.infer_micro_batch_size_per_gpu if infer
                                                  else config.micro_batch_size_per_gpu),
                        use_fused_kernels=config.use_fused_kernels)
        tu.assign_non_tensor(data, **{k: v for k, v in defaults.items() if k not in data.keys()})
        return collect_diffusion_flops_meta(self.flops_counter, data,
                                            pipeline_config=getattr(self.model_config, "pipeline", None))

    def _recompute_in_train_mode(self, data: TensorDict) -> Optional[TensorDict]:
        """The engine's forward-only pass under no_grad, the module left in train mode (`recompute`)."""
        flops_meta = self._prepare(data, infer=True)
        with torch.no_grad(), Timer(name="recompute", logger=None) as timer:
            output = self.engine.infer_batch(data, loss_function=None)
        if not self.engine.is_mp_src_rank_with_outputs():
            return None
        return self._postprocess_output(output, global_token_num=None, delta_time=timer.last, forward_only=True,
                                        images_seqlens=None, diffusion_flops_meta=flops_meta).cpu()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_accumulation(self, num_micro_batches: int) -> None:
        """Micro-batches (per data-parallel rank) each optimizer step covers, when a batch does not say."""
        if num_micro_batches < 1:
            raise ValueError(f"num_micro_batches must be >= 1, got {num_micro_batches}")
        self.num_micro_batches = num_micro_batches

    def _micro_batches_per_step(self, data: TensorDict) -> int:
        value = tu.pop(data, key=ACCUM_KEY, default=None)
        value = self.num_micro_batches if value is None else int(value)
        if value is None or value < 1:
            raise ValueError(f"accumulate: how many micro-batches the optimizer step covers is unknown: set the "
                             f"batch's non-tensor {ACCUM_KEY!r} or call set_accumulation(n) (got {value})")
        return value

    def _enter_train_mode(self) -> None:
        if self._train_ctx is None:
            ctx = self.engine.train_mode(disable_auto_offload=False)
            ctx.__enter__()
            self._train_ctx = ctx
            self._accumulated_rows = 0
            self.engine.optimizer_zero_grad()

    def _leave_train_mode(self) -> None:
        ctx, self._train_ctx = self._train_ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)  # verl-omni's exit: zero the gradients (and offload when configured)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def accumulate(self, data: TensorDict) -> Optional[TensorDict]:
        """Forward/backward of `data` (this rank's rows) through the engine, gradients added, no step."""
        assert self.loss_fn is not None, "set_loss_fn first (verl-omni's diffusion_loss)"
        assert not self.engine_config.forward_only, "accumulate needs a trainable engine (forward_only is set)"
        denominator = tu.pop(data, key=DENOMINATOR_KEY, default=None)
        num_micro_batches = self._micro_batches_per_step(data) if denominator is None else None
        num_timesteps = int(data["all_timesteps"].shape[1])
        divisor = float(tu.pop(data, key=DIVISOR_KEY, default=None) or 1.0)
        if divisor != 1.0:  # verl-omni's loss clamps advantages / κ; its loss times κ gives the advantages' gradient
            data = data.clone(recurse=False)  # the caller's batch keeps its advantages
            data["advantages"] = data["advantages"] / divisor
        flops_meta = self._prepare(data, infer=False)
        self._enter_train_mode()
        loss_function = (scaled_loss(self.loss_fn, num_micro_batches * num_timesteps, divisor) if denominator is None
                         else row_scaled_loss(self.loss_fn, float(denominator), self.engine.get_data_parallel_size(),
                                              divisor))
        with Timer(name="accumulate", logger=None) as timer:
            output = self.engine.forward_backward_batch(data, loss_function, forward_only=False)
        self._accumulated_rows += data.batch_size[0]
        if not self.engine.is_mp_src_rank_with_outputs():
            return None
        # the model outputs (log_probs [B, T], ...) stay in what it returns: the caller's per-row statistics
        return self._postprocess_output(output, global_token_num=None, delta_time=timer.last, forward_only=False,
                                        images_seqlens=None, diffusion_flops_meta=flops_meta).cpu()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def optimizer_step(self, update_lr_scheduler: bool = True, grad_scale: float = 1.0) -> dict:
        """One optimizer step over what `accumulate` added up (verl-omni's clip and LR scheduler); grads zeroed.
        `grad_scale` multiplies the accumulated gradients first (the deferred global std's 1/(σ + ε),
        `diffusion.advantages`), so verl-omni's clip and non-finite skip see the barrier's gradient."""
        if self._train_ctx is None:
            raise RuntimeError("optimizer_step: nothing accumulated since the last step")
        micro = self.engine_config.micro_batch_size_per_gpu
        micro_batches = -(-self._accumulated_rows // micro) if micro else None
        try:
            if grad_scale != 1.0:
                self._scale_gradients(grad_scale)
            grad_norm = self.engine.optimizer_step()
            if update_lr_scheduler:
                lr = self.engine.lr_scheduler_step()
            else:
                lr = self.engine.lr_scheduler.get_last_lr()[0] if self.engine.lr_scheduler is not None else None
        finally:
            self._leave_train_mode()
        return {"grad_norm": grad_norm, "lr": lr, "micro_batches": micro_batches}

    def _scale_gradients(self, scale: float) -> None:
        """Every accumulated gradient (this rank's shard of it: FSDP reduced them at the backward) times `scale`."""
        with torch.no_grad():
            for param in self.engine.module.parameters():
                if param.grad is not None:
                    param.grad.mul_(scale)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weights(self, base_sync_done: bool = True, layered_summon: bool = False,
                       adapter_name: Optional[str] = None, with_peft_config: bool = False):
        """The engine's export (`get_per_tensor_param`) as {name: CPU tensor}, with the peft config if asked.
        LoRA: ``base_sync_done=True`` gives the adapter tensors only (what verl-omni's `_gather_lora_weights`
        sends each step), False the base weights (its first sync to a dummy-loaded rollout). Full fine-tune: the
        whole state (verl-omni casts sharded tensors to bf16 for the rollout)."""
        try:
            per_tensor, peft_config = self.engine.get_per_tensor_param(
                layered_summon=layered_summon, base_sync_done=base_sync_done, adapter_name=adapter_name)
            weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in per_tensor}
        except RuntimeError as error:  # verl-omni's FSDP2 LoRA collector finds no tensors here (module docstring)
            if not (base_sync_done and "collected 0 parameters" in str(error)):
                raise
            weights, peft_config = self._lora_tensors(adapter_name or "default")
        if base_sync_done and peft_config is not None:
            weights.update(self._lora_tensors(adapter_name or "default", missing_from=weights)[0])
        return (weights, peft_config) if with_peft_config else weights

    def _lora_tensors(self, adapter_name: str, missing_from: Optional[dict] = None) -> tuple[dict, Optional[dict]]:
        """The adapter's LoRA parameters, gathered (every rank), named as verl-omni's collector names them
        (``transformer.<module>.lora_A.weight``: the adapter name dropped). With `missing_from`: only those it lacks,
        each named in a warning (verl-omni a1139baf's FSDP2 collectors skip the root module's own layers, e.g. a
        DiT's ``img_in`` / ``proj_out`` under ``target_modules=all-linear``: fixed upstream by
        ``patches/verl-omni-a1139baf/0004``)."""
        from torch.distributed.tensor import DTensor

        module = getattr(self.engine.module, "_fsdp_wrapped_module", self.engine.module)
        weights = {}
        for name, param in self.engine.module.named_parameters():
            if "lora_" in name and f".{adapter_name}." in name:
                key = "transformer." + name.replace("_fsdp_wrapped_module.", "").replace(f".{adapter_name}.", ".")
                if missing_from is not None and key in missing_from:
                    continue
                full = param.full_tensor() if isinstance(param, DTensor) else param
                weights[key] = full.detach().to("cpu", copy=True)
        if missing_from is not None and weights:
            warnings.warn(f"verl-omni's LoRA weight collection left out {len(weights)} adapter tensors ("
                          f"{', '.join(sorted(weights)[:4])}, ...); sent from the worker's own gather instead (the "
                          "collector skips the FSDP2 root module's layers: patches/verl-omni-a1139baf/0004 fixes it)",
                          stacklevel=2)
        peft_config = getattr(module, "peft_config", {}).get(adapter_name)
        return weights, (peft_config.to_dict() if peft_config is not None else None)
