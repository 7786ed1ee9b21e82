"""Timestep-stacked training of one micro-batch: loss and gradient accumulation over its trained steps.

A micro-batch of B samples with K trained steps each has B·K rows (sample b, step k). Two schedules give the
same gradient (up to fp32 rounding of the model on different batch shapes):

* ``per_timestep`` — verl-omni's loop: for each k, one forward + backward over the B samples at their k-th step
  (K small batches);
* ``batched`` (TSP) — rows stacked into the batch dimension, row r = b·K + k (the order of
  `Conditioning.repeat_interleave(K)`), processed in chunks of `chunk_size` rows, one forward + backward per
  chunk. The chunk size bounds the extra activation memory: activations live for one chunk only.

Both call `backward()` themselves (gradients accumulate into `.grad`) and return `LossStats`. The loss of each
forward is Σ rows / loss_denominator (see `loss.py`), so any split into chunks or micro-batches accumulates the
same total.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from digenrl_verl.diffusion.loss import LossConfig, LossStats, policy_loss
from digenrl_verl.diffusion.rollout import Trajectory
from digenrl_verl.diffusion.sde import get_sde_kind, sde_step
from digenrl_verl.errors import ConfigError
from digenrl_verl.models.base import Conditioning, DiffusionAdapter

TSP_MODES = ("per_timestep", "batched")


@dataclass(frozen=True)
class TSPConfig:
    """Args:
        mode: `per_timestep` (K forwards of B rows) or `batched` (B·K rows in chunks).
        chunk_size: rows per forward/backward in `batched` mode; None or 0 = all B·K rows in one forward.
    """

    mode: str = "batched"
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in TSP_MODES:
            raise ConfigError("mode", self.mode, f"valid choices: {list(TSP_MODES)}")
        if self.chunk_size is not None and (not isinstance(self.chunk_size, int) or self.chunk_size < 0):
            raise ConfigError("chunk_size", self.chunk_size, "use an int >= 1, or 0 / None for all rows")


def row_groups(batch_size: int, num_steps: int, cfg: TSPConfig) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(sample index [R], step index [R]) of each forward, in processing order."""
    if cfg.mode == "per_timestep":
        for k in range(num_steps):
            yield torch.arange(batch_size), torch.full((batch_size,), k, dtype=torch.long)
        return
    total = batch_size * num_steps
    chunk = cfg.chunk_size or max(total, 1)
    for start in range(0, total, chunk):
        flat = torch.arange(start, min(start + chunk, total))
        yield flat // num_steps, flat % num_steps


def _gather(traj: Trajectory, b: torch.Tensor, k: torch.Tensor) -> dict[str, torch.Tensor]:
    dev = traj.latents.device
    b, k = b.to(dev), k.to(dev)
    return {"x": traj.latents[b, k], "prev": traj.next_latents[b, k], "sigma": traj.sigmas[b, k],
            "sigma_next": traj.next_sigmas[b, k]}


def _check(cond: Conditioning, traj: Trajectory) -> None:
    if cond.batch_size != traj.batch_size:
        raise ValueError(f"conditioning has {cond.batch_size} rows but the trajectory has {traj.batch_size} samples")
    if not get_sde_kind(traj.sde_type).trainable:
        raise ValueError(f"trajectories sampled with sde_type={traj.sde_type!r} cannot be trained (no log-prob)")


