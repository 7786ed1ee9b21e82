"""DigenRL's trajectories in verl-omni's training-batch layout (what `PPODiffusersFSDPEngine` reads).

A generator's UPDATE data (`workers.roles` lists its keys: ``latents`` / ``next_latents`` [B, K, *L] at the K trained
steps, ``step_index`` [B, K], ``rollout_log_probs`` [B, K]) plus the prompt conditioning and the advantages become
the TensorDict verl-omni's rollout hands its actor (`verl_omni/pipelines/*/vllm_omni_rollout_adapter.py` records it,
its trainer adds the rest):

| verl-omni key | from |
|---|---|
| ``all_latents`` [B, K+1, *L] | ``latents`` then the last ``next_latents``: x at each trained step, the last x' |
| ``all_timesteps`` [B, K] | the engine's own scheduler: ``scheduler.timesteps[step_index]`` (it looks σ up by them) |
| ``old_log_probs`` [B, K] | ``rollout_log_probs`` (the caller may overwrite them with a recompute) |
| ``advantages`` [B, K] | the sample's advantage on each of its steps (verl-omni's layout: per step) |
| ``prompt_embeds``, ``..._mask``, ``pooled_prompt_embeds``, negatives | the `Conditioning` tensors, same names (a
  missing mask, SD3's, all ones as verl-omni's SD3 rollout records it), then verl-omni's `embeds_padding_2_no_padding`
  (nested, as its trainer passes them) |

verl-omni's engine runs step j on ``all_latents[:, j]`` -> ``all_latents[:, j + 1]``, so the trained steps must be
consecutive (every step, the first ⌊N·f⌋, or an SDE window: what verl-omni trains); a permutation (DanceGRPO with
``algorithm.timestep_fraction`` < 1) is refused naming the key. σ of each step must equal the engine scheduler's to
1e-5 (a different shift or step count is refused, naming the keys that set them).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl_omni.workers.utils.padding import embeds_padding_2_no_padding

SIGMA_TOLERANCE = 1e-5


def consecutive_steps(step_index: torch.Tensor) -> None:
    """ValueError naming the key unless every row's trained steps follow one another (k, k+1, ...)."""
    if step_index.shape[1] > 1 and not bool((step_index.diff(dim=1) == 1).all()):
        raise ValueError(
            f"algorithm.timestep_fraction: verl-omni's engine trains consecutive sampling steps (all_latents[:, j] "
            f"-> all_latents[:, j + 1]), these samples trained steps {step_index[0].tolist()}; use "
            "algorithm.timestep_fraction=1.0 or an SDE window (actor_rollout_ref.rollout.algo.sde_window_size), or "
            "trainer.digenrl.trainer_engine=digenrl")


def scheduler_timesteps(scheduler: Any, step_index: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """The engine scheduler's timesteps [B, K] at `step_index`; ValueError when its σ there differ from the
    generator's `sigmas` (the two sampled different schedules)."""
    timesteps = torch.as_tensor(scheduler.timesteps).detach().to("cpu", torch.float32)
    theirs = torch.as_tensor(scheduler.sigmas).detach().to("cpu", torch.float32)
    if int(step_index.max()) >= timesteps.numel():
        raise ValueError(f"actor_rollout_ref.model.pipeline.num_inference_steps: the trainer's scheduler has "
                         f"{timesteps.numel()} steps, the samples reach step {int(step_index.max())}")
    gap = float((theirs[step_index] - sigmas.to(torch.float32)).abs().max())
    if gap > SIGMA_TOLERANCE:
        raise ValueError(f"actor_rollout_ref.model.pipeline (num_inference_steps, height/width, the scheduler's "
                         f"shift): the generator sampled σ that differ from verl-omni's scheduler by {gap:.2e} "
                         "(> 1e-5); both sides must read the same pipeline settings")
    return timesteps[step_index]


def to_verl_omni_batch(trajectory: Mapping[str, torch.Tensor], conditioning: Mapping[str, torch.Tensor],
                       advantages: torch.Tensor, scheduler: Any, *, dtype: torch.dtype = torch.float32) -> TensorDict:
    """verl-omni's training batch (module docstring) for B samples.

    Args:
        trajectory: ``latents``, ``next_latents``, ``sigmas``, ``step_index``, ``rollout_log_probs`` (the UPDATE
            data's batch).
        conditioning: the prompts' `Conditioning.tensors` (verl-omni's names).
        advantages: [B], one per sample.
        scheduler: the engine's scheduler (`engine.scheduler`), its timesteps set.
        dtype: of the latents (the trajectories are fp32; verl-omni's engine casts where it needs).
    """
    step_index = trajectory["step_index"].to(torch.int64)
    consecutive_steps(step_index)
    latents, following = trajectory["latents"], trajectory["next_latents"]
    batch, steps = step_index.shape
    fields = {
        "all_latents": torch.cat([latents, following[:, -1:]], dim=1).to(dtype),
        "all_timesteps": scheduler_timesteps(scheduler, step_index, trajectory["sigmas"]),
        "old_log_probs": trajectory["rollout_log_probs"].to(torch.float32),
        "advantages": advantages.to(torch.float32).reshape(batch, 1).expand(batch, steps).contiguous(),
    }
    fields.update(conditioning)
    for name in ("prompt_embeds", "negative_prompt_embeds"):  # SD3's encoder has no mask: all tokens, as verl-omni's
        if name in fields and f"{name}_mask" not in fields:   # SD3 rollout records it
            fields[f"{name}_mask"] = torch.ones(fields[name].shape[:2], dtype=torch.int64)
    return embeds_padding_2_no_padding(TensorDict(fields, batch_size=batch))  # as verl-omni's trainer hands it on


def with_engine_meta(data: TensorDict, *, micro_batch_size: int, height: int, width: int,
                     vae_scale_factor: int = 8, **extra: Any) -> TensorDict:
    """`data` with the non-tensor fields verl-omni's trainer sets on a batch before its actor (the micro-batch
    size its `prepare_micro_batches` cuts by, the image size its flops counter reads)."""
    tu.assign_non_tensor(data, micro_batch_size_per_gpu=micro_batch_size, height=height, width=width,
                         vae_scale_factor=vae_scale_factor, **extra)
    return data
