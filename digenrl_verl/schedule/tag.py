"""TAG policies: at a trainer bubble, should the trainer generate one pending micro-batch?

A *bubble* is the driver's name for "the trainer is idle, nothing of its step is ready to update, and
micro-batches of that step are still pending". The driver builds a `BubbleContext` and asks the policy.

* `NoTag`: never (ablation baseline).
* `StaticTag(k)`: TAG at the first k bubbles of each step.
* `BtsTag`: the paper's bubble-aware TAG search (`schedule.bts`), re-solved at every bubble with the
  current cost estimates. Its first bubble with an unknown trainer-side generation cost runs one TAG
  micro-batch to measure it (``probe``), as the paper's profiler does. Until the other costs are
  measured it decides on a cold-start prior (see `BtsTag`).

To add a policy: subclass `TagPolicy`, implement ``decide``, and register it in `make_tag_policy`.
"""

from __future__ import annotations

import abc
import gc
import time
from dataclasses import dataclass, field

from digenrl_verl.schedule.bts import BtsCosts, BtsResult, BtsSolver, BtsState, GenPhase
from digenrl_verl.schedule.config import TagConfig


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
        prior: only while ``costs`` is None: the same costs with every missing estimate replaced by the
            smallest value the run has not yet ruled out (an unmeasured UPDATE or SCORE costs >= 0; an
            unfinished first GEN costs >= the time it has been running). None when even that is unknown
            (no trainer-side generation measured, or no GEN finished or running).
        tag_floor: the trainer-side generation cost is a lower bound seeded before any TAG was measured
            (`CostProfiler.seed_floor`: TAG on verl-omni's hybrid engine costs at least its engine switch), not a
            measurement.
    """

    now: float
    step: int
    pending: int
    tags_this_step: int
    state: BtsState
    costs: BtsCosts | None
    tag_cost_known: bool
    prior: BtsCosts | None = None
    tag_floor: bool = False


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
    """Bubble-aware TAG search; keeps solve statistics for the driver's report.

    **Cold start.** Costs are learnt online, so the first bubbles of a run come before some of them are
    measured: the probe TAG measures g' at the first bubble, but the first UPDATE cannot finish before a
    micro-batch is generated, scored and updated, and the first GEN may still be running. Skipping every
    such bubble ("no estimate yet") leaves the trainer idle exactly when the whole step is still ahead
    of it. With ``cold_start=True`` (default) BTS decides these bubbles on ``ctx.prior`` instead: the
    measured costs, and for each unmeasured one the smallest value the run has not ruled out (UPDATE and
    SCORE >= 0, GEN >= the elapsed time of the GEN still running). This uses only what the run has
    observed (no profile, no oracle), and its errors point one way:

    * a larger true g only makes TAG more useful, so the GEN bound never makes a useless TAG look useful;
    * t = 0 ignores the update chain, so the search then answers "does a TAG now shorten the generation
      of the step?" and skips when it does not (e.g. the last pending micro-batch, which the generator
      finishes before a TAG would). With free updates "TAG now" and "TAG at a later bubble" often tie;
      a tie is decided for TAG, because the trainer is idle now and the next bubble may come only after
      the updates the tie ignores;
    * the cost of being wrong is bounded: once the first UPDATE is measured (one or two bubbles into the
      run) the exact search takes over, and a TAG chosen too early delays the first UPDATE by at most g'.

    ``cold_start=False`` restores the plain behaviour (skip until every estimate exists).

    **g' and the hybrid engine.** g' is whatever the profiler measured for TAG tasks (`schedule.cost`: the executor's
    task duration), so on verl-omni's hybrid engine, where a TAG task wakes the trainer ranks' rollout replicas, syncs
    the actor's weights into them, generates and puts them back to sleep, the switch is part of g' and BTS weighs it
    at every bubble: a switch the bubbles cannot repay makes it skip. Before any TAG ran, g' may be a floor
    (``ctx.tag_floor``: the switch alone, timed at start-up) instead of the probe; ties on a floor are decided for skip,
    not TAG: the tie rule above relies on a TAG's cost being bounded by a measured g', which a floor is not (it leaves
    the generation out).
    """

    probe: bool = TagConfig.probe
    max_states: int = TagConfig.bts_max_states
    cold_start: bool = True
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
        costs, prior = ctx.costs, False
        if costs is None:
            if not self.cold_start or ctx.prior is None:
                return TagDecision(False, "no estimate yet")
            costs, prior = ctx.prior, True
        result = self._solve(costs, ctx.state, tie_tag=prior and not ctx.tag_floor)
        tag_ms = "-" if result.tag_makespan is None else f"{result.tag_makespan:.3f}"
        g_tag = f"g'>={costs.tag:.4g}" if ctx.tag_floor else f"g'={costs.tag:.4g}"
        head = (f"prior(g={costs.gen:.4g} sc={costs.score:.4g} t={costs.update:.4g} {g_tag}) " if prior
                else (f"floor({g_tag}) " if ctx.tag_floor else ""))
        reason = (head + f"bts tag={tag_ms} skip={result.skip_makespan:.3f} "
                  f"states={result.states}" + (" budget_hit" if result.budget_hit else ""))
        return TagDecision(result.tag_now, reason, result=result)

    def _solve(self, costs: BtsCosts, state: BtsState, tie_tag: bool) -> BtsResult:
        key = tuple(f"{x:.9g}" for x in (costs.gen, costs.score, costs.update, costs.tag))
        if self._solver is None or self._solver_key != key:  # same costs: keep the memo of earlier solves
            self._solver, self._solver_key = BtsSolver(costs, max_states=self.max_states), key
        solver = self._solver
        start = time.perf_counter()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # the search allocates many small tuples; a full collection mid-search costs more than it frees
        try:
            result = solver.solve(state, tie_tag=tie_tag)
        finally:
            if gc_was_enabled:
                gc.enable()
        self.solve_seconds.append(time.perf_counter() - start)
        self.budget_hits += int(result.budget_hit)
        return result


def make_tag_policy(config: TagConfig) -> TagPolicy:
    """The policy a `TagConfig` names (the config validated the name)."""
    if config.policy == "static":
        return StaticTag(config.static_k)
    if config.policy == "bts":
        return BtsTag(probe=config.probe, max_states=config.bts_max_states)
    return NoTag()


__all__ = ["BubbleContext", "TagDecision", "TagPolicy", "NoTag", "StaticTag", "BtsTag", "make_tag_policy",
           "GenPhase"]
