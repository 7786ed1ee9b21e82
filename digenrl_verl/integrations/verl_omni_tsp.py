"""TSP on verl-omni's own training engine: `TSPDiffusersFSDPEngine`, a subclass of verl-omni's
`PPODiffusersFSDPEngine` that runs several timesteps of a micro-batch in one stacked forward.

Imports verl-omni at module level: import it only where verl-omni is installed (the verl-omni tier; a worker
process that imports verl-omni's engines). Importing it registers the engine (`register_tsp_engine`).

How it works. verl-omni's `_run_forward_backward_batch` loops, per micro-batch of B samples, over the T timesteps:
``loss = forward_step(micro_batch, step=t); loss.backward()``. This class keeps that loop (it is called, not
copied) and overrides `forward_step`: at the first step t of a chunk of k timesteps it builds one k*B-row batch
(row j*B + b = sample b at step t + j: the per-step tensors sliced, the rest repeated; `stack_steps`) and sends it
through verl-omni's unchanged `forward_step` at step 0, with a loss function that calls the real loss ONCE PER
TIMESTEP on that timestep's own B rows (`_per_step_losses`) and returns their sum; the loop's ``backward()``
then runs once per chunk. The chunk's other steps return their recorded outputs with a zero leaf as loss (its
``backward()`` is a no-op). Each per-step loss sees the loop's `gradient_accumulation_steps` (M*T), so the
gradient is the loop's sum of T per-step gradients; the per-step model outputs, loss values and metrics are the
loop's too (verl-omni's `postprocess_batch_func` stacks them to (B, T, ...) as before).
Why one loss call per timestep, not one over k*B rows scaled by k: a loss that pools over the rows assuming one
timestep is wrong on stacked rows (`grpo_guard` averages `std_dev_t` and `sqrt_dt` over the rows: 186 % off,
measured by a colleague); so is any batch-normalised weight (rollout correction's `rollout_is_batch_normalize`).

Chunk size. `trainer.digenrl.tsp.chunk_size` counts ROWS (samples x timesteps; 0 = all), as for the package's own
trainer. Here a forward holds whole timesteps (each timestep's loss needs its B rows): k = max(1, rows // B)
timesteps per forward, all T when 0. verl builds engines with `EngineRegistry.new(model_type, backend,
model_config=, engine_config=, optimizer_config=, checkpoint_config=)` and verl's engine config has no free key, so
the value reaches the engine through the environment: ``DIGENRL_TSP_CHUNK_SIZE`` (CHUNK_SIZE_VAR; unset = 0), or
the constructor argument ``tsp_chunk_size`` (rows) when built directly.

Selection. Registered in verl's `EngineRegistry` for model_type ``diffusion_model``, backends fsdp and fsdp2,
devices cuda, npu and cpu, under the vendor ``digenrl_tsp`` (TSP_VENDOR), so verl-omni's stock engine stays the
default. verl's `get_engine_cls` tries (device, vendor) first and takes the vendor from ``VERL_ENGINE_VENDOR``
when set: a verl-omni run selects this engine with
``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_ENGINE_VENDOR=digenrl_tsp`` (and
``...env_vars.DIGENRL_TSP_CHUNK_SIZE=<rows>``), provided this module is imported in the worker process before
the engine is built. Other model types fall back to their device's engine. A new model_type or strategy value
cannot select it: verl-omni tests model_type against ("diffusion_model", ...) to decide it trains a diffusion
model, and verl's FSDPEngineConfig asserts strategy in (fsdp, fsdp2).

Not covered. DiffusionNFT (`NFTDiffusersFSDPEngine`, model_type diffusion_nft_model) stays on verl-omni's loop:
its forward_step switches LoRA adapters within every step (old / reference / default), so its rows cannot share a
forward with another step's; selecting TSP_VENDOR gives it `LoopNFTDiffusersFSDPEngine` (the stock engine that prints
this reason). DPO's engine has no timestep loop. BAGEL reads one timestep for the whole batch
(``timesteps[0, step]``, its CFG interval), so BAGEL models stay on the loop (printed). VeOmni's
`VeOmniDiffusionEngine` (workers/engine/veomni/diffusion_impl.py) has the same structure (its own
`_run_forward_backward_batch` calling `forward_step(micro_batch, loss_function, forward_only, step)` with the same
per-step loss data), so the same `forward_step` override applies as a mixin; it is not registered here because
VeOmni is registered for cuda only, does not import on this CPU host (no `veomni`), and cannot be tested here.

Measured (CPU, one torch thread, fp32, fsdp2, the unit-size tiny Qwen-Image at 64 px (16 latent tokens), T=5,
B=2, k=3 (chunks 3 + 2); tests/verl_omni/test_verl_omni_tsp_engine.py): gradient vs verl-omni's stock
`PPODiffusersFSDPEngine` on the same weights and batch, max over tensors of max|diff| / max|stock|: 1.7e-7
(full fine-tune, flow_grpo), 2.6e-7 (full, grpo_guard), 2.4e-7 / 2.5e-7 (LoRA 8), 2.1e-7 (LoRA, grpo_guard,
world size 2 over gloo); per-step log-probs, losses and metrics equal. One loss call over the k*B rows (scaled by
k): 0.25 on grpo_guard. Speed (`python -m digenrl_verl.bench tsp --engine verl_omni --json`, docs/benchmarks.md;
baseline verl-omni's stock engine in the same process, same weights and batch, one `forward_backward_batch` of 2
samples x 2 micro-batches, T=5, all steps in one forward, median of 7): 2.48x at 16 latent tokens, 2.24x at 64,
1.83x at 256, 1.04x at 1024 (compute-bound on this CPU); chunks of 3 timesteps 1.62x / 1.42x at 16 / 256 tokens;
chunks of one timestep are the loop (1.01x).
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine.base import EngineRegistry
from verl_omni.workers.engine import VeOmniDiffusionEngine
from verl_omni.workers.engine.fsdp.diffusers_impl import NFTDiffusersFSDPEngine, PPODiffusersFSDPEngine

CHUNK_SIZE_VAR = "DIGENRL_TSP_CHUNK_SIZE"
TSP_VENDOR = "digenrl_tsp"
MODEL_TYPE = "diffusion_model"
NFT_MODEL_TYPE = "diffusion_nft_model"
BACKENDS = ("fsdp", "fsdp2")
DEVICES = ("cuda", "npu", "cpu")
# Tensors indexed by the denoising step in verl-omni's forward_step / model adapters: (B, T, ...), or (B, T+1, ...)
# for the latent trajectory (step and step + 1). Any other key named all_* with T or T+1 columns is one too.
STEP_KEYS = ("all_latents", "all_timesteps", "all_next_latents", "old_log_probs", "advantages", "ref_log_prob",
             "ref_prev_sample_mean", "teacher_prev_sample_mean", "old_prev_sample_mean", "rollout_is_weights")
SINGLE_TIMESTEP_ARCHITECTURES = ("BagelPipeline",)


def steps_per_forward(chunk_rows: int, batch_rows: int, num_timesteps: int) -> int:
    """Timesteps per stacked forward for `chunk_rows` rows (0 = all) and micro-batches of `batch_rows` samples."""
    if chunk_rows < 0:
        raise ValueError(f"{CHUNK_SIZE_VAR} / tsp_chunk_size must be >= 0 rows (0 = all), got {chunk_rows}")
    if chunk_rows == 0:
        return max(num_timesteps, 1)
    return max(1, min(num_timesteps, chunk_rows // max(batch_rows, 1)))


def _is_step_key(key: str, value, num_timesteps: int) -> bool:
    if not isinstance(value, torch.Tensor) or value.is_nested or value.dim() < 2:
        return False
    if key in STEP_KEYS or key.startswith("all_"):
        return value.shape[1] in (num_timesteps, num_timesteps + 1)
    return False


def stack_steps(micro_batch: TensorDict, steps: range, num_timesteps: int) -> TensorDict:
    """The k*B-row batch of `steps` (k of them): row j*B + b is sample b at step steps[j], every step key holding
    that step at column 0 (and step + 1 at column 1 for a (B, T+1, ...) trajectory); other rows repeated."""
    step_keys = [key for key, value in micro_batch.items() if _is_step_key(key, value, num_timesteps)]
    rows = micro_batch.batch_size[0]
    index = torch.arange(rows).repeat(len(steps))
    stacked = tu.index_select_tensor_dict(micro_batch.exclude(*step_keys), index)
    for key in step_keys:
        value = micro_batch[key]
        width = value.shape[1] - num_timesteps + 1  # 1 for (B, T, ...), 2 for (B, T+1, ...)
        stacked[key] = torch.cat([value[:, s:s + width] for s in steps], dim=0)
    return stacked


def _rows(value, start: int, stop: int, total: int):
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == total:
        return value[start:stop]
    return value  # a scalar / broadcast value is the same for every row


class TimestepStackingMixin:
    """Timestep-stacked forwards for an engine whose `forward_backward_batch` loops over `forward_step(micro_batch,
    loss_function, forward_only, step)` (verl-omni's diffusers FSDP and VeOmni engines); see the module docstring."""

    def __init__(self, *args, tsp_chunk_size: Optional[int] = None, **kwargs):
        super().__init__(*args, **kwargs)
        rows = tsp_chunk_size if tsp_chunk_size is not None else int(os.environ.get(CHUNK_SIZE_VAR, "0") or 0)
        steps_per_forward(rows, 1, 1)  # validates
        self.tsp_chunk_rows = rows
        self._tsp_chunk: Optional[dict] = None
        self._tsp_off_reason = self._loop_reason()
        if self._tsp_off_reason:
            print(f"TSP engine: verl-omni's per-timestep loop kept: {self._tsp_off_reason}", flush=True)

    def _loop_reason(self) -> str:
        architecture = getattr(self.model_config, "architecture", None)
        if architecture in SINGLE_TIMESTEP_ARCHITECTURES:
            return f"{architecture}'s adapter reads one timestep for the whole batch (timesteps[0, step])"
        adapters = tuple(getattr(self.model_config, "policy_state_adapters", ("default",)) or ("default",))
        if any(name not in ("default", "reference") for name in adapters):
            return f"policy_state_adapters={list(adapters)}: the step switches LoRA adapters"
        return ""

    def forward_backward_batch(self, data: TensorDict, loss_function: Callable, forward_only: bool = False):
        self._tsp_chunk = None
        try:
            return super().forward_backward_batch(data, loss_function, forward_only)
        finally:
            self._tsp_chunk = None  # the last chunk's batch and graph are not kept past the call

    def forward_step(self, micro_batch: TensorDict, loss_function, forward_only, step):
        num_timesteps = int(micro_batch["all_timesteps"].shape[1])
        k = steps_per_forward(self.tsp_chunk_rows, micro_batch.batch_size[0], num_timesteps)
        if self._tsp_off_reason or k <= 1:
            return super().forward_step(micro_batch, loss_function, forward_only, step)
        chunk = self._tsp_chunk
        if chunk is None or chunk["batch"] is not micro_batch or step not in chunk["outputs"]:
            chunk = self._forward_chunk(micro_batch, loss_function, forward_only,
                                        range(step, min(step + k, num_timesteps)), num_timesteps)
            self._tsp_chunk = chunk
            return chunk["loss"], chunk["outputs"][step]
        return torch.zeros((), requires_grad=not forward_only), chunk["outputs"][step]

    def _forward_chunk(self, micro_batch: TensorDict, loss_function, forward_only: bool, steps: range,
                       num_timesteps: int) -> dict:
        """One stacked forward of `steps` through verl-omni's forward_step; per-step outputs, losses, metrics."""
        stacked = stack_steps(micro_batch, steps, num_timesteps)
        rows, total = micro_batch.batch_size[0], micro_batch.batch_size[0] * len(steps)
        per_step: list[tuple[float, dict]] = []

        def loss_per_timestep(model_output, data, dp_group=None):
            loss, per_step[:] = self._per_step_losses(loss_function, model_output, data, dp_group, len(steps))
            return loss, per_step[0][1]

        wrapped = None if loss_function is None else loss_per_timestep
        loss, output = super().forward_step(stacked, wrapped, forward_only, 0)
        outputs = {}
        for j, step in enumerate(steps):
            model_output = {key: _rows(value, j * rows, (j + 1) * rows, total)
                            for key, value in output["model_output"].items()}
            value, metrics = per_step[j] if per_step else (output["loss"], output["metrics"])
            outputs[step] = {"model_output": model_output, "loss": value, "metrics": metrics}
        return {"batch": micro_batch, "loss": loss, "outputs": outputs}

    def _per_step_losses(self, loss_function: Callable, model_output: dict, data: TensorDict, dp_group,
                         num_steps: int) -> tuple[torch.Tensor, list[tuple[float, dict]]]:
        """The real loss once per timestep on its own rows; (their sum, [(loss value, metrics)] per step)."""
        total = data.batch_size[0]
        rows = total // num_steps
        losses, per_step = [], []
        for j in range(num_steps):
            part = tu.index_select_tensor_dict(data, torch.arange(j * rows, (j + 1) * rows))
            output = {key: _rows(value, j * rows, (j + 1) * rows, total) for key, value in model_output.items()}
            loss, metrics = loss_function(model_output=output, data=part, dp_group=dp_group)
            losses.append(loss)
            per_step.append((loss.detach().item(), metrics))
        return torch.stack(losses).sum(), per_step


class TSPDiffusersFSDPEngine(TimestepStackingMixin, PPODiffusersFSDPEngine):
    """verl-omni's PPO diffusers FSDP engine with timestep-stacked forwards."""


TSPVeOmniDiffusionEngine = None
if VeOmniDiffusionEngine is not None:  # VeOmni installed (verl-omni registers its engine for cuda only)

    class TSPVeOmniDiffusionEngine(TimestepStackingMixin, VeOmniDiffusionEngine):  # noqa: F811
        """verl-omni's VeOmni diffusion engine with timestep-stacked forwards (untested here: no VeOmni)."""


class LoopNFTDiffusersFSDPEngine(NFTDiffusersFSDPEngine):
    """DiffusionNFT's engine, unchanged, registered under TSP_VENDOR only to say why it keeps the loop."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        print("TSP engine: verl-omni's per-timestep loop kept for DiffusionNFT (diffusion_nft_model): its "
              "forward_step switches LoRA adapters (old / reference / default) within every step", flush=True)


def register_tsp_engine() -> list[tuple[str, str]]:
    """Register, under the vendor TSP_VENDOR, the TSP engines for MODEL_TYPE (the FSDP one for fsdp/fsdp2 on
    cuda/npu/cpu, the VeOmni one for veomni on cuda when VeOmni imports) and DiffusionNFT's loop engine (fsdp/fsdp2
    on cuda/npu/cpu). Keys already taken (a second call) are left alone. Returns the (model_type, backend, device)
    keys it registered."""
    wanted = [(cls, model_type, backend, device) for cls, model_type in ((TSPDiffusersFSDPEngine, MODEL_TYPE),
                                                                         (LoopNFTDiffusersFSDPEngine, NFT_MODEL_TYPE))
              for backend in BACKENDS for device in DEVICES]
    if TSPVeOmniDiffusionEngine is not None:
        wanted.append((TSPVeOmniDiffusionEngine, MODEL_TYPE, "veomni", "cuda"))
    added = []
    for engine_cls, model_type, backend, device in wanted:
        if (device, TSP_VENDOR) not in EngineRegistry._engines.get(model_type, {}).get(backend, {}):
            EngineRegistry.register(model_type=model_type, backend=backend, device=device,
                                    vendor=TSP_VENDOR)(engine_cls)
            added.append((model_type, backend, device))
    return added


register_tsp_engine()
