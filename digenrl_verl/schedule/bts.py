"""BTS (bubble-aware TAG search, the paper's Algorithm 2): insert one TAG micro-batch now, or skip?

The decision is taken whenever the trainer is idle with an empty Update Queue while micro-batches of
its step are still pending (a *bubble*). BTS predicts the rest of the step with a small deterministic
model and picks the choice with the smaller predicted makespan (ties: skip). It is re-solved at every
bubble with the current cost estimates, so mispredictions are corrected as measurements come in.

The model (one generator "server", one trainer)::

    generator: loop { if scoring queue: SCORE (sc)  elif pending: GEN (g) -> scoring queue  else idle }
    trainer:   loop { if ready: UPDATE (t)  elif pending: DECIDE(TAG (g') -> scoring queue | SKIP)
                      else wait }

SKIP means "wait for the next generator event, then decide again". The makespan is the end of the last
UPDATE. A generator pool of L lanes is modelled as one server with per-micro-batch costs g/L and sc/L
(throughput-equivalent; exact for L = 1).

The compressed state at a decision is ``(pending, generator phase, time left of its current task,
scoring-queue length)``: the trainer is idle and nothing is ready, so nothing else matters, and the
remaining makespan is shift-invariant in time. The search is a depth-first branch and bound over the
two choices with memoisation on that state; a branch is pruned when its lower bound (the LP relaxation
in ``lower_bound``) cannot beat the sibling already solved. Pruning only compares siblings, so memoised
values stay exact.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field
from typing import Callable

from digenrl_verl.schedule.config import TagConfig

SKIP, TAG = 0, 1


class GenPhase(enum.IntEnum):
    IDLE = 0
    GEN = 1
    SCORE = 2


@dataclass(frozen=True)
class BtsCosts:
    """Per-micro-batch durations the model uses (seconds).

    Args:
        gen: g, one GEN on the generator pool (already divided by the lane count).
        score: sc, one SCORE on the generator pool (already divided by the lane count).
        update: t, one UPDATE on the trainer pool.
        tag: g', one TAG_GEN on the trainer pool.
    """

    gen: float
    score: float
    update: float
    tag: float

    def __post_init__(self) -> None:
        for name in ("gen", "score", "update", "tag"):
            value = getattr(self, name)
            if not value >= 0.0:
                raise ValueError(f"BtsCosts.{name}={value!r} must be a number >= 0")
        if self.gen <= 0 or self.tag <= 0:
            raise ValueError(f"BtsCosts.gen and .tag must be > 0 (got {self.gen}, {self.tag})")


@dataclass(frozen=True)
class BtsState:
    """The compressed state at a bubble (times relative to now; the trainer is idle).

    Args:
        pending: micro-batches not started anywhere.
        phase: what the generator is doing.
        remaining: time until the generator's current task ends (0 when idle).
        scoring_queue: generated micro-batches waiting for a SCORE (not counting one being scored).
        ready: scored micro-batches waiting for an UPDATE (0 at a true bubble).
    """

    pending: int
    phase: GenPhase = GenPhase.IDLE
    remaining: float = 0.0
    scoring_queue: int = 0
    ready: int = 0


@dataclass
class BtsResult:
    """Outcome of one solve: the decision, predicted makespans and search statistics."""

    tag_now: bool
    makespan: float
    tag_makespan: float | None
    skip_makespan: float
    states: int
    pruned: int
    budget_hit: bool = False


_INF = float("inf")
_IDLE, _GEN, _SCORE = int(GenPhase.IDLE), int(GenPhase.GEN), int(GenPhase.SCORE)

# Internal state tuple at a decision: (pending, phase, remaining, scoring_queue, ready).
_State = tuple


def _step(c: BtsCosts, st: _State, choice: int | None) -> tuple[float, _State | None, float]:
    """Apply ``choice`` at time 0 (None: no decision, just run) and advance the model deterministically.

    Returns ``(t, next_state, last_update)``: the time of the next decision point and the state there,
    or ``(t_end, None, last_update)`` when the step ends (``last_update`` is the makespan).
    Written with locals only: this is the inner loop of the search.
    """
    p, phase, rem, ks, ready = st
    gen_end = rem if phase != _IDLE else 0.0
    now = last_update = 0.0
    trn_task, trn_end, waiting = 0, 0.0, False
    g, sc, t, gp = c.gen, c.score, c.update, c.tag
    if choice == TAG:
        p -= 1
        trn_task, trn_end = 2, gp
    elif choice == SKIP:
        waiting = True
    while True:
        if phase == _IDLE:
            if ks > 0:
                ks -= 1
                phase, gen_end = _SCORE, now + sc
            elif p > 0:
                p -= 1
                phase, gen_end = _GEN, now + g
        if trn_task == 0:
            if ready > 0:
                ready -= 1
                trn_task, trn_end = 1, now + t
            elif p > 0 and not waiting:
                return now, (p, phase, (gen_end - now) if phase != _IDLE else 0.0, ks, ready), last_update
            elif phase == _IDLE and ks == 0:
                return now, None, last_update
        if trn_task and ks == 0 and phase != _IDLE:
            # Fast-forward whole GEN+SCORE cycles that end while the trainer is busy: nothing else can
            # happen in between (the same events, in the same order, as the slow path below).
            free = gen_end + sc if phase == _GEN else gen_end
            if free <= trn_end:
                cyc = g + sc
                k = min(p, int((trn_end - free) / cyc)) if cyc > 0 else p
                while k > 0 and free + k * cyc > trn_end:
                    k -= 1
                ready += k + 1
                p -= k
                now, phase, waiting = free + k * cyc, _IDLE, False
                continue
        if trn_task == 1 and ks == 0 and phase != _IDLE:
            now, p, phase, gen_end, ready, last_update = _drain_backlog(c, p, phase, gen_end, ready, trn_end)
            trn_task = 0
            continue
        gen_next = gen_end if phase != _IDLE else _INF
        trn_next = trn_end if trn_task else _INF
        if gen_next <= trn_next:  # generator events first on ties (the driver dispatches lanes first)
            now = gen_next
            if phase == _GEN:
                ks += 1
            else:
                ready += 1
            phase = _IDLE
            waiting = False
        else:
            now = trn_next
            if trn_task == 1:
                last_update = now
            else:
                ks += 1
            trn_task = 0


def _drain_backlog(c: BtsCosts, p: int, phase: int, gen_end: float, ready: int, trn_end: float) \
        -> tuple[float, int, int, float, int, float]:
    """`_step`'s backlog fast path: UPDATEs back to back while the generator keeps cycling GEN+SCORE (the trainer
    busy with an UPDATE, the scoring queue empty, the generator not idle). Same events in the same order as
    `_step`'s slow path, without its bookkeeping; stops when the trainer idles. Returns (now, pending, phase,
    gen_end, ready, last_update) there."""
    g, sc, t = c.gen, c.score, c.update
    ge = gen_end if phase == _GEN else -_INF
    nxt = gen_end + sc if phase == _GEN else gen_end
    while True:
        if nxt <= trn_end:
            now = nxt
            ready += 1
            if p > 0:
                p -= 1
                ge = now + g
                nxt = ge + sc
            else:
                nxt = _INF
        else:
            now = last_update = trn_end
            if ready == 0:
                break
            ready -= 1
            trn_end = now + t
    if nxt == _INF:
        return now, p, _IDLE, gen_end, ready, last_update
    if ge > now:
        return now, p, _GEN, ge, ready, last_update
    return now, p, _SCORE, nxt, ready, last_update


def _as_tuple(s: BtsState) -> _State:
    return (s.pending, int(s.phase), s.remaining if s.phase != GenPhase.IDLE else 0.0,
            s.scoring_queue, s.ready)


def _as_state(st: _State) -> BtsState:
    return BtsState(st[0], GenPhase(st[1]), st[2], st[3], st[4])


def _lb(c: BtsCosts, st: _State, min_tags: int) -> float:
    p, phase, rem, ks, ready = st
    n_score = p + ks + (1 if phase == _GEN else 0)
    n_update = p + ks + (1 if phase != _IDLE else 0) + ready
    if n_update == 0:
        return 0.0
    base_gen = rem + p * c.gen + n_score * c.score + c.update
    best = _INF
    if min_tags == 0:
        if ready:
            first_ready = 0.0
        elif phase == _SCORE:
            first_ready = rem
        elif phase == _GEN:
            first_ready = rem + c.score
        else:
            first_ready = c.score if ks else c.gen + c.score
        best = max(base_gen, first_ready + n_update * c.update)
    lo = min_tags if min_tags > 1 else 1
    if p >= lo:
        # max(base_gen - g·x, n_update·t + g'·x) is smallest where the two lines cross, clamped.
        x = (base_gen - n_update * c.update) / (c.gen + c.tag)
        x = p if x > p else (lo if x < lo else x)
        a, b = base_gen - c.gen * x, n_update * c.update + c.tag * x
        v = a if a > b else b
        if v < best:
            best = v
    return best


def lower_bound(c: BtsCosts, s: BtsState, min_tags: int = 0) -> float:
    """A lower bound on the remaining makespan from ``s`` if at least ``min_tags`` TAGs are used.

    LP relaxation over x = number of remaining TAG micro-batches (real in [min_tags, pending]):

    * generator chain: its current task, (pending - x) GENs and every SCORE still to start run one
      after another, then the last scored micro-batch needs one UPDATE:
      ``rem + (p - x)·g + Ns·sc + t``;
    * trainer chain: x TAGs and every UPDATE still to do run one after another: ``x·g' + Nu·t``;
      with x = 0 the first UPDATE cannot start before the first micro-batch is ready.

    The bound is ``min_x max(generator chain, trainer chain)``; with sc = 0, rem = 0 and an idle
    generator it is the project design's ``B·g·(g' + t)/(g + g')`` (DigenRL's TAG balance) plus the tail t.
    """
    return _lb(c, _as_tuple(s), min_tags)


@dataclass
class BtsSolver:
    """Exact search over TAG/SKIP sequences for one set of costs (memo reused across solves).

    The search is an alpha-bounded depth-first branch and bound: ``_value(s, alpha)`` returns the exact
    remaining makespan when it is below ``alpha`` and otherwise some lower bound that is >= ``alpha``.
    The memo stores ``(value, exact)`` per compressed state, so a bound-limited result is reused only
    where it is still conclusive (the transposition-table rule of alpha-beta search). The root
    ``alpha`` is just above the best of two cheap rollouts (no TAG, and static TAG(x*) with x* from
    the LP), so the root values are exact.

    Args:
        costs: model costs.
        memo: memoise on the compressed state (turning it off must not change any result).
        prune: prune branches whose ``lower_bound`` cannot beat the bound (off: plain search).
        max_states: expansion budget per solve (deterministic, unlike a time limit, so the Ray run and
            the simulator decide alike). When it is exceeded the search stops and the decision is taken
            by a one-step lookahead whose continuations are valued by the better of two rollouts
            (no TAG, static TAG(x*)); ``BtsResult.budget_hit`` is set. Memoised values of completed
            sub-searches stay exact and are reused by later solves with the same costs.
    """

    costs: BtsCosts
    memo: bool = True
    prune: bool = True
    max_states: int = TagConfig.bts_max_states
    _table: dict[tuple, tuple[float, bool]] = field(default_factory=dict, repr=False)
    _states: int = 0
    _pruned: int = 0
    _budget_hit: bool = False

    def __post_init__(self) -> None:
        self._scale = 1.0 / max(self.costs.gen, self.costs.tag, self.costs.update)

    def _branch(self, st: _State, choice: int, alpha: float) -> float:
        """Remaining makespan when taking ``choice`` now, then deciding optimally (alpha-bounded)."""
        now, nxt, last = _step(self.costs, st, choice)
        if nxt is None:
            return last
        return now + self._value(nxt, alpha - now)

    def _value(self, st: _State, alpha: float) -> float:
        key = None
        if self.memo:
            key = (st[0], st[1], round(st[2] * self._scale, 9), st[3], st[4])
            hit = self._table.get(key)
            if hit is not None and (hit[1] or hit[0] >= alpha):
                return hit[0]
        if self.prune:
            lb = _lb(self.costs, st, 0)
            if lb >= alpha:
                self._pruned += 1
                return lb
        self._states += 1
        if self._states > self.max_states:
            raise _BudgetExceeded
        value = self._best(st, alpha)[0]
        if key is not None:
            self._table[key] = (value, value < alpha)
        return value

    def _best(self, st: _State, alpha: float) -> tuple[float, float | None, float | None]:
        """(best, tag value, skip value) at a decision state; a value is None when pruned."""
        values: dict[int, float | None] = {TAG: None, SKIP: None}
        if self.prune:
            bounds = {TAG: _lb(self.costs, st, 1), SKIP: _lb(self.costs, st, 0)}
        else:
            bounds = {TAG: 0.0, SKIP: 0.0}
        best = _INF
        for choice in sorted((TAG, SKIP), key=lambda ch: (bounds[ch], ch)):
            if choice == TAG and st[0] == 0:
                continue
            cut = best if best < alpha else alpha
            if self.prune and bounds[choice] >= cut:
                self._pruned += 1
                if best >= alpha:  # nothing exact yet: the bound is the best lower bound we know
                    best = min(best, bounds[choice])
                continue
            v = self._branch(st, choice, cut)
            values[choice] = v
            if v < best:
                best = v
        return best, values[TAG], values[SKIP]

    def solve(self, state: BtsState, *, tie_tag: bool = False) -> BtsResult:
        """Decide at a bubble: is inserting one TAG now strictly better than skipping?

        The state is first advanced to its decision point (an idle generator with pending work starts
        generating, ready micro-batches are updated); if that is not "now", the answer is skip.
        ``tie_tag``: when both choices predict the same makespan (relative 1e-9), TAG instead of skip
        (used by `BtsTag` while it decides on a cold-start prior; the values are unchanged).
        """
        self._states = self._pruned = 0
        self._budget_hit = False
        c = self.costs
        offset, st, last = _step(c, _as_tuple(state), None)
        if st is None:
            return BtsResult(False, last, None, last, 0, 0)
        incumbent = min(_rollout(c, st, no_tag_policy()), _rollout(c, st, static_policy(_lp_tags(c, st))))
        alpha = incumbent * (1 + 1e-9) + 1e-9
        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, 20 * (st[0] + st[3]) + 1000))
        try:
            tag_v = self._branch(st, TAG, alpha) if st[0] > 0 else None
            skip_alpha = alpha if tag_v is None else min(alpha, tag_v * (1 + 1e-9) + 1e-9)
            skip_v = self._branch(st, SKIP, skip_alpha)
        except _BudgetExceeded:
            self._budget_hit = True
            tag_v = self._lookahead(st, TAG) if st[0] > 0 else None
            skip_v = self._lookahead(st, SKIP)
        finally:
            sys.setrecursionlimit(old_limit)
        if tag_v is None or offset != 0:
            tag_now = False
        elif tie_tag:
            tag_now = tag_v <= skip_v * (1 + 1e-9) + 1e-9
        else:
            tag_now = tag_v < skip_v
        best = skip_v if tag_v is None else min(skip_v, tag_v)
        return BtsResult(tag_now, offset + best, None if tag_v is None else offset + tag_v,
                         offset + skip_v, self._states, self._pruned, self._budget_hit)

    def _lookahead(self, st: _State, choice: int) -> float:
        """``choice`` now, then the better of the no-TAG and static-TAG(x*) rollouts."""
        now, nxt, last = _step(self.costs, st, choice)
        if nxt is None:
            return last
        c = self.costs
        return now + min(_rollout(c, nxt, no_tag_policy()), _rollout(c, nxt, static_policy(_lp_tags(c, nxt))))


class _BudgetExceeded(Exception):
    """Raised inside the search when ``max_states`` is exceeded."""


def _lp_tags(c: BtsCosts, st: _State) -> int:
    """The LP's optimal TAG count from ``st``, rounded (a good static choice)."""
    p, phase, rem, ks, ready = st
    n_score = p + ks + (1 if phase == _GEN else 0)
    n_update = p + ks + (1 if phase != _IDLE else 0) + ready
    base_gen = rem + p * c.gen + n_score * c.score + c.update
    x = (base_gen - n_update * c.update) / (c.gen + c.tag)
    return int(min(max(round(x), 0), p))


