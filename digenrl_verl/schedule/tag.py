"""TAG policies: at a trainer bubble, should the trainer generate one pending micro-batch?

A *bubble* is the driver's name for "the trainer is idle, nothing of its step is ready to update, and
micro-batches of that step are still pending". The driver builds a `BubbleContext` and asks the policy.

* `NoTag`: never (ablation baseline).
* `StaticTag(k)`: TAG at the first k bubbles of each step.
* `BtsTag`: the paper's bubble-aware TAG search (`schedule.bts`), re-solved at every bubble with the
  current cost estimates. Its first bubble with an unknown trainer-side generation cost runs one TAG
  micro-batch to measure it (``probe``), as the paper's profiler does.

To add a policy: subclass `TagPolicy`, implement ``decide``, and register it in `make_tag_policy`.
"""

from __future__ import annotations

import abc
import gc
import time
from dataclasses import dataclass, field

from digenrl_verl.schedule.bts import BtsCosts, BtsResult, BtsSolver, BtsState, GenPhase


@dataclass(frozen=True)
class BubbleContext:
    """What a TAG policy sees at a bubble.

    Attributes:
        now: executor clock.
        step: the step the trainer is updating.
        pending: micro-batches of that step not started anywhere (TAG candidates).
        tags_this_step: TAG micro-batches already issued for that step.
        state: the compressed BTS state (aggregated generator pool, see `schedule.bts`).
        costs: model costs from the profiler, or None while an estimate is missing.
        tag_cost_known: whether trainer-side generation has been measured.
    """

    now: float
    step: int
    pending: int
    tags_this_step: int
    state: BtsState
    costs: BtsCosts | None
    tag_cost_known: bool


@dataclass(frozen=True)
class TagDecision:
    tag: bool
    reason: str
    probe: bool = False
    result: BtsResult | None = None


class TagPolicy(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def decide(self, ctx: BubbleContext) -> TagDecision:
        """Insert one TAG micro-batch now?"""


class NoTag(TagPolicy):
    name = "off"

    def decide(self, ctx: BubbleContext) -> TagDecision:
        return TagDecision(False, "tag=off")


@dataclass
class StaticTag(TagPolicy):
    """TAG at the first ``k`` bubbles of every step."""

    k: int
    name = "static"

    def decide(self, ctx: BubbleContext) -> TagDecision:
        if ctx.tags_this_step < self.k:
            return TagDecision(True, f"static {ctx.tags_this_step + 1}/{self.k}")
        return TagDecision(False, f"static quota {self.k} used")


@dataclass
class BtsTag(TagPolicy):
    """Bubble-aware TAG search; keeps solve statistics for the driver's report."""

    probe: bool = True
    max_states: int = 2_000
    solve_seconds: list[float] = field(default_factory=list)
    budget_hits: int = 0
    _solver: BtsSolver | None = field(default=None, repr=False)
    _solver_key: tuple[str, ...] = field(default=(), repr=False)
    name = "bts"

    def decide(self, ctx: BubbleContext) -> TagDecision:
        if not ctx.tag_cost_known:
            if self.probe:
                return TagDecision(True, "probe: measure trainer-side generation", probe=True)
            return TagDecision(False, "no TAG estimate")
        if ctx.costs is None:
            return TagDecision(False, "no estimate yet")
        key = tuple(f"{x:.9g}" for x in (ctx.costs.gen, ctx.costs.score, ctx.costs.update, ctx.costs.tag))
        if self._solver is None or self._solver_key != key:  # same costs: keep the memo of earlier solves
            self._solver, self._solver_key = BtsSolver(ctx.costs, max_states=self.max_states), key
        solver = self._solver
        start = time.perf_counter()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # the search allocates many small tuples; a full collection mid-search costs more than it frees
        try:
            result = solver.solve(ctx.state)
        finally:
            if gc_was_enabled:
                gc.enable()
        self.solve_seconds.append(time.perf_counter() - start)
        self.budget_hits += int(result.budget_hit)
        tag_ms = "-" if result.tag_makespan is None else f"{result.tag_makespan:.3f}"
        reason = (f"bts tag={tag_ms} skip={result.skip_makespan:.3f} states={result.states}"
                  + (" budget_hit" if result.budget_hit else ""))
        return TagDecision(result.tag_now, reason, result=result)


TAG_POLICIES = ("off", "static", "bts")


def make_tag_policy(tag: str, static_k: int = 0, probe: bool = True, max_states: int = 2_000) -> TagPolicy:
    """Build the policy named by ``trainer.digenrl.tag``."""
    if tag == "off":
        return NoTag()
    if tag == "static":
        return StaticTag(static_k)
    if tag == "bts":
        return BtsTag(probe=probe, max_states=max_states)
    raise ValueError(f"trainer.digenrl.tag={tag!r} is invalid: use one of {list(TAG_POLICIES)}")


__all__ = ["BubbleContext", "TagDecision", "TagPolicy", "NoTag", "StaticTag", "BtsTag", "make_tag_policy",
           "GenPhase"]