def accumulate_gradients(
    adapter: DiffusionAdapter,
    cond: Conditioning,
    traj: Trajectory,
    advantages: torch.Tensor,
    loss_cfg: LossConfig,
    tsp_cfg: TSPConfig,
    loss_denominator: float,
    *,
    old_log_probs: torch.Tensor | None = None,
    min_passes: int = 0,
) -> LossStats:
    """Forward + backward over every (sample, trained step) row of a micro-batch; gradients accumulate.

    Args:
        adapter: the policy; its trainable parameters receive `.grad` (accumulated, not zeroed).
        cond: conditioning of the B samples (one row each).
        traj: the micro-batch's trajectories (B samples, K steps).
        advantages: fp32 [B] per-sample advantages (clamped), broadcast over the K steps.
        loss_cfg: clip ratio and KL.
        tsp_cfg: `per_timestep` or `batched` (+ chunk size).
        loss_denominator: total rows (samples × trained steps) of the whole global step.
        old_log_probs: [B, K] log-probs of the old policy; default the rollout ones (`traj.log_probs`).
        min_passes: run at least this many forward/backward passes; the extra ones repeat row (0, 0) with the
            loss scaled by 0 (no gradient, no stats). Sharded (FSDP2) trainer ranks must run the same number of
            passes, since every pass is a collective; ranks holding fewer rows pad up to the largest share
            (`count_passes`).
    Returns:
        LossStats summed over the micro-batch's rows.
    """
    _check(cond, traj)
    b_total, k_total = traj.batch_size, traj.num_steps
    old = traj.log_probs if old_log_probs is None else old_log_probs
    if old.shape != (b_total, k_total) or advantages.shape != (b_total,):
        raise ValueError(f"old_log_probs must be [B, K]={[b_total, k_total]} and advantages [B]={[b_total]}, got "
                         f"{list(old.shape)} and {list(advantages.shape)}")
    kind = get_sde_kind(traj.sde_type)
    stats = LossStats()

    def one_pass(b: torch.Tensor, k: torch.Tensor, scale: float) -> LossStats:
        rows = _gather(traj, b, k)
        sub = cond.index_select(b)
        ref_mean = None
        if loss_cfg.kl_coef > 0:
            with torch.no_grad(), adapter.reference():
                v_ref = adapter.velocity(rows["x"], rows["sigma"], sub)
                ref_mean = kind.mean_std(rows["x"].float(), v_ref.float(), rows["sigma"].float(),
                                         rows["sigma_next"].float(), traj.noise_level)[0]
        v = adapter.velocity(rows["x"], rows["sigma"], sub)
        out = sde_step(kind, v, rows["x"], rows["sigma"], rows["sigma_next"], traj.noise_level,
                       prev_sample=rows["prev"])
        dev = out.log_prob.device
        loss, s = policy_loss(out.log_prob, old[b.to(old.device), k.to(old.device)].to(dev),
                              advantages[b.to(advantages.device)].to(dev), loss_cfg, loss_denominator,
                              mean=out.mean, ref_mean=ref_mean, std_dev_t=out.std_dev_t, std=out.std,
                              sde_type=kind)
        (loss * scale if scale != 1.0 else loss).backward()
        return s

    passes = 0
    for b, k in row_groups(b_total, k_total, tsp_cfg):
        stats = stats + one_pass(b, k, 1.0)
        passes += 1
    for _ in range(passes, min_passes):  # lock-step padding (see the docstring): same collectives, no gradient
        one_pass(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 0.0)
    return stats


def count_passes(batch_size: int, num_steps: int, cfg: TSPConfig) -> int:
    """Forward passes `accumulate_gradients` / `compute_log_probs` run for `batch_size` samples."""
    return sum(1 for _ in row_groups(batch_size, num_steps, cfg))


@torch.no_grad()
def compute_log_probs(adapter: DiffusionAdapter, cond: Conditioning, traj: Trajectory, *,
                      tsp_cfg: TSPConfig = TSPConfig(), reference: bool = False, min_passes: int = 0) -> torch.Tensor:
    """Log-probs [B, K] of the recorded steps under the current policy (or the reference), without grad.

    This is the optional recompute pass for `old_log_probs`; on-policy, it equals `traj.log_probs` up to fp32
    rounding (the on-policy check: max |exp(recomputed − rollout) − 1|). `min_passes`: lock-step padding, as
    in `accumulate_gradients` (extra forwards of row (0, 0), discarded).
    """
    _check(cond, traj)
    out = torch.zeros(traj.batch_size, traj.num_steps, dtype=torch.float32, device=traj.log_probs.device)
    ctx = adapter.reference() if reference else contextlib.nullcontext()
    with ctx:
        passes = 0
        for b, k in row_groups(traj.batch_size, traj.num_steps, tsp_cfg):
            rows = _gather(traj, b, k)
            v = adapter.velocity(rows["x"], rows["sigma"], cond.index_select(b))
            step = sde_step(traj.sde_type, v, rows["x"], rows["sigma"], rows["sigma_next"], traj.noise_level,
                            prev_sample=rows["prev"])
            out[b.to(out.device), k.to(out.device)] = step.log_prob.to(out.device)
            passes += 1
        for _ in range(passes, min_passes):
            first = torch.zeros(1, dtype=torch.long)
            rows = _gather(traj, first, first)
            adapter.velocity(rows["x"], rows["sigma"], cond.index_select(first))
    return out
