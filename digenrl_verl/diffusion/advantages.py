"""GRPO advantages for diffusion: group-normalised scalar rewards (one per sample, broadcast over its steps).

    A_i = (r_i − mean_{group(i)} r) / (std + ε)      then clamped to ±adv_clip_max

`std` is the std of the whole batch when `global_std` (Flow-GRPO and verl-omni default) or of the sample's
group otherwise; `norm_adv_by_std=False` skips the division (Dr.GRPO). verl-omni uses torch.std (unbiased,
`unbiased_std=True`, the default here); Flow-GRPO uses np.std (biased). A group of one sample has advantage 0
(verl-omni's convention for a group std is 1 then, and its mean is its own reward).

verl-omni takes both stds over its [B, T] `sample_level_rewards` (each sample's reward repeated over its T trained
timesteps: `compute_flow_grpo_outcome_advantage` in verl_omni/trainer/diffusion/diffusion_algos.py), so with
Bessel's correction its std is sqrt(T(n−1)/(nT−1)) times the std over the n rewards. `timesteps_per_sample` is
that T (the run's trained steps per sample); 1 gives the std over the rewards.

With global_std the batch is the one passed in: call this once on the whole gathered step batch, not per
micro-batch, or the normalisation differs from colocated training.

The arithmetic is verl-omni's, float32 (`REWARD_DTYPE`: its trainer's reward tensor): each group's mean over its
[n, T] block in batch order, the reward minus that mean, the std over [B, T], the quotient. Rewards of a group
often differ in their 3rd-4th digit (0.4053 and 0.4075), where the float32 mean's rounding moves r − mean by up to
~3e-5 relative: float64 here would be more exact, and then not the advantages verl-omni trains with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Hashable, Mapping, Sequence

import torch

from digenrl_verl.errors import ConfigError


MULTI_REWARD_MODES = ("weighted_sum", "normalize_then_weight")
#: the dtype verl-omni's trainer holds rewards and computes advantages in (`compute_flow_grpo_outcome_advantage`)
REWARD_DTYPE = torch.float32


@dataclass(frozen=True)
class AdvantageConfig:
    """Args:
        global_std: normalise by the whole batch's std (True) or each group's (False).
        epsilon: added to the std (1e-4 in Flow-GRPO / verl-omni; DanceGRPO uses 1e-8).
        norm_adv_by_std: divide by the std at all (False = Dr.GRPO).
        adv_clip_max: clamp to ±this; None disables the clamp.
        unbiased_std: Bessel-corrected std (torch.std default, verl-omni) or population std (np.std, Flow-GRPO).
        timesteps_per_sample: T, each reward's weight in the stds (verl-omni's stds are over B x T elements, each
            sample's reward repeated over its T trained timesteps); 1 = the std over the rewards.
        deferred_std: with `global_std`, a disaggregated run's trainer accumulates group-centred rewards as groups are
            scored and scales the step's gradient by 1/(σ + ε) at its optimizer step (the section below
            `deferred_supported`); the advantages are the same, only when they are applied changes. Set by the
            config layer (`config.verl_omni.honour_global_std`), never by `normalize_rewards`.
    """

    global_std: bool = True
    epsilon: float = 1e-4
    norm_adv_by_std: bool = True
    adv_clip_max: float | None = 5.0
    unbiased_std: bool = True
    timesteps_per_sample: int = 1
    deferred_std: bool = False

    def __post_init__(self) -> None:
        t = self.timesteps_per_sample
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ConfigError("timesteps_per_sample", t, "must be an int >= 1 (the trained timesteps per sample)")
        if not self.epsilon >= 0:
            raise ConfigError("epsilon", self.epsilon, "must be >= 0")
        if self.adv_clip_max is not None and not self.adv_clip_max > 0:
            raise ConfigError("adv_clip_max", self.adv_clip_max, "must be > 0 (or None to disable the clamp)")


@dataclass(frozen=True)
class AdvantageResult:
    """Attributes:
        advantages: fp32 [B], one per sample (broadcast over its K trained steps by the loss).
        num_groups: number of distinct uids.
        zero_std_groups: groups whose rewards are all equal (their advantages are 0: no learning signal).
    """

    advantages: torch.Tensor
    num_groups: int
    zero_std_groups: int

    @property
    def zero_std_ratio(self) -> float:
        return self.zero_std_groups / max(self.num_groups, 1)

    def metrics(self, prefix: str = "adv/") -> dict[str, float]:
        a = self.advantages
        return {f"{prefix}mean": float(a.mean()), f"{prefix}std": float(a.std()) if a.numel() > 1 else 0.0,
                f"{prefix}max": float(a.max()), f"{prefix}min": float(a.min()),
                f"{prefix}zero_std_groups": float(self.zero_std_groups), f"{prefix}zero_std_ratio": self.zero_std_ratio}


def _group_index(uids: Sequence[Hashable]) -> tuple[torch.Tensor, int]:
    ids: dict[Hashable, int] = {}
    index = torch.tensor([ids.setdefault(u, len(ids)) for u in uids], dtype=torch.long)
    return index, len(ids)


def _group_mean(x: torch.Tensor, timesteps: int) -> torch.Tensor:
    """The mean of a group's rewards `x` (batch order) as verl-omni takes it: over the [n, T] block of the rows."""
    return x.repeat_interleave(timesteps).mean()


