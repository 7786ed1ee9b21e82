"""One reverse step of a rectified flow, with the Gaussian log-probability of its transition.

Conventions (rectified flow, as Flow-GRPO's `sde_step_with_logprob` and DanceGRPO write it):
x_σ = (1−σ)·x0 + σ·ε, the model predicts v ≈ ε − x0, a step goes from σ to σ' < σ with dt = σ' − σ < 0.
Every quantity is per row: `sigma` and `sigma_next` are fp32 [B] tensors, so one call may mix rows at
different timesteps (TSP).
All math runs in fp32 whatever the dtype of the model output.

A step kind maps (x, v, σ, σ', noise_level) to the transition x' ~ N(μ, s²·I):

| kind | σ_t (`std_dev_t`) | μ (`mean`) | s (`std`) | log-prob |
|---|---|---|---|---|
| `sde` (Flow-GRPO) | a·sqrt(σ/(1−σ̃)), σ̃ = σ' if σ == 1 else σ | x(1+σ_t²dt/(2σ)) + v(1+σ_t²(1−σ)/(2σ))dt | σ_t·sqrt(−dt) | Gaussian |
| `dance` (DanceGRPO, alias `dance_sde`) | η = a (constant) | x + v·dσ − ½η²·score·dσ, score = −(x+(1−σ)v)/σ | η·sqrt(σ−σ') | Gaussian |
| `cps` | σ'·sin(a·π/2) | (1−σ')·x̂0 + sqrt(σ'²−σ_t²)·x̂1 | σ_t | −mean((x'−μ)²) |
| `ode` | 0 | x + v·dt (Euler, = diffusers' FlowMatchEulerDiscreteScheduler) | 0 | not defined |

"Gaussian" is mean over non-batch dims of −(x'−μ)²/(2s²) − log s − ½·log 2π, with x' detached.

On `sde` at σ = 1: Flow-GRPO substitutes σ̃ = σ_max = sigmas[1]. σ = 1 only ever occurs at the first
step, whose σ' is sigmas[1], so σ̃ = σ' there; this keeps the step a function of (σ, σ') alone.

`dance` is the Flow-GRPO drift with σ_t held at the constant η: algebraically
`dance(x, v, σ, σ', η)` has the same mean, std and log-prob as the `sde` formulas evaluated with
std_dev_t := η (see `flow_sde_mean`); the two differ only by fp32 rounding because they are written
in DanceGRPO's and Flow-GRPO's operation orders respectively.

verl-omni's scheduler returns σ_t as `std_dev_t` for `sde` and `cps`, but the step std s = η·sqrt(σ−σ') for
`dance_sde`; `StepKind.verl_omni_std_dev_t` gives that value (the denominator of the `flow_grpo` KL, `loss.py`).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from digenrl_verl.errors import ConfigError

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)

#: Config keys (verl-omni naming) that user-facing errors name.


@dataclass(frozen=True)
class StepOutput:
    """Result of one reverse step.

    Attributes:
        prev_sample: x' fp32 [B, *latent] — the draw (sampling) or the given `prev_sample` (evaluation).
        log_prob: fp32 [B], mean over the non-batch dims; None for a sampled `ode` step.
        mean: μ fp32 [B, *latent], differentiable w.r.t. the velocity.
        std: s fp32 [B], the step's standard deviation (x' = μ + s·z).
        std_dev_t: σ_t fp32 [B], the diffusion coefficient (Flow-GRPO's `std_dev_t`; KL denominator).
    """

    prev_sample: torch.Tensor
    log_prob: torch.Tensor | None
    mean: torch.Tensor
    std: torch.Tensor
    std_dev_t: torch.Tensor


def _rows(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] → [B, 1, …, 1] broadcastable against `like`."""
    return t.reshape(t.shape[0], *([1] * (like.ndim - 1)))


def gaussian_log_prob(prev_sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Mean over non-batch dims of log N(x'; μ, s²), x' detached; `std` is [B]. Returns fp32 [B]."""
    s = _rows(std, mean)
    lp = -((prev_sample.detach() - mean) ** 2) / (2 * s**2) - torch.log(s) - _LOG_SQRT_2PI
    return lp.mean(dim=tuple(range(1, lp.ndim)))


def flow_sde_mean(x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor,
                  std_dev_t: torch.Tensor) -> torch.Tensor:
    """Flow-GRPO's Euler–Maruyama mean for a given diffusion coefficient σ_t (all [B] per row)."""
    sig, dt, st = _rows(sigma, x), _rows(sigma_next - sigma, x), _rows(std_dev_t, x)
    return x * (1 + st**2 / (2 * sig) * dt) + v * (1 + st**2 * (1 - sig) / (2 * sig)) * dt


class StepKind(abc.ABC):
    """One family of reverse steps. Subclasses are stateless; register instances with `register_sde_kind`."""

    name: str
    #: Whether the transition has a log-density that can be trained (False for `ode`).
    trainable: bool = True
    #: Whether `log_prob` is defined where the step std is 0 (CPS's scaled density is).
    zero_std_ok: bool = False

    def verl_omni_std_dev_t(self, std_dev_t: torch.Tensor | None, std: torch.Tensor | None) -> torch.Tensor | None:
        """What verl-omni's `sample_previous_step` returns as `std_dev_t` for this kind (its `KLLoss` divides
        by its square): σ_t here (`sde`, and `cps`, where σ_t is the step std)."""
        return std_dev_t

    @abc.abstractmethod
    def mean_std(self, x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor,
                 noise_level: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(μ [B,*], s [B], σ_t [B]) in fp32."""

    def log_prob(self, prev_sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        if bool((std <= 0).any()):
            raise ValueError(
                f"sde_type={self.name!r} has a zero step std on some rows (noise_level=0 or σ'=σ), "
                "so its log-prob is log 0 and the step cannot be trained; set noise_level > 0 or "
                "exclude those steps from training")
        return gaussian_log_prob(prev_sample, mean, std)


class FlowGRPOSDE(StepKind):
    name = "sde"

    def mean_std(self, x, v, sigma, sigma_next, noise_level):
        sigma_tilde = torch.where(sigma == 1, sigma_next, sigma)
        std_dev_t = torch.sqrt(sigma / (1 - sigma_tilde)) * noise_level
        mean = flow_sde_mean(x, v, sigma, sigma_next, std_dev_t)
        return mean, std_dev_t * torch.sqrt(sigma - sigma_next), std_dev_t


class DanceSDE(StepKind):
    name = "dance"

    def mean_std(self, x, v, sigma, sigma_next, noise_level):
        eta = float(noise_level)
        sig, dsigma = _rows(sigma, x), _rows(sigma_next - sigma, x)
        x0_hat = x - sig * v
        score = -(x - x0_hat * (1 - sig)) / sig**2
        mean = x + dsigma * v - 0.5 * eta**2 * score * dsigma
        std = eta * torch.sqrt(sigma - sigma_next)
        return mean, std, torch.full_like(sigma, eta)

    def verl_omni_std_dev_t(self, std_dev_t, std):
        # verl-omni's `dance_sde` returns the step std η·sqrt(σ−σ') as `std_dev_t`, not σ_t = η.
        return std


class CPS(StepKind):
    name = "cps"
    zero_std_ok = True

    def mean_std(self, x, v, sigma, sigma_next, noise_level):
        std_dev_t = sigma_next * math.sin(noise_level * math.pi / 2)
        sig, sig_next = _rows(sigma, x), _rows(sigma_next, x)
        x0_hat = x - sig * v
        x1_hat = x + (1 - sig) * v
        mean = x0_hat * (1 - sig_next) + x1_hat * torch.sqrt(sig_next**2 - _rows(std_dev_t, x) ** 2)
        return mean, std_dev_t, std_dev_t

    def log_prob(self, prev_sample, mean, std):
        # CPS drops the 1/(2σ_t²) factor and the constants: a scaled log-density (finite even at σ_t = 0).
        lp = -((prev_sample.detach() - mean) ** 2)
        return lp.mean(dim=tuple(range(1, lp.ndim)))


class ODE(StepKind):
    name = "ode"
    trainable = False

    def mean_std(self, x, v, sigma, sigma_next, noise_level):
        mean = x + _rows(sigma_next - sigma, x) * v
        zero = torch.zeros_like(sigma)
        return mean, zero, zero

    def log_prob(self, prev_sample, mean, std):
        raise ValueError(
            "sde_type='ode' is deterministic (η=0) and has no log-prob, so it is never trained; set sde_type "
            f"to one of {sorted(k for k, v in _KINDS.items() if v.trainable)}")


_KINDS: dict[str, StepKind] = {}


def register_sde_kind(kind: StepKind, *, aliases: Sequence[str] = ()) -> StepKind:
    """Register a step kind under its `name` and `aliases`; duplicates are rejected."""
    for key in (kind.name, *aliases):
        if key in _KINDS:
            raise ValueError(f"SDE kind {key!r} is already registered ({type(_KINDS[key]).__name__})")
    for key in (kind.name, *aliases):
        _KINDS[key] = kind
    return kind


def get_sde_kind(name: str) -> StepKind:
    """The step kind registered as `name` (ValueError naming the key and the valid names on a miss)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise ConfigError("sde_type", name, f"valid choices: {sorted(_KINDS)}") from None


def sde_kinds() -> list[str]:
    """All registered names (aliases included)."""
    return sorted(_KINDS)


register_sde_kind(FlowGRPOSDE())
register_sde_kind(CPS())
register_sde_kind(DanceSDE(), aliases=("dance_sde",))
register_sde_kind(ODE())


def draw_noise(generators: Sequence[torch.Generator], shape: Sequence[int], device: torch.device) -> torch.Tensor:
    """One standard-normal draw of `shape` per generator, fp32 [len(generators), *shape] on `device`.

    Each row uses only its own generator (drawn on the generator's device), so a sample's noise does not
    depend on its batch neighbours.
    """
    rows = [torch.randn(tuple(shape), generator=g, device=g.device, dtype=torch.float32) for g in generators]
    return torch.stack(rows).to(device)


def sde_step(
    kind: str | StepKind,
    v: torch.Tensor,
    x: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    noise_level: float,
    *,
    prev_sample: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    generators: Sequence[torch.Generator] | None = None,
) -> StepOutput:
    """One reverse step from σ to σ' per row, in fp32.

    Two uses:
      * sampling — give `generators` (one per row) or a standard-normal `noise` [B,*]; x' = μ + s·z is drawn
        (for `ode`, x' = μ and nothing is drawn) and its log-prob returned (None for `ode`);
      * evaluation — give `prev_sample` x' [B,*]: its log-prob under the current v is returned (this is what
        training differentiates; raises ValueError for `ode` or a zero step std).

    Args:
        kind: a registered kind name (`sde`, `cps`, `dance`/`dance_sde`, `ode`) or a StepKind.
        v: model velocity [B,*latent] (any float dtype; upcast to fp32).
        x: current latents at σ, [B,*latent].
        sigma, sigma_next: fp32 [B] per-row σ and σ' (σ' < σ).
        noise_level: a (Flow-GRPO `noise_level`, CPS `a`) or η (DanceGRPO).
    """
    step = kind if isinstance(kind, StepKind) else get_sde_kind(kind)
    given = sum(a is not None for a in (prev_sample, noise, generators))
    if given > 1:
        raise ValueError("sde_step takes at most one of prev_sample (evaluation), noise or generators (sampling)")
    x32, v32 = x.to(torch.float32), v.to(torch.float32)
    sigma = sigma.to(device=x.device, dtype=torch.float32)
    sigma_next = sigma_next.to(device=x.device, dtype=torch.float32)
    if sigma.shape != (x.shape[0],) or sigma_next.shape != (x.shape[0],):
        raise ValueError(f"sigma and sigma_next must be [B]={x.shape[0]} per-row tensors, got "
                         f"{tuple(sigma.shape)} and {tuple(sigma_next.shape)}")
    mean, std, std_dev_t = step.mean_std(x32, v32, sigma, sigma_next, noise_level)
    if prev_sample is not None:
        prev = prev_sample.to(torch.float32)
        return StepOutput(prev, step.log_prob(prev, mean, std), mean, std, std_dev_t)
    if not step.trainable:
        return StepOutput(mean.detach(), None, mean, std, std_dev_t)
    if noise is None:
        if generators is None:
            raise ValueError("sampling needs `noise` or one torch.Generator per row in `generators`")
        if len(generators) != x.shape[0]:
            raise ValueError(f"got {len(generators)} generators for a batch of {x.shape[0]} rows")
        noise = draw_noise(generators, x.shape[1:], x.device)
    prev = (mean + _rows(std, mean) * noise.to(mean)).detach()
    if step.zero_std_ok or bool((std > 0).all()):
        return StepOutput(prev, step.log_prob(prev, mean, std), mean, std, std_dev_t)
    # Sampling with zero-std rows (noise_level 0): those rows have no density; mark them NaN, keep the others.
    log_prob = torch.full((prev.shape[0],), float("nan"), dtype=torch.float32, device=prev.device)
    ok = std > 0
    if bool(ok.any()):
        log_prob[ok] = step.log_prob(prev[ok], mean[ok], std[ok])
    return StepOutput(prev, log_prob, mean, std, std_dev_t)
