"""TCSS (trajectory-consistent stale synchronization): how far generation may run ahead.

Pure bookkeeping, no clocks. The driver asks before every GEN / TAG_GEN whether a micro-batch of step
``s`` may be generated now with policy version ``v``. The invariants this enforces:

1. *one version per trajectory*: a generation task uses the weights its workers hold for its whole
   duration (weights change only through SYNC, which needs those workers idle), and it is tagged with
   that version;
2. *bounded staleness*: ``v <= s`` and ``s - v <= W``;
3. *bounded run-ahead*: ``s <= last_completed_update + 1 + W``, where ``last_completed_update`` is the
   last step whose OPT_STEP finished (``start_step - 1`` before the first);
4. *bounded stale share*: the samples of step s generated with ``v < s`` are at most
   ``floor(max_stale_fraction * samples_per_step)``;
5. at most ``max_gen_futures`` generation tasks in flight.

With ``W = 0`` (2 and 3 force ``v == s`` and ``s <= last + 1``) the schedule is the synchronous one:
generation of step s+1 waits for the SYNC that delivers version s+1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from digenrl_verl.schedule.config import TcssConfig


@dataclass(frozen=True)
class GenRequest:
    """A proposed generation task, with the counters the policy needs."""

    step: int
    version: int
    samples: int
    last_completed_update: int
    stale_samples: int
    samples_per_step: int
    futures_in_flight: int


@dataclass(frozen=True)
class StalenessPolicy:
    """The TCSS limits of a `TcssConfig`: the window W, the stale fraction, the GEN futures in flight."""

    window: int = 0
    max_stale_fraction: float = 0.0
    max_gen_futures: int | None = None

    @classmethod
    def of(cls, config: TcssConfig) -> "StalenessPolicy":
        return cls(config.staleness, config.max_stale_fraction, config.max_gen_futures)

    def stale_capacity(self, samples_per_step: int) -> int:
        """How many samples of one step may be generated stale."""
        if self.window == 0:
            return 0
        return math.floor(self.max_stale_fraction * samples_per_step + 1e-9)

    def max_step(self, last_completed_update: int) -> int:
        """The furthest step generation may work on."""
        return last_completed_update + 1 + self.window

    def check(self, req: GenRequest) -> str | None:
        """None if the request is allowed, else the reason it is not."""
        if self.max_gen_futures is not None and req.futures_in_flight >= self.max_gen_futures:
            return f"max_gen_futures={self.max_gen_futures} in flight"
        if req.step > self.max_step(req.last_completed_update):
            return f"step {req.step} is more than W={self.window} ahead of update {req.last_completed_update}"
        if req.version > req.step:
            return f"version {req.version} is newer than step {req.step}"
        if req.step - req.version > self.window:
            return f"version {req.version} is more than W={self.window} behind step {req.step}"
        if req.version < req.step:
            cap = self.stale_capacity(req.samples_per_step)
            if req.stale_samples + req.samples > cap:
                return f"stale samples {req.stale_samples}+{req.samples} > {cap}"
        return None
