"""Which denoising steps use the SDE, and which of them are trained, per sample.

| mode (`timestep_selection`) | SDE steps | trained steps, K of them | order |
|---|---|---|---|
| `flow_grpo` | all N | the first ⌊N·f⌋ (f = `timestep_fraction`) | in order |
| `dance_grpo` | all N | the first ⌊(N−1)·f⌋ of a random permutation of 0..N−2 | permuted, per sample |
| `window` | [start, start+W), start ~ U{r0 … r1−W} per sample | the W window steps | in order |

Window mode follows verl-omni `sde_window_size` W and `sde_window_range` [r0, r1] (default [0, N//2]);
steps outside the window run the ODE. W = 0 means SDE on every step but the last, all of them trained.
Random choices come from the sample's ``select`` generator (see `noise.py`), so they are reproducible.
K is the same for every sample, so trajectories stack to [B, K, ...].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from digenrl_verl.errors import ConfigError


SELECTION_MODES = ("flow_grpo", "dance_grpo", "window")


@dataclass(frozen=True)
class SelectionConfig:
    """Timestep selection; validated on construction (a `ConfigError` naming the field: `timestep_selection`,
    `num_inference_steps`, `timestep_fraction`, `sde_window_size`, `sde_window_range`).

    Args:
        mode: one of SELECTION_MODES.
        num_inference_steps: N, the length of the sampling schedule.
        timestep_fraction: f ∈ (0, 1] for `flow_grpo` / `dance_grpo`.
        sde_window_size: W ≥ 0 for `window` (0: SDE on all steps but the last).
        sde_window_range: [r0, r1] with 0 ≤ r0 < r1 ≤ N and W ≤ r1 − r0; None means [0, N//2].
    """

    mode: str = "flow_grpo"
    num_inference_steps: int = 10
    timestep_fraction: float = 0.99
    sde_window_size: int = 0
    sde_window_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        n = self.num_inference_steps
        if self.mode not in SELECTION_MODES:
            raise ConfigError("timestep_selection", self.mode, f"valid choices: {list(SELECTION_MODES)}")
        if not isinstance(n, int) or n < 1:
            raise ConfigError("num_inference_steps", n, "use an int >= 1")
        if self.mode in ("flow_grpo", "dance_grpo"):
            f = self.timestep_fraction
            if not 0 < f <= 1:
                raise ConfigError("timestep_fraction", f, "outside the valid range (0, 1]")
            if self.num_train_steps < 1:
                raise ConfigError("timestep_fraction", f, f"with {{num_inference_steps}}={n} it trains no step in "
                                  f"mode {self.mode!r}; raise the fraction or the number of steps")
            return
        w = self.sde_window_size
        if not isinstance(w, int) or w < 0:
            raise ConfigError("sde_window_size", w, "use an int >= 0")
        if w > n:
            raise ConfigError("sde_window_size", w, f"larger than {{num_inference_steps}}={n}; valid range: 0..{n}")
        if w == 0:
            if n < 2:
                raise ConfigError("sde_window_size", w, "0 trains all steps but the last, none when "
                                  "{num_inference_steps}=1")
            return
        r0, r1 = self.window_range
        if not (0 <= r0 < r1 <= n):
            raise ConfigError("sde_window_range", [r0, r1], f"must satisfy 0 <= r0 < r1 <= {{num_inference_steps}}={n}")
        if w > r1 - r0:
            raise ConfigError("sde_window_size", w, f"does not fit in {{sde_window_range}}=[{r0}, {r1}] (at most "
                              f"{r1 - r0}); shrink the window or widen the range")

    @property
    def window_range(self) -> tuple[int, int]:
        if self.sde_window_range is None:
            return 0, self.num_inference_steps // 2
        if len(self.sde_window_range) != 2:
            raise ConfigError("sde_window_range", self.sde_window_range, "give two ints [r0, r1]")
        return int(self.sde_window_range[0]), int(self.sde_window_range[1])

    @property
    def num_train_steps(self) -> int:
        """K, the number of trained steps per sample."""
        n = self.num_inference_steps
        if self.mode == "flow_grpo":
            return math.floor(n * self.timestep_fraction + 1e-9)
        if self.mode == "dance_grpo":
            return math.floor((n - 1) * self.timestep_fraction + 1e-9)
        return self.sde_window_size if self.sde_window_size > 0 else n - 1


def auto_selection(algorithm: str, sde_window_size: int | None) -> str:
    """The mode for `timestep_selection: null`: `window` when a window size is set, else the algorithm's rule
    (`dance_grpo` for model.algorithm=dance_grpo, `flow_grpo` otherwise)."""
    if sde_window_size is not None:
        return "window"
    return "dance_grpo" if algorithm == "dance_grpo" else "flow_grpo"


@dataclass(frozen=True)
class StepPlan:
    """Per-sample plan of a rollout.

    Attributes:
        sde_mask: bool [B, N]; step i of sample b uses the SDE kind (else the ODE).
        train_steps: int64 [B, K]; the trained step indices of each sample, in training order. Every trained
            step is an SDE step.
    """

    sde_mask: torch.Tensor
    train_steps: torch.Tensor


def plan_steps(cfg: SelectionConfig, generators: Sequence[torch.Generator]) -> StepPlan:
    """The plan of each sample, drawing its random choices from its own `select` generator."""
    n, k, b = cfg.num_inference_steps, cfg.num_train_steps, len(generators)
    sde_mask = torch.ones(b, n, dtype=torch.bool)
    if cfg.mode == "flow_grpo":
        train = torch.arange(k).expand(b, k).clone()
    elif cfg.mode == "dance_grpo":
        train = torch.stack([torch.randperm(n - 1, generator=g)[:k] for g in generators]) if b else \
            torch.empty(0, k, dtype=torch.long)
    elif cfg.sde_window_size == 0:
        sde_mask[:, -1] = False
        train = torch.arange(n - 1).expand(b, n - 1).clone()
    else:
        r0, r1 = cfg.window_range
        starts = [r0 + int(torch.randint(0, r1 - k - r0 + 1, (1,), generator=g)) for g in generators]
        train = torch.stack([torch.arange(s, s + k) for s in starts]) if b else torch.empty(0, k, dtype=torch.long)
        sde_mask = torch.zeros(b, n, dtype=torch.bool)
        sde_mask.scatter_(1, train, True)
    return StepPlan(sde_mask=sde_mask, train_steps=train.to(torch.long))


def ode_plan(num_inference_steps: int, batch_size: int) -> StepPlan:
    """Pure ODE sampling (validation, `sde_type='ode'`): no SDE step, nothing trained."""
    return StepPlan(torch.zeros(batch_size, num_inference_steps, dtype=torch.bool),
                    torch.empty(batch_size, 0, dtype=torch.long))
