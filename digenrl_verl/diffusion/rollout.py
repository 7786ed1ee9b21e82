"""Sample a batch of trajectories through a DiffusionAdapter, recording only the steps that will be trained.

This is the one sampling routine: the generator worker calls it, and so does trainer-assisted generation
(TAG), so a sample generated on either pool is the same trajectory (see `noise.py` for what "same" means).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Sequence

import torch

from digenrl_verl.diffusion.noise import SampleKey, make_sample_generators
from digenrl_verl.diffusion.sde import get_sde_kind, sde_step
from digenrl_verl.diffusion.selection import SelectionConfig, StepPlan, ode_plan, plan_steps
from digenrl_verl.errors import ConfigError
from digenrl_verl.models.base import Conditioning, DiffusionAdapter



@dataclass(frozen=True)
class RolloutConfig:
    """How trajectories are sampled (validated on construction).

    Args:
        num_inference_steps: N, steps of the sampling schedule (`adapter.sigmas(N)`).
        sde_type: step kind of the SDE steps: `sde`, `cps`, `dance` (alias `dance_sde`) or `ode` (pure ODE
            sampling, e.g. validation: nothing is recorded or trained).
        noise_level: Flow-GRPO / CPS noise level a, or DanceGRPO η.
        timestep_selection: `flow_grpo`, `dance_grpo` or `window` (see `selection.py`).
        timestep_fraction: f for `flow_grpo` / `dance_grpo`.
        sde_window_size, sde_window_range: the window for `window` mode.
        seed: base seed all per-sample seeds derive from.
        init_same_noise: one initial noise per prompt group (keyed on (step, uid)).
        rows_alone: an engine draws each sample in a batch of its own (prompt encoding, every transformer forward,
            the decode), so its trajectory and decoded sample do not depend on its neighbours: bit-identical
            whichever worker draws it (generator, TAG, colocated) in the same dtype on the same kind of device.
            Batched forwards (False) may round a row differently with other rows next to it (`noise.py`).
            `trainer.digenrl.rows_alone`; read by the diffusers engine (`engines.diffusers`), not by `rollout`.
    """

    num_inference_steps: int = 10
    sde_type: str = "sde"
    noise_level: float = 0.7
    timestep_selection: str = "flow_grpo"
    timestep_fraction: float = 0.99
    sde_window_size: int = 0
    sde_window_range: tuple[int, int] | None = None
    seed: int = 0
    init_same_noise: bool = False
    rows_alone: bool = False

    def __post_init__(self) -> None:
        kind = get_sde_kind(self.sde_type)  # ValueError naming the key and the choices
        if not isinstance(self.seed, int):
            raise ConfigError("seed", self.seed, "use an int")
        if kind.trainable:
            if not self.noise_level > 0:
                raise ConfigError("noise_level", self.noise_level, f"must be > 0 for {{sde_type}}={self.sde_type!r} "
                                  "(use sde_type='ode' for deterministic sampling)")
            _ = self.selection  # validates the selection keys
        elif not isinstance(self.num_inference_steps, int) or self.num_inference_steps < 1:
            raise ConfigError("num_inference_steps", self.num_inference_steps, "use an int >= 1")

    @property
    def selection(self) -> SelectionConfig:
        return SelectionConfig(self.timestep_selection, self.num_inference_steps, self.timestep_fraction,
                               self.sde_window_size, self.sde_window_range)

    @property
    def num_train_steps(self) -> int:
        """K: trained steps per sample (0 for `ode`)."""
        return self.selection.num_train_steps if get_sde_kind(self.sde_type).trainable else 0


@dataclass
class Trajectory:
    """A batch of sampled trajectories, restricted to the K trained steps of each sample.

    Row b, column k is the k-th trained step of sample b (training order; see `selection.py`).

    Attributes:
        latents: fp32 [B, K, *latent] — x at σ, the input of the trained step.
        next_latents: fp32 [B, K, *latent] — x' at σ', the sample the step drew.
        sigmas: fp32 [B, K] — σ of the step.
        next_sigmas: fp32 [B, K] — σ' of the step (σ' < σ).
        log_probs: fp32 [B, K] — log-prob of next_latents under the sampling policy (the rollout log-probs).
        step_index: int64 [B, K] — index i of the step in the schedule (σ = sigmas_schedule[i]).
        final_latents: fp32 [B, *latent] — the clean latents at σ = 0 (decode them for the reward).
        sde_type: the step kind that produced the trained steps.
        noise_level: its noise level / η.
    """

    latents: torch.Tensor
    next_latents: torch.Tensor
    sigmas: torch.Tensor
    next_sigmas: torch.Tensor
    log_probs: torch.Tensor
    step_index: torch.Tensor
    final_latents: torch.Tensor
    sde_type: str
    noise_level: float

    TENSOR_KEYS = ("latents", "next_latents", "sigmas", "next_sigmas", "log_probs", "step_index", "final_latents")

    @property
    def batch_size(self) -> int:
        return self.latents.shape[0]

    @property
    def num_steps(self) -> int:
        """K, trained steps per sample."""
        return self.latents.shape[1]

    def index_select(self, index: torch.Tensor | Sequence[int]) -> "Trajectory":
        """The samples `index` (a micro-batch)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        return replace(self, **{k: getattr(self, k).index_select(0, idx.to(getattr(self, k).device))
                                for k in self.TENSOR_KEYS})

    def to(self, device: torch.device | str) -> "Trajectory":
        return replace(self, **{k: getattr(self, k).to(device) for k in self.TENSOR_KEYS})

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor fields by name (for a DataProto batch); metadata: `sde_type`, `noise_level`."""
        return {k: getattr(self, k) for k in self.TENSOR_KEYS}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], sde_type: str, noise_level: float) -> "Trajectory":
        missing = [k for k in cls.TENSOR_KEYS if k not in tensors]
        if missing:
            raise KeyError(f"trajectory tensors missing {missing}; have {sorted(tensors)}")
        return cls(**{k: tensors[k] for k in cls.TENSOR_KEYS}, sde_type=sde_type, noise_level=float(noise_level))

    @staticmethod
    def cat(parts: Sequence["Trajectory"]) -> "Trajectory":
        if not parts:
            raise ValueError("Trajectory.cat needs at least one part")
        meta = {(p.sde_type, p.noise_level) for p in parts}
        if len(meta) != 1:
            raise ValueError(f"cannot concatenate trajectories of different step kinds: {meta}")
        return replace(parts[0], **{k: torch.cat([getattr(p, k) for p in parts]) for k in Trajectory.TENSOR_KEYS})


assert {f.name for f in fields(Trajectory)} == {*Trajectory.TENSOR_KEYS, "sde_type", "noise_level"}


def _device_of(adapter: DiffusionAdapter, cond: Conditioning) -> torch.device:
    for p in adapter.transformer.parameters():
        return p.device
    for t in cond.tensors.values():
        return t.device
    return torch.device("cpu")


def make_plan(cfg: RolloutConfig, keys: Sequence[SampleKey]) -> StepPlan:
    """The step plan `rollout` uses for `keys` (deterministic in (cfg.seed, key))."""
    if not get_sde_kind(cfg.sde_type).trainable:
        return ode_plan(cfg.num_inference_steps, len(keys))
    gens = make_sample_generators(cfg.seed, keys, init_same_noise=cfg.init_same_noise)
    return plan_steps(cfg.selection, gens.select)


@dataclass
class RolloutDraws:
    """Every random draw `rollout(adapter, cond, keys, cfg)` makes, materialised (CPU, fp32).

    Attributes:
        init: [B, *latent] — the initial noise x at σ=1 (each row from its `init` stream).
        sde_noise: [N, B, *latent] — the standard-normal z of step i of row b (x' = μ + s·z), drawn from the row's
            `sde` stream in step order; 0 where row b runs the ODE at step i (`plan.sde_mask[b, i]` False).
        plan: the rows' step plan (`make_plan`).
    """

    init: torch.Tensor
    sde_noise: torch.Tensor
    plan: StepPlan


def rollout_draws(adapter: DiffusionAdapter, cfg: RolloutConfig, keys: Sequence[SampleKey]) -> RolloutDraws:
    """The draws `rollout` makes for `keys` under `cfg`, rebuilt from the same per-sample streams (`noise.py`).

    Feeding them to another sampler (e.g. verl-omni's rollout adapters: initial latents, per-step noise, window
    starts) reproduces `rollout`'s trajectories there. `rollout` itself stays lazy: this holds N·B latents, which
    is meant for tests and comparisons, not for large video batches.
    """
    n, b = cfg.num_inference_steps, len(keys)
    gens = make_sample_generators(cfg.seed, keys, init_same_noise=cfg.init_same_noise)
    plan = make_plan(cfg, keys)
    init = adapter.initial_noise(gens.init).to(torch.float32)
    shape = tuple(init.shape[1:])
    sde_noise = torch.zeros(n, b, *shape, dtype=torch.float32)
    for i in range(n):  # step order within each row's stream; rows' streams are independent
        for r in plan.sde_mask[:, i].nonzero(as_tuple=True)[0].tolist():
            g = gens.sde[r]
            sde_noise[i, r] = torch.randn(shape, generator=g, device=g.device, dtype=torch.float32).cpu()
    return RolloutDraws(init=init, sde_noise=sde_noise, plan=plan)


@torch.no_grad()
def rollout(adapter: DiffusionAdapter, cond: Conditioning, keys: Sequence[SampleKey], cfg: RolloutConfig) -> Trajectory:
    """Sample one trajectory per row of `cond` and record its trained steps.

    Args:
        adapter: the policy (its current weights are the sampling policy).
        cond: conditioning with batch size B (one row per sample; repeat a prompt for its group).
        keys: B sample keys; each sample's noise and selection depend only on (cfg.seed, its key).
        cfg: the rollout config.
    Returns:
        a Trajectory with K = cfg.num_train_steps recorded steps per sample.
    """
    b = cond.batch_size
    if len(keys) != b:
        raise ValueError(f"got {len(keys)} sample keys for a conditioning batch of {b}")
    n, k = cfg.num_inference_steps, cfg.num_train_steps
    device = _device_of(adapter, cond)
    gens = make_sample_generators(cfg.seed, keys, init_same_noise=cfg.init_same_noise)
    plan = make_plan(cfg, keys)
    schedule = adapter.sigmas(n).to(device=device, dtype=torch.float32)
    if schedule.shape != (n + 1,):
        raise ValueError(f"adapter.sigmas({n}) returned shape {tuple(schedule.shape)}, expected ({n + 1},)")

    x = adapter.initial_noise(gens.init).to(device=device, dtype=torch.float32)
    shape = tuple(x.shape[1:])
    latents = torch.zeros(b, k, *shape, device=device)
    next_latents = torch.zeros_like(latents)
    log_probs = torch.zeros(b, k, device=device)
    train_steps = plan.train_steps.to(device)
    sde_mask = plan.sde_mask.to(device)
    for i in range(n):
        sigma = schedule[i].expand(b)
        sigma_next = schedule[i + 1].expand(b)
        v = adapter.velocity(x, sigma, cond).to(torch.float32)
        x_next = sde_step("ode", v, x, sigma, sigma_next, 0.0).prev_sample
        lp = torch.full((b,), float("nan"), device=device)
        rows = sde_mask[:, i].nonzero(as_tuple=True)[0]
        if rows.numel():
            out = sde_step(cfg.sde_type, v[rows], x[rows], sigma[rows], sigma_next[rows], cfg.noise_level,
                           generators=[gens.sde[int(r)] for r in rows])
            x_next[rows] = out.prev_sample
            if out.log_prob is not None:
                lp[rows] = out.log_prob
        rec_b, rec_k = (train_steps == i).nonzero(as_tuple=True)
        if rec_b.numel():
            latents[rec_b, rec_k] = x[rec_b]
            next_latents[rec_b, rec_k] = x_next[rec_b]
            log_probs[rec_b, rec_k] = lp[rec_b]
        x = x_next

    return Trajectory(
        latents=latents,
        next_latents=next_latents,
        sigmas=schedule[train_steps],
        next_sigmas=schedule[train_steps + 1],
        log_probs=log_probs,
        step_index=train_steps,
        final_latents=x,
        sde_type=cfg.sde_type,
        noise_level=float(cfg.noise_level),
    )
