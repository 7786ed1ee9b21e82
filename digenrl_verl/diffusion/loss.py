"""Flow-GRPO clipped-ratio objective with an optional KL to the reference, normalised for exact accumulation.

Per row (one sample at one trained step):

    ratio   = exp(logp_θ − logp_old)
    pg      = max(−A·ratio, −A·clamp(ratio, 1−ε_c, 1+ε_c))
    kl      = mean_dims((μ_θ − μ_ref)²) / (2·d²)
    row     = pg + β·kl

The KL denominator d, by `kl_type` and sde_type (σ_t the diffusion coefficient, s the step std, see `sde.py`):

| kl_type | `sde` | `cps` | `dance` | |
|---|---|---|---|---|
| `flow_grpo` (default) | σ_t = a·sqrt(σ/(1−σ̃)) | σ_t = s | s = η·sqrt(σ−σ') | verl-omni `KLLoss` ÷ its `std_dev_t`² |
| `exact` | s = σ_t·sqrt(σ−σ') | s | s | Gaussian KL of N(μ_θ, s²), N(μ_ref, s²) (GenRL) |
| `sigma_t` | σ_t | σ_t = s | η | ÷ σ_t² for every kind |

`flow_grpo` is Flow-GRPO's and verl-omni's KL: verl-omni's scheduler returns σ_t as `std_dev_t` for `sde` and
`cps` but the step std for `dance_sde`, and its `KLLoss` divides by that. `sigma_t` is this project's former
`flow_grpo` (σ_t = η for `dance`): the same as `flow_grpo` except on `dance`, where it is verl-omni's value
times (σ−σ') (×1/21 at σ = 0.96 with 10 steps and shift 3). `exact` averages the per-dimension Gaussian KL
over dimensions like the log-probs are; it equals `flow_grpo` on `cps` and `dance`.

Normalisation: a micro-batch contributes  Σ_rows row / loss_denominator,  where loss_denominator is the total
number of (sample, step) rows of the whole global step (all micro-batches, all ranks). The step's gradient is
then the same sum whatever the partition into micro-batches, the number of ranks or their order — the
property that makes disaggregated on-policy training give the colocated weights. (A per-micro-batch mean
divided by the number of accumulation steps equals this only when all micro-batches have the same size.)

Metrics are kept as sums (`LossStats`) so they merge exactly across micro-batches and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from digenrl_verl.diffusion.sde import StepKind, get_sde_kind

KEY_CLIP = "actor_rollout_ref.actor.diffusion_loss.clip_ratio"
KEY_KL_COEF = "actor_rollout_ref.actor.kl_loss_coef"
KEY_KL_TYPE = "actor_rollout_ref.actor.kl_loss_type"

KL_TYPES = ("flow_grpo", "exact", "sigma_t")


@dataclass(frozen=True)
class LossConfig:
    """Args:
        clip_ratio: ε_c (1e-4 Flow-GRPO default, 1e-5 fast configs, 1e-3 Wan).
        kl_coef: β; 0 disables the KL term and the reference forward.
        kl_type: `flow_grpo` (verl-omni `KLLoss`: ÷ σ_t², ÷ s² for `dance`), `exact` (÷ step variance s²) or
            `sigma_t` (÷ σ_t², η² for `dance`); see the module docstring.
    """

    clip_ratio: float = 1e-4
    kl_coef: float = 0.0
    kl_type: str = "flow_grpo"

    def __post_init__(self) -> None:
        if not self.clip_ratio > 0:
            raise ValueError(f"{KEY_CLIP}={self.clip_ratio!r} must be > 0")
        if not self.kl_coef >= 0:
            raise ValueError(f"{KEY_KL_COEF}={self.kl_coef!r} must be ≥ 0")
        if self.kl_type not in KL_TYPES:
            raise ValueError(f"unknown {KEY_KL_TYPE}={self.kl_type!r}; valid choices: {list(KL_TYPES)}")


@dataclass
class LossStats:
    """Sums over rows, mergeable across micro-batches and ranks (`+`); `metrics()` turns them into means."""

    rows: float = 0.0
    pg_sum: float = 0.0
    kl_sum: float = 0.0
    clipped: float = 0.0
    sq_log_ratio_sum: float = 0.0
    ratio_sum: float = 0.0
    ratio_min: float = float("inf")
    ratio_max: float = float("-inf")
    loss_sum: float = 0.0  # Σ of the (already normalised) micro-batch losses

    def __add__(self, other: "LossStats") -> "LossStats":
        out = LossStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})
        out.ratio_min = min(self.ratio_min, other.ratio_min)
        out.ratio_max = max(self.ratio_max, other.ratio_max)
        return out

    def metrics(self, prefix: str = "actor/") -> dict[str, float]:
        n = max(self.rows, 1.0)
        return {
            f"{prefix}loss": self.loss_sum,
            f"{prefix}pg_loss": self.pg_sum / n,
            f"{prefix}kl_loss": self.kl_sum / n,
            f"{prefix}pg_clipfrac": self.clipped / n,
            f"{prefix}approx_kl": 0.5 * self.sq_log_ratio_sum / n,
            f"{prefix}ratio_mean": self.ratio_sum / n,
            f"{prefix}ratio_min": self.ratio_min,
            f"{prefix}ratio_max": self.ratio_max,
            f"{prefix}rows": self.rows,
        }


def kl_denominator(kl_type: str, sde_type: str | StepKind | None, std_dev_t: torch.Tensor | None,
                   std: torch.Tensor | None) -> torch.Tensor:
    """The KL denominator d [R] of `kl_type` for steps of `sde_type` (see the table in the module docstring)."""
    if kl_type == "flow_grpo":
        if sde_type is None:
            raise ValueError(f"{KEY_KL_TYPE}='flow_grpo' needs the sde_type (verl-omni's std_dev_t depends on it)")
        kind = sde_type if isinstance(sde_type, StepKind) else get_sde_kind(sde_type)
        denom, needed = kind.verl_omni_std_dev_t(std_dev_t, std), f"std_dev_t and std (sde_type={kind.name!r})"
    elif kl_type == "sigma_t":
        denom, needed = std_dev_t, "std_dev_t"
    elif kl_type == "exact":
        denom, needed = std, "std"
    else:
        raise ValueError(f"unknown {KEY_KL_TYPE}={kl_type!r}; valid choices: {list(KL_TYPES)}")
    if denom is None:
        raise ValueError(f"{KEY_KL_TYPE}={kl_type!r} needs {needed}")
    return denom


def kl_to_reference(mean: torch.Tensor, ref_mean: torch.Tensor, denom_std: torch.Tensor) -> torch.Tensor:
    """mean_dims((μ − μ_ref)²) / (2·d²) per row; `denom_std` is d [R]. Returns [R]."""
    sq = ((mean - ref_mean.detach()) ** 2).mean(dim=tuple(range(1, mean.ndim)))
    return sq / (2 * denom_std**2)


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    cfg: LossConfig,
    loss_denominator: float,
    *,
    mean: torch.Tensor | None = None,
    ref_mean: torch.Tensor | None = None,
    std_dev_t: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
    sde_type: str | StepKind | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The loss of R rows: Σ_rows (pg + β·kl) / loss_denominator, and its stats.

    Args:
        log_prob: [R] under the current policy (differentiable).
        old_log_prob: [R] under the sampling (old) policy.
        advantages: [R] (already clamped; broadcast per sample over its steps by the caller).
        cfg: the loss config.
        loss_denominator: total rows of the whole global step (> 0).
        mean, ref_mean: [R, *latent] step means of the policy and the reference (needed when kl_coef > 0).
        std_dev_t, std: [R] σ_t and the step std s of the steps (`StepOutput.std_dev_t`, `StepOutput.std`).
        sde_type: the step kind of the rows (the `flow_grpo` KL denominator depends on it).
    """
    if not loss_denominator > 0:
        raise ValueError(f"loss_denominator must be > 0 (total rows of the global step), got {loss_denominator!r}")
    old = old_log_prob.detach().to(log_prob)
    adv = advantages.detach().to(log_prob)
    log_ratio = log_prob - old
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - cfg.clip_ratio, 1.0 + cfg.clip_ratio)
    pg = torch.maximum(-adv * ratio, -adv * clipped_ratio)
    rows = pg
    kl = None
    if cfg.kl_coef > 0:
        if mean is None or ref_mean is None:
            raise ValueError(f"{KEY_KL_COEF}={cfg.kl_coef} needs the policy and reference step means")
        denom = kl_denominator(cfg.kl_type, sde_type, std_dev_t, std)
        if bool((denom <= 0).any()):
            raise ValueError(f"{KEY_KL_TYPE}={cfg.kl_type!r}: the KL denominator is 0 on some rows (a deterministic "
                             "step, e.g. cps at σ'=0); exclude those steps from training")
        kl = kl_to_reference(mean, ref_mean, denom.to(mean))
        rows = rows + cfg.kl_coef * kl
    loss = rows.sum() / loss_denominator
    with torch.no_grad():
        r = ratio.detach()
        stats = LossStats(
            rows=float(r.numel()),
            pg_sum=float(pg.sum()),
            kl_sum=float(kl.sum()) if kl is not None else 0.0,
            clipped=float(((r - 1).abs() > cfg.clip_ratio).sum()),
            sq_log_ratio_sum=float((log_ratio.detach() ** 2).sum()),
            ratio_sum=float(r.sum()),
            ratio_min=float(r.min()) if r.numel() else float("inf"),
            ratio_max=float(r.max()) if r.numel() else float("-inf"),
            loss_sum=float(loss),
        )
    return loss, stats