Policy = Callable[[BtsState, int], bool]
"""(state at a bubble, TAGs taken so far in this rollout) -> insert a TAG now?"""


def _rollout(c: BtsCosts, st: _State, policy: Policy) -> float:
    base, tags = 0.0, 0
    now, nxt, last = _step(c, st, None)
    while nxt is not None:
        base += now
        tag = nxt[0] > 0 and policy(_as_state(nxt), tags)
        tags += int(tag)
        now, nxt, last = _step(c, nxt, TAG if tag else SKIP)
    return base + last


def rollout(costs: BtsCosts, state: BtsState, policy: Policy) -> float:
    """Makespan of the model when every bubble is decided by ``policy`` (no search)."""
    return _rollout(costs, _as_tuple(state), policy)


def static_policy(k: int) -> Policy:
    """Static TAG(k): TAG at the first k bubbles, then never."""
    return lambda _s, tags: tags < k


def no_tag_policy() -> Policy:
    return lambda _s, _tags: False


def exhaustive(costs: BtsCosts, state: BtsState) -> float:
    """Best makespan over every TAG/SKIP sequence, by plain enumeration (no memo, no pruning).

    Exponential; for tests on small instances only.
    """

    def go(st: _State) -> float:
        best = _INF
        for choice in (TAG, SKIP) if st[0] > 0 else (SKIP,):
            now, nxt, last = _step(costs, st, choice)
            best = min(best, last if nxt is None else now + go(nxt))
        return best

    now, st, last = _step(costs, _as_tuple(state), None)
    return last if st is None else now + go(st)