def _std(x: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    """The std of `x` with each element repeated `cfg.timesteps_per_sample` times (verl-omni's [B, T] rows)."""
    x = x.repeat_interleave(cfg.timesteps_per_sample)
    if x.numel() < 2:
        return torch.zeros((), dtype=x.dtype)
    return x.std(correction=1 if cfg.unbiased_std else 0)


def normalize_rewards(rewards: torch.Tensor, uids: Sequence[Hashable], cfg: AdvantageConfig) -> AdvantageResult:
    """Group-normalise `rewards` [B] by `uids` (B hashables; equal uid = same prompt group); see module doc."""
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if len(uids) != r.numel():
        raise ValueError(f"got {len(uids)} uids for {r.numel()} rewards")
    if not bool(torch.isfinite(r).all()):
        raise ValueError(f"rewards must be finite, got {rewards.tolist()}")
    index, num_groups = _group_index(uids)
    r = r.to(REWARD_DTYPE)  # verl-omni's arithmetic (module docstring)
    adv = torch.empty_like(r)
    zero_std = 0
    batch_std = _std(r, cfg)
    for g in range(num_groups):
        rows = (index == g).nonzero(as_tuple=True)[0]
        rg = r[rows]
        zero_std += int(bool((rg == rg[0]).all()))
        centred = rg - _group_mean(rg, cfg.timesteps_per_sample)
        if cfg.norm_adv_by_std:
            std = batch_std if cfg.global_std else _std(rg, cfg)
            centred = centred / (std + cfg.epsilon)
        adv[rows] = centred
    if cfg.adv_clip_max is not None:
        adv = adv.clamp(-cfg.adv_clip_max, cfg.adv_clip_max)
    return AdvantageResult(adv.to(torch.float32), num_groups, zero_std)


def combine_rewards(rewards: Mapping[str, torch.Tensor], weights: Mapping[str, float], uids: Sequence[Hashable],
                    cfg: AdvantageConfig, mode: str = "weighted_sum") -> AdvantageResult:
    """Advantages from several rewards.

    * ``weighted_sum`` (Flow-GRPO, verl-omni): r = Σ w_i·r_i, then normalise r.
    * ``normalize_then_weight`` (GenRL): A = Σ w_i·normalise(r_i), each normalised without clamp, then the
      clamp is applied to the weighted sum. `zero_std_groups` counts groups where every reward is constant.
    """
    if mode not in MULTI_REWARD_MODES:
        raise ConfigError("aggregation", mode, f"valid choices: {list(MULTI_REWARD_MODES)}")
    unknown = sorted(set(weights) - set(rewards))
    if unknown or not weights:
        raise ValueError(f"reward weights name {unknown or 'no reward'}; rewards available: {sorted(rewards)}")
    if mode == "weighted_sum":
        total = sum(float(w) * torch.as_tensor(rewards[n], dtype=torch.float64) for n, w in weights.items())
        return normalize_rewards(total, uids, cfg)
    no_clip = replace(cfg, adv_clip_max=None)
    parts = {n: normalize_rewards(rewards[n], uids, no_clip) for n in weights}
    adv = sum(float(w) * parts[n].advantages.to(torch.float64) for n, w in weights.items())
    if cfg.adv_clip_max is not None:
        adv = adv.clamp(-cfg.adv_clip_max, cfg.adv_clip_max)
    index, num_groups = _group_index(uids)
    zero = 0
    for g in range(num_groups):
        rows = index == g
        zero += int(all(bool((torch.as_tensor(rewards[n])[rows] == torch.as_tensor(rewards[n])[rows][0]).all())
                        for n in weights))
    return AdvantageResult(adv.to(torch.float32), num_groups, zero)


# ------------------------------------------------------------------ the global std without the step barrier
# With group-centred rewards a_i = r_i − mean_{group(i)} r and s = σ + ε (σ the step's std, `_std`), the advantage is
# A_i = clamp(a_i / s, −c, c). The clipped surrogate max(−A·ρ, −A·clip(ρ)) (and the decoupled one, −A·w·ρ) is
# positively homogeneous in A, so for a sample the clamp does not touch, its gradient with A_i is (1/s) times its
# gradient with a_i: a trainer may accumulate a_i as soon as the sample's group is scored and multiply the step's
# accumulated gradient by 1/s at the optimizer step, once the last reward is in (before the gradient clip). A sample
# the clamp touches is trained, once σ is known, with clamp(a_i/s)·s, which the same 1/s turns into its A_i.
# Which samples are safe early: the step's sum of squares about its mean is at least that of the rewards seen so far
# about their own mean (SS_seen), and N (the step's sample count) is known, so σ >= sqrt(T·SS_seen / (N·T − δ))
# (δ = 1 with Bessel's correction; `std_lower_bound`), and |a_i| <= c·(bound + ε) means "certainly not clamped".
# The KL term does not scale with 1/s: the deferred path needs kl_coef = 0 (the config layer decides). A loss that
# clamps the advantages it is given (verl-omni's, at c) would cut these values (up to c·s): they go in divided by a
# power of two κ with the loss times κ (`unclamped_divisor`; verl-omni's actor worker, `integrations.verl_omni_worker`).


def centred_rewards(rewards: Mapping[int, float], uids: Sequence[Hashable], timesteps_per_sample: int = 1) \
        -> dict[int, float]:
    """a_i = r_i − the mean of the finite rewards of i's prompt group (`uids[i]`), for every finite reward given
    (sample id -> reward), in `normalize_rewards`' arithmetic (verl-omni's: float32, the group in sample-id order,
    its mean over [n, T]); a group with one finite reward gets 0 (as `normalize_rewards`)."""
    groups: dict[Hashable, list[int]] = {}
    for i in sorted(rewards):
        if math.isfinite(rewards[i]):
            groups.setdefault(uids[i], []).append(i)
    out: dict[int, float] = {}
    for members in groups.values():
        r = torch.tensor([rewards[i] for i in members], dtype=torch.float64).to(REWARD_DTYPE)
        out.update({i: float(a) for i, a in zip(members, r - _group_mean(r, timesteps_per_sample))})
    return out


def std_lower_bound(rewards: Sequence[float], step_samples: int, cfg: AdvantageConfig) -> float:
    """A lower bound of the std `_std` will give over the whole step's finite rewards (at most `step_samples`), from
    the finite `rewards` seen so far (see the section's comment)."""
    r = torch.tensor([x for x in rewards if math.isfinite(x)], dtype=torch.float64)
    elements = step_samples * cfg.timesteps_per_sample - (1 if cfg.unbiased_std else 0)
    if r.numel() < 2 or elements <= 0:
        return 0.0
    ss = float(((r - r.mean()) ** 2).sum()) * cfg.timesteps_per_sample
    return math.sqrt(ss / elements)


def certainly_unclamped(a: float, bound: float, cfg: AdvantageConfig) -> bool:
    """True when the clamp cannot touch a_i whatever the step's other rewards: |a_i| <= c·(bound + ε)."""
    return cfg.adv_clip_max is None or abs(a) <= cfg.adv_clip_max * (bound + cfg.epsilon)


def step_scale(rewards: Sequence[float], cfg: AdvantageConfig) -> float:
    """s = σ + ε of the whole step's finite rewards: the accumulated policy gradient is multiplied by 1/s."""
    finite = torch.tensor([x for x in rewards if math.isfinite(x)], dtype=torch.float64)
    return float(_std(finite, cfg)) + cfg.epsilon


def gradient_scale(scale: float) -> float:
    """1/s; 0 when s = 0 (ε = 0 and equal rewards: every a_i is 0, and the barrier's 0/0 advantages are 0 too)."""
    return 1.0 / scale if scale > 0 else 0.0


def late_advantage(a: float, scale: float, cfg: AdvantageConfig) -> float:
    """The value to train a sample with once s is known: a_i where the clamp does not touch a_i/s, else
    ±c·s (which the step's 1/s turns into the clamped A_i)."""
    c = cfg.adv_clip_max
    if c is None or scale <= 0 or abs(a / scale) <= c:
        return a
    return math.copysign(c, a) * scale


def unclamped_divisor(values: torch.Tensor, clip: float | None) -> float:
    """For a loss that clamps the advantages it is given at ±`clip` (verl-omni's, `adv_clip_max`) trained with
    values already clamped in another unit (the deferred std's a_i, or clamp(a_i/s)·s: up to c·s): the smallest
    power of two κ >= 1 with every |v|/κ <= c in the values' own dtype. Train with v/κ and the loss times κ: the
    clamp leaves v/κ alone and, κ being a power of two, v/κ·κ is v bit for bit (binary floating point), so the
    gradient is the one of v. κ = 1 (nothing changes) for values within ±c (the barrier's A_i) or no clamp."""
    if clip is None or values.numel() == 0:
        return 1.0
    top, bound = values.detach().abs().max(), torch.tensor(clip, dtype=values.dtype)
    if not bool(torch.isfinite(top)):
        raise ValueError(f"advantages must be finite, got max |v| = {float(top)}")
    kappa = 1.0
    while bool(top / kappa > bound):
        kappa *= 2.0
    return kappa


def deferred_supported(cfg: AdvantageConfig) -> bool:
    """The deferred scaling applies to the global std with the division (the Flow-GRPO / DanceGRPO default)."""
    return cfg.global_std and cfg.norm_adv_by_std


def needs_whole_step(cfg: AdvantageConfig) -> bool:
    """An advantage needs every reward of the step (the global std divides it, and it is not deferred)."""
    return deferred_supported(cfg) and not cfg.deferred_std
