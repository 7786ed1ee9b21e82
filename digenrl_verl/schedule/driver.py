"""The driver: one event loop (the paper's Algorithm 1, generalised) over the `Executor` protocol.

::

        prompts of step s ── Planner ──▶ pending micro-batches
                                   │                │ TAG (TagPolicy at a trainer bubble)
                          GEN on a free lane        ▼
                                   ▼         TAG_GEN on the trainer
                             Scoring Queue ◀────────┘
                                   │ SCORE on a free lane (before more GEN)
                                   ▼
                             Update Queue ──▶ UPDATE (trainer; before any TAG)
                                                    │ every micro-batch of s updated
                                                    ▼
                                  OPT_STEP (version v+1) ──▶ SYNC to generators (drained first)
                                                                       │ at a checkpoint barrier
                                                                       ▼
                                                      CHECKPOINT on the trainer (nothing of s+1 yet)

Each turn of the loop: issue every task that may start now (SYNC first, then generator lanes, then the
trainer), wait for any completion, update the state. Every issued task, every TAG decision and every
failure is recorded in the `Trace`. Decisions depend only on the order and durations of completions,
so the Ray runtime and the simulator make the same decisions when fed the same durations.

Invariants (tested in ``tests/schedule``):

* every sample of a step is generated (successfully) once and updated once, also after failures
  (a generation whose data the executor reports lost is redone, and only the redone one counts);
* a trajectory is generated under one version (a task's workers only change weights through SYNC,
  which waits until they are idle) and TCSS limits hold (`StalenessPolicy`);
* with staleness 0 every micro-batch of step s is generated with version s, i.e. after the SYNC that
  delivered version s, and no task of step s+1 starts before that SYNC;
* UPDATEs of step s+1 start only after OPT_STEP of step s;
* with ``config.mini_batches_per_step = k`` (verl's ``ppo_mini_batch_size``) the step's prompt groups form k
  mini-batches cut as verl cuts them over the trainer ranks (`plan.step_microbatches`,
  `config.minibatch_groups`: each rank's share of the batch in k contiguous blocks; mini-batch j is every rank's
  j-th block): the UPDATEs of mini-batch j start (as they are scored) only
  after OPT_STEP j-1, OPT_STEP j follows all of them; the first k-1 OPT_STEPs keep the version (flag
  ``minibatch``), the last bumps it and is followed by the SYNC, so generators get weights once per global step.
  Between them the trainer's weights have no version: no TAG and no join SYNC runs then (with no live generator
  left and a mini-batch still to generate, such a step cannot finish: a deadlock error);
* at a checkpoint barrier (``config.checkpoint_every = k``: after every step s with (s + 1) % k == 0) the
  driver issues one CHECKPOINT on the trainer pool after the step's SYNC (colocated: its OPT_STEP) and opens
  step s+1 only when it ended: nothing of step s+1 (no stale TCSS generation either) starts before, so the
  state saved is drained (no queued or half-generated micro-batch of a later step exists).

Colocated mode is the same loop with one pool in both roles: lanes and trainer are the same ranks, a
full-batch barrier holds, and the OPT_STEP gives the generators the new version (no SYNC). Its micro-batches are
verl-omni's (`plan.ColocatedPlanner`: ``config.micro_batch_size`` samples of every rank's share), and a colocated
task names only the ranks its micro-batch gives samples to (the plan's split), so a rank is busy exactly when it
has work.

Failure handling: a completion with ``ok=False`` whose ``info["dead_workers"]`` names workers removes
them (the generator pool is re-cut into lanes over the live ranks). A failed GEN/TAG_GEN goes back to
pending; a failed SCORE is scored again on another lane (the trajectories are kept by the executor),
unless the executor reports ``info["data_lost"]``, in which case the micro-batch is generated again.
With no live generator left, the trainer generates everything (TAG) and scores it. A trainer failure,
or a failed UPDATE/OPT_STEP, is fatal (`ScheduleError`): accumulated gradients cannot be replayed. A task
running longer than ``task_timeout_s`` is fatal too; the error names the task and its workers and prints
the schedule of the steps around it with ``<-- ERROR HERE``.

Elastic generator pool (disaggregated mode): worker events (`WorkerEvent`) change the generator pool during a run.
They come from `post` or from an executor that has a ``poll_events()`` method (`EventSource`), and are applied
at the start of a turn, before anything is issued:

* ``added``: a generator (a replacement for a dead one, same id: "rejoin"; or a new id: "grow") is alive but
  holds no weights yet. It *joins*: a SYNC with the ``join`` flag sends it the generators' current version as
  soon as the trainer holds that version and is idle (the trainer has not stepped past the generators), else
  it is added to the next regular SYNC. It takes tasks from then on (the lanes are re-cut over the live ranks).
* ``removed``: a generator leaves ("shrink"): it gets no new task; once its running task (if any) ended it is
  in `removed` and the executor may stop it. A removed dead worker ("drop", e.g. after too many restarts) is
  only recorded.

Every event is a `Decision` in the trace (``rejoin``, ``grow``, ``joined``, ``shrink``, ``drop``). Micro-batches
already planned keep their plan; a step opened later is planned over the live ranks of that moment.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

from digenrl_verl.schedule.bts import BtsCosts, BtsState, GenPhase
from digenrl_verl.schedule.config import ScheduleConfig
from digenrl_verl.schedule.cost import CostProfiler
from digenrl_verl.schedule.plan import MicroBatch, Planner, planner_for, split_even, step_microbatches
from digenrl_verl.schedule.select import FirstFree, LaneSelector
from digenrl_verl.schedule.staleness import GenRequest, StalenessPolicy
from digenrl_verl.schedule.tag import BubbleContext, TagPolicy, make_tag_policy
from digenrl_verl.schedule.trace import Decision, Trace, format_action
from digenrl_verl.schedule.types import (Assignment, Completion, Executor, ScheduleError, Task, TaskKind,
                                         worker_pool, worker_rank)


MAX_TASK_RETRIES = 2
"""A micro-batch whose GEN/TAG/SCORE raises on live workers is retried this many times, then the run stops."""


WORKER_EVENTS = ("added", "removed")


@dataclass(frozen=True)
class WorkerEvent:
    """A change of the generator pool from outside the schedule (ids only: no actor, no tensor).

    Attributes:
        kind: ``"added"`` (alive, no weights yet: it joins) or ``"removed"`` (leaves once idle).
        worker: a generator worker id (``"gen:2"``).
        reason: shown in the trace's decision.
    """

    kind: str
    worker: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in WORKER_EVENTS:
            raise ValueError(f"WorkerEvent.kind={self.kind!r} is invalid: use one of {list(WORKER_EVENTS)}")


@runtime_checkable
class EventSource(Protocol):
    """An executor that also reports changes of the generator pool (polled once per driver turn)."""

    def poll_events(self) -> list[WorkerEvent]:
        ...


class MbStatus(enum.Enum):
    PENDING = "pending"
    GENERATING = "generating"
    GENERATED = "generated"  # in the Scoring Queue
    SCORING = "scoring"
    READY = "ready"  # in the Update Queue
    UPDATING = "updating"
    UPDATED = "updated"


@dataclass
class _Mb:
    mb: MicroBatch
    status: MbStatus = MbStatus.PENDING
    gen_version: int | None = None
    stale: bool = False
    retries: int = 0
    errors: int = 0  # failures on live workers (bounded by MAX_TASK_RETRIES)


@dataclass
class _Step:
    step: int
    mbs: list[_Mb]
    pending: deque[int]
    stale_samples: int = 0
    tags: int = 0
    updated: int = 0
    scored: int = 0
    opt_issued: bool = False  # the OPT_STEP of mini-batch `opt_done` is in flight
    opt_done: int = 0  # mini-batches whose OPT_STEP completed
    trained_version: int | None = None
    first_start: float | None = None
    infos: list[dict[str, Any]] = field(default_factory=list)
    gen_tasks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """One finished global step.

    Attributes:
        step: the global step.
        version: the policy version it trained (its OPT_STEP produced ``version + 1``).
        start, end: first task start and the end of its SYNC (OPT_STEP in colocated mode).
        microbatches: pipeline units of the step.
        tag_microbatches: micro-batches generated by the trainer.
        stale_samples: samples generated with a version < step.
        gen_versions: version -> number of samples generated with it.
        infos: ``info`` dicts of the step's successful SCORE completions (e.g. reward summaries).
        gen_tasks: generator worker -> successful GEN tasks of the step it took part in (the lanes that ran it).
    """

    step: int
    version: int
    start: float
    end: float
    microbatches: int
    tag_microbatches: int
    stale_samples: int
    gen_versions: dict[int, int]
    infos: tuple[dict[str, Any], ...] = ()
    gen_tasks: dict[str, int] = field(default_factory=dict)


@dataclass
class DriverStats:
    """Wall time the driver itself spent (excluding waiting on the executor)."""

    wall_s: float = 0.0
    decisions: int = 0
    loops: int = 0
    tag_consults: int = 0

    @property
    def ms_per_decision(self) -> float:
        return 1000.0 * self.wall_s / max(self.decisions, 1)


class Driver:
    """Runs ``config.num_steps`` global steps from ``config.start_step`` on an executor.

    Usage::

        driver = Driver(config, executor)
        for result in driver.iter_steps():   # or driver.run() / driver.run_steps(k)
            ...                              # log; the next step may already be running

    Policies can be swapped for experiments (``tag_policy``, ``staleness``, ``planner``, ``selector``);
    by default they are built from the config. ``profiler`` may be pre-seeded (e.g. restored with a checkpoint).
    """

    def __init__(self, config: ScheduleConfig, executor: Executor, *, tag_policy: TagPolicy | None = None,
                 staleness: StalenessPolicy | None = None, planner: Planner | None = None,
                 profiler: CostProfiler | None = None, trace: Trace | None = None,
                 selector: LaneSelector | None = None) -> None:
        self.config = config
        self.executor = executor
        self.colocated = config.mode == "colocated"
        self.tag_policy = tag_policy or make_tag_policy(config.tag)
        self.staleness = staleness or StalenessPolicy.of(config.tcss)
        self.planner = planner or planner_for(config)
        self.profiler = profiler or CostProfiler()
        self.trace = trace or Trace()
        self.selector = selector or FirstFree()
        self.busy_seconds: dict[str, float] = {}
        self.stats = DriverStats()
        self.gen_workers = list(config.workers(config.generator_pool))
        self.trn_workers = list(config.workers(config.trainer_pool))
        self.dead: set[str] = set()
        self.joining: list[str] = []  # added generators waiting for their weights (not in a lane yet)
        self.retiring: set[str] = set()  # generators leaving once their running task ended
        self.removed: set[str] = set()  # generators that left (shrink) or were dropped: never used again
        self._events: deque[WorkerEvent] = deque()
        self.busy: dict[str, int] = {}
        self.in_flight: dict[int, tuple[Task, float]] = {}
        self.steps: dict[int, _Step] = {}
        self.scoring_queue: deque[tuple[int, int]] = deque()
        self.update_queue: deque[tuple[int, int]] = deque()
        self.trainer_version = config.start_step
        self.gen_version = config.start_step
        self.last_update = config.start_step - 1  # last step whose OPT_STEP completed
        self.sync_needed = False
        self.checkpoint_pending: int | None = None  # barrier step whose CHECKPOINT has not ended yet
        self._checkpoint_issued = False
        self._checkpointed = config.start_step - 1  # last barrier step whose CHECKPOINT ended
        self.finished: deque[StepResult] = deque()
        self.done_steps = 0
        self._task_ids = 0
        self._lanes = self._cut_lanes()
        self._gen_futures = 0

    # ================================================================================ public API
    def iter_steps(self) -> Iterator[StepResult]:
        """Run the event loop, yielding each global step as soon as it is finished (at a barrier step: before
        its CHECKPOINT; the generator ends after the last step's CHECKPOINT)."""
        while True:
            while self.finished:
                yield self.finished.popleft()
            if self.done_steps >= self.config.num_steps and self.checkpoint_pending is None:
                return
            self._turn()

    def run_steps(self, count: int) -> list[StepResult]:
        """Run until ``count`` more steps are finished (tasks of later steps may stay in flight)."""
        out: list[StepResult] = []
        it = self.iter_steps()
        for result in it:
            out.append(result)
            if len(out) == count:
                break
        return out

    def run(self) -> list[StepResult]:
        """Run every remaining step."""
        return list(self.iter_steps())

    def mark_dead(self, workers: Sequence[str]) -> None:
        """Workers already lost before this driver started (e.g. known to be gone when a run resumes)."""
        new = set(workers) - self.dead
        if new & set(self.trn_workers):
            raise ScheduleError(f"cannot run without trainer worker(s) {sorted(new & set(self.trn_workers))}")
        self.dead |= new
        self._lanes = self._cut_lanes()

    def post(self, event: WorkerEvent) -> None:
        """Queue a change of the generator pool; applied at the start of the next turn."""
        self._events.append(event)

    @property
    def lanes(self) -> list[tuple[str, ...]]:
        return list(self._lanes)

    @property
    def live_generators(self) -> list[str]:
        """Generators that take tasks now (not dead, joining, leaving or removed)."""
        return self._live_gen()

    @property
    def generator_count(self) -> int:
        """Generators in the pool or on their way in (live, joining): what a resize counts from."""
        return len(self._live_gen()) + len(self.joining)

    # ================================================================================ elastic pool
    def _apply_events(self) -> None:
        if isinstance(self.executor, EventSource):
            self._events.extend(self.executor.poll_events())
        while self._events:
            event = self._events.popleft()
            if self.colocated:
                raise ScheduleError(f"{event.kind} {event.worker}: the generator pool can only change in "
                                    "disaggregated mode (colocated ranks train too)")
            if worker_pool(event.worker) != self.config.generator_pool:
                raise ScheduleError(f"{event.kind} {event.worker}: only generator workers "
                                    f"('{self.config.generator_pool}:<rank>') can join or leave a running schedule")
            if event.kind == "added":
                self._add_generator(event)
            else:
                self._remove_generator(event)
        self._retire_idle()

    def _add_generator(self, event: WorkerEvent) -> None:
        w, now = event.worker, self.executor.now()
        if w in self.retiring:  # asked to leave, asked back before it left: it still holds the weights
            self.retiring.discard(w)
            self._lanes = self._cut_lanes()
            self.trace.decide(Decision(now, "grow", None, None, None, f"{w} stays ({event.reason})".strip()))
            return
        if w in self.joining or w in self._live_gen():
            raise ScheduleError(f"added {w}, which is already in the generator pool")
        action = "rejoin" if w in self.dead else "grow"
        self.dead.discard(w)
        self.removed.discard(w)
        if w not in self.gen_workers:
            self.gen_workers = sorted([*self.gen_workers, w], key=worker_rank)
        self.joining.append(w)
        self.trace.decide(Decision(now, action, None, None, None,
                                   f"{w} joins, waits for weights v{self.gen_version} {event.reason}".strip()))

    def _remove_generator(self, event: WorkerEvent) -> None:
        w, now = event.worker, self.executor.now()
        if w in self.dead or w in self.removed or w not in self.gen_workers:
            self.removed.add(w)
            self.trace.decide(Decision(now, "drop", None, None, None, f"{w} {event.reason}".strip()))
            return
        if w in self.joining:
            self.joining.remove(w)
            self.removed.add(w)
        else:
            self.retiring.add(w)
        self._lanes = self._cut_lanes()
        self.trace.decide(Decision(now, "shrink", None, None, None, f"{w} leaves {event.reason}".strip()))

    def _retire_idle(self) -> None:
        for w in sorted(self.retiring):
            if w not in self.busy:
                self.retiring.discard(w)
                self.removed.add(w)

    def _try_join(self) -> bool:
        """A SYNC (flag ``join``) giving the joining generators the version the others hold, when the trainer
        holds it too (it has not stepped past the generators) and is idle; else they wait for the next SYNC."""
        step = self.last_update + 1  # the step whose generation it serves
        if (not self.joining or self.sync_needed or self.trainer_version != self.gen_version
                or step >= self.config.end_step or not self._idle(self.trn_workers) or self._between_minibatches()):
            return False
        workers = tuple(self.trn_workers) + tuple(self.joining)
        self._submit(TaskKind.SYNC, step, None, workers, self.trainer_version,
                     tuple((w, ()) for w in workers), f"weights to joining {', '.join(self.joining)}", {"join"})
        return True

    def _joined(self, task: Task) -> None:
        came = [w for w in self.joining if w in task.workers]
        if not came:
            return
        self.joining = [w for w in self.joining if w not in came]
        self._lanes = self._cut_lanes()
        self.trace.decide(Decision(self.executor.now(), "joined", None, None, task.task_id,
                                   f"{', '.join(came)} hold v{task.version}, take tasks"))

    # ================================================================================ event loop
    def _turn(self) -> None:
        t0 = time.perf_counter()
        self._apply_events()
        self._dispatch()
        self.stats.wall_s += time.perf_counter() - t0
        if not self.in_flight:
            raise self._error("no task can run and none is in flight (deadlock)", None)
        completions = self.executor.wait_any(self._wait_timeout())
        t0 = time.perf_counter()
        self.stats.loops += 1
        if not completions:
            self._check_timeouts()
        for c in sorted(completions, key=lambda c: (c.end, c.task.task_id)):
            self._on_completion(c)
        self.stats.wall_s += time.perf_counter() - t0

    def _wait_timeout(self) -> float | None:
        limit = self.config.task_timeout_s
        if limit is None:
            return None
        now = self.executor.now()
        return max(0.0, min(start + limit for _, start in self.in_flight.values()) - now)

    def _check_timeouts(self) -> None:
        limit = self.config.task_timeout_s
        now = self.executor.now()
        for task, start in sorted(self.in_flight.values(), key=lambda ts: ts[1]):
            if limit is not None and now - start >= limit:
                raise self._error(f"task {task.label} (id {task.task_id}) on workers {', '.join(task.workers)} "
                                  f"exceeded task_timeout_s={limit} "
                                  f"(running {now - start:.3f}s)", task)

    # ================================================================================ dispatch
    def _dispatch(self) -> None:
        """Issue what may start now: a CHECKPOINT (a barrier: nothing else runs with it), else SYNC (it drains
        everything else), then free lanes, then the trainer.

        One pass suffices: each branch leaves its workers busy or has nothing to do, and nothing a
        later branch issues creates work for an earlier one.
        """
        self._open_steps()
        if self.checkpoint_pending is not None:
            self._try_checkpoint()
            return
        self._try_sync()
        if self.sync_needed:
            self._drain_work()
            return
        self._try_join()
        self._try_lanes()
        self._try_trainer()

    def _drain_work(self) -> None:
        """While SYNC waits for generator lanes to finish their GEN, use idle workers if it is free.

        An idle lane may SCORE and an idle trainer may UPDATE (the next step's ready micro-batches; the
        trainer already holds the new version) when the estimate says the task ends before the last
        running GEN does, so the SYNC is not delayed.
        """
        gen_cls = self.config.pools[self.config.generator_pool].worker_class
        trn_cls = self.config.pools[self.config.trainer_pool].worker_class
        ends = [start + (self.profiler.estimate(t.kind, gen_cls, t.work) or 0.0)
                for t, start in self.in_flight.values() if t.kind == TaskKind.GEN]
        if not ends:
            return
        now, drain_end = self.executor.now(), max(ends)
        for lane in self._lanes:
            if not self.scoring_queue or not self._idle(lane):
                continue
            step, idx = self.scoring_queue[0]
            est = self.profiler.estimate(TaskKind.SCORE, gen_cls, self._lane_work(self.steps[step].mbs[idx].mb, lane))
            if est is not None and now + est <= drain_end:
                self._issue_score(lane)
        st = self.steps.get(self.last_update + 1)
        if st is None or not self._idle(self.trn_workers) or not self.config.pipeline:
            return
        est = self.profiler.estimate(TaskKind.UPDATE, trn_cls, -(-len(st.mbs[0].mb.samples) // len(self.trn_workers)))
        if est is not None and now + est <= drain_end:
            ready = self._next_ready(st)
            if ready is not None:
                self._issue_update(st, ready)

    def _open_steps(self) -> None:
        """Plan steps as soon as TCSS lets generation reach them, but none past a checkpoint barrier whose
        CHECKPOINT has not ended."""
        upto = min(self.staleness.max_step(self.last_update), self.config.end_step - 1, self._barrier_step())
        for step in range(self.config.start_step, upto + 1):
            if step not in self.steps and step > self.last_update:
                ranks = len(self._live_gen()) or len(self.trn_workers)  # batch-axis: one group per rank
                mbs = step_microbatches(self.planner, step, self.config.prompts_per_step, self.config.n, ranks,
                                        self.config.mini_batches_per_step, self.config.minibatch_dp_ranks)
                self.steps[step] = _Step(step, [_Mb(mb) for mb in mbs], deque(range(len(mbs))))

    def _barrier_step(self) -> int:
        """The last step that may be planned: the first barrier step (save or validation) not yet passed (no
        barrier: the end)."""
        return self.config.next_barrier_step(max(self.config.start_step, self._checkpointed + 1))

    def _try_checkpoint(self) -> bool:
        """The CHECKPOINT of the barrier step just finished, on the trainer ranks.

        Nothing else is in flight then: steps up to the barrier step are finished (its SYNC, colocated its
        OPT_STEP, ended) and no later step was planned (`_open_steps`)."""
        if self._checkpoint_issued or not self._idle(self.trn_workers):
            return False
        self._checkpoint_issued = True
        step = self.checkpoint_pending
        assert step is not None
        self._submit(TaskKind.CHECKPOINT, step, None, tuple(self.trn_workers), self.trainer_version,
                     tuple((w, ()) for w in self.trn_workers), f"barrier: step {step + 1} waits for it")
        return True

    def _idle(self, workers: Sequence[str]) -> bool:
        return all(w not in self.busy for w in workers)

    def _live_gen(self) -> list[str]:
        out = set(self.dead) | self.removed | self.retiring | set(self.joining)
        return [w for w in self.gen_workers if w not in out]

    def _cut_lanes(self) -> list[tuple[str, ...]]:
        return self.planner.lanes(self._live_gen(), self.config.n)

    def _try_sync(self) -> bool:
        if not self.sync_needed:
            return False
        workers = tuple(self.trn_workers) + tuple(self._live_gen()) + tuple(self.joining)
        if not self._idle(workers):
            return False
        self._submit(TaskKind.SYNC, self.last_update, None, workers, self.trainer_version,
                     tuple((w, ()) for w in workers), "weights to generators")
        return True

    def _try_lanes(self) -> bool:
        issued = False
        free = [lane for lane in self._lanes if self._idle(lane)]
        for lane in self.selector.order(free, self.busy_seconds) if len(free) > 1 else free:
            issued |= self._lane_task(lane)
        return issued

    def _lane_work(self, mb: MicroBatch, lane: Sequence[str]) -> int:
        return max(len(s) for _, s in self.planner.assign(mb, lane, self.config.n))

    def _lane_task(self, lane: tuple[str, ...]) -> bool:
        if self.scoring_queue:
            self._issue_score(lane)
            return True
        found = self._next_gen()
        if (found is not None and self.gen_version < found[0].step and self.config.tcss.guard
                and not self._stale_gen_fits(found[0], lane)):
            found = None
        if found is None:
            return False
        st, idx = found
        mb = st.mbs[idx].mb
        st.pending.remove(idx)
        assignment = self.planner.assign(mb, lane, self.config.n)
        self._issue_gen(TaskKind.GEN, st, idx, self._task_workers(lane, assignment), assignment, self.gen_version)
        return True

    def _next_gen(self) -> tuple[_Step, int] | None:
        """Oldest pending micro-batch that TCSS lets the generators start now."""
        for step in sorted(self.steps):
            st = self.steps[step]
            if not st.pending:
                continue
            idx = st.pending[0]
            reason = self.staleness.check(self._gen_request(st, idx, self.gen_version))
            return None if reason else (st, idx)
        return None

    def _stale_gen_fits(self, st: _Step, lane: tuple[str, ...]) -> bool:
        """A stale GEN must not delay the weight SYNC it runs ahead of (by more than `tcss.guard_slack` of its own
        estimated duration).

        Estimated end of the GEN (less the slack) <= estimated end of the trainer's work on the step being updated
        (running task, remaining UPDATEs, OPT_STEP), and no trajectory of that step is still being
        generated on the trainer (its SCORE would wait behind the stale GEN). Without estimates: no.
        """
        gen_cls = self.config.pools[self.config.generator_pool].worker_class
        trn_cls = self.config.pools[self.config.trainer_pool].worker_class
        current = self.steps.get(self.last_update + 1)
        if current is None or current is st:
            return True
        gen_est = self.profiler.estimate(TaskKind.GEN, gen_cls, self._lane_work(st.mbs[st.pending[0]].mb, lane))
        trn_work = -(-len(current.mbs[0].mb.samples) // len(self.trn_workers))
        upd_est = self.profiler.estimate(TaskKind.UPDATE, trn_cls, trn_work)
        opt_est = self.profiler.estimate(TaskKind.OPT_STEP, trn_cls)
        if gen_est is None or upd_est is None or opt_est is None:
            return False
        now = self.executor.now()
        trainer_free = now
        for task, start in self.in_flight.values():
            if task.kind == TaskKind.TAG_GEN and task.step == current.step:
                return False
            if set(task.workers) & set(self.trn_workers):
                est = self.profiler.estimate(task.kind, trn_cls, task.work) or 0.0
                trainer_free = max(trainer_free, start + est)
        todo = sum(1 for m in current.mbs if m.status not in (MbStatus.UPDATING, MbStatus.UPDATED))
        opts = self.config.mini_batches_per_step - current.opt_done
        return now + gen_est * (1.0 - self.config.tcss.guard_slack) <= trainer_free + todo * upd_est + opts * opt_est

    def _gen_request(self, st: _Step, idx: int, version: int) -> GenRequest:
        return GenRequest(st.step, version, len(st.mbs[idx].mb.samples), self.last_update, st.stale_samples,
                          self.config.samples_per_step, self._gen_futures)

    def _try_trainer(self) -> bool:
        trainers = self.trn_workers
        if not self._idle(trainers):
            return False
        st = self.steps.get(self.last_update + 1)
        if st is None:
            return False
        scored = not self.config.opt_waits_for_step or st.scored == len(st.mbs)  # the step's std is known
        if not st.opt_issued and scored and all(m.status == MbStatus.UPDATED for m in st.mbs
                                                if m.mb.minibatch == st.opt_done):
            st.opt_issued = True
            k = self.config.mini_batches_per_step
            last = st.opt_done == k - 1
            detail = "all micro-batches updated" if k == 1 else f"mini-batch {st.opt_done + 1}/{k} updated"
            # versions count global steps: only the step's last optimizer step bumps it (and is followed by SYNC)
            self._submit(TaskKind.OPT_STEP, st.step, None, tuple(trainers), self.trainer_version + int(last),
                         tuple((w, ()) for w in trainers), detail, None if last else {"minibatch"})
            return True
        ready = self._next_ready(st)
        if ready is not None:
            self._issue_update(st, ready)
            return True
        if not self._lanes and self.scoring_queue:  # no generator left: the trainer scores
            self._issue_score(tuple(trainers), on_trainer=True)
            return True
        if st.pending and not self.colocated:
            return self._bubble(st)
        return False

    def _next_ready(self, st: _Step) -> int | None:
        """A scored micro-batch of the current mini-batch of `st` (none while its OPT_STEP runs)."""
        if not self.config.pipeline or self.colocated:
            if st.scored < len(st.mbs):
                return None
        if st.opt_issued:
            return None
        for pos, (step, idx) in enumerate(self.update_queue):
            if step == st.step and st.mbs[idx].mb.minibatch == st.opt_done:
                del self.update_queue[pos]
                return idx
        return None

    # ================================================================================ TAG
    def _between_minibatches(self) -> bool:
        """The trainer holds weights between two optimizer steps of one global step (no version names them), so
        it may neither generate (TAG) nor send its weights (join SYNC) until the step's last OPT_STEP."""
        st = self.steps.get(self.last_update + 1)
        return st is not None and st.opt_done > 0

    def _bubble(self, st: _Step) -> bool:
        idx = st.pending[-1]
        if self._between_minibatches():
            return False
        if self.staleness.check(self._gen_request(st, idx, self.trainer_version)):
            return False
        if not self._lanes:  # no generator left: TAG is the only way forward
            decision_tag, reason, probe = True, "no live generator", False
        else:
            ctx = self._bubble_context(st)
            self.stats.tag_consults += 1
            self.stats.decisions += 1
            decision = self.tag_policy.decide(ctx)
            decision_tag, reason, probe = decision.tag, decision.reason, decision.probe
            self.trace.decide(Decision(self.executor.now(), "tag" if decision_tag else "skip", st.step,
                                       idx, None, reason))
        if not decision_tag:
            return False
        st.pending.remove(idx)
        st.tags += 1
        assignment = split_even(st.mbs[idx].mb.samples, self.trn_workers)
        self._issue_gen(TaskKind.TAG_GEN, st, idx, tuple(self.trn_workers), assignment, self.trainer_version,
                        extra_flags=("probe",) if probe else ())
        return True

    def _bubble_context(self, st: _Step) -> BubbleContext:
        now = self.executor.now()
        gen_cls = self.config.pools[self.config.generator_pool].worker_class
        trn_cls = self.config.pools[self.config.trainer_pool].worker_class
        mb_samples = len(st.mbs[st.pending[-1]].mb.samples)
        trn_work = -(-mb_samples // len(self.trn_workers))
        lane_works = [-(-mb_samples // len(lane)) for lane in self._lanes] or [mb_samples]
        g_unit = self.profiler.unit_cost(TaskKind.GEN, gen_cls)
        s_unit = self.profiler.unit_cost(TaskKind.SCORE, gen_cls)
        t_est = self.profiler.estimate(TaskKind.UPDATE, trn_cls, trn_work)
        tag_est = self.profiler.estimate(TaskKind.TAG_GEN, trn_cls, trn_work)
        costs = prior = None
        if tag_est is not None and tag_est > 0:
            g_known = g_unit is not None and g_unit > 0
            # cold start (see `BtsTag`): an unfinished GEN has cost at least its elapsed time so far
            g_bound = g_unit if g_unit is not None and g_known else max(
                ((now - start) / task.work for task, start in self.in_flight.values() if task.kind == TaskKind.GEN),
                default=0.0)
            if g_bound > 0:
                rate_g = sum(1.0 / (g_bound * w) for w in lane_works)
                rate_s = sum(1.0 / (s_unit * w) for w in lane_works) if s_unit else 0.0
                model = BtsCosts(gen=1.0 / rate_g, score=(1.0 / rate_s) if rate_s else 0.0,
                                 update=t_est if t_est is not None else 0.0, tag=tag_est)
                if g_known and t_est is not None:
                    costs = model
                else:
                    prior = model
        return BubbleContext(now, st.step, len(st.pending), st.tags, self._bts_state(st, now), costs,
                             tag_est is not None, prior, self.profiler.is_floor(TaskKind.TAG_GEN, trn_cls))

    def _bts_state(self, st: _Step, now: float) -> BtsState:
        """Aggregate the generator lanes into the BTS model's single server (see `schedule.bts`)."""
        running: list[tuple[float, Task]] = []
        gen_cls = self.config.pools[self.config.generator_pool].worker_class
        for task, start in self.in_flight.values():
            if task.kind in (TaskKind.GEN, TaskKind.SCORE) and task.step == st.step:
                est = self.profiler.estimate(task.kind, gen_cls, task.work) or 0.0
                running.append((max(0.0, start + est - now), task))
        scoring = sum(1 for step, _ in self.scoring_queue if step == st.step)
        pending = len(st.pending)
        if not running:
            return BtsState(pending, GenPhase.IDLE, 0.0, scoring)
        running.sort(key=lambda rt: (rt[0], rt[1].task_id))
        rem, first = running[0]
        for _, task in running[1:]:  # other lanes' work: counted as queued for the single server
            if task.kind == TaskKind.GEN:
                pending += 1
            else:
                scoring += 1
        phase = GenPhase.GEN if first.kind == TaskKind.GEN else GenPhase.SCORE
        return BtsState(pending, phase, rem, scoring)

    # ================================================================================ issuing
    def _issue_gen(self, kind: TaskKind, st: _Step, idx: int, workers: tuple[str, ...], assignment: Assignment,
                   version: int, extra_flags: tuple[str, ...] = ()) -> None:
        m = st.mbs[idx]
        stale = version < st.step
        flags = set(extra_flags)
        if stale:
            flags.add("stale")
            st.stale_samples += len(m.mb.samples)
        m.status, m.stale = MbStatus.GENERATING, stale
        self._gen_futures += 1
        self._submit(kind, st.step, idx, workers, version, assignment, "", flags)

    def _issue_score(self, lane: tuple[str, ...], on_trainer: bool = False) -> None:
        step, idx = self.scoring_queue.popleft()
        m = self.steps[step].mbs[idx]
        m.status = MbStatus.SCORING
        assignment = split_even(m.mb.samples, lane) if on_trainer else self.planner.assign(m.mb, lane, self.config.n)
        self._submit(TaskKind.SCORE, step, idx, self._task_workers(lane, assignment), m.gen_version or 0, assignment,
                     "on the trainer (no live generator)" if on_trainer else "")

    def _issue_update(self, st: _Step, idx: int) -> None:
        m = st.mbs[idx]
        m.status = MbStatus.UPDATING
        flags = {"tsp"} if self.config.tsp.enabled else set()
        assignment = self.planner.update_assignment(m.mb, self.trn_workers)
        self._submit(TaskKind.UPDATE, st.step, idx, self._task_workers(tuple(self.trn_workers), assignment),
                     self.trainer_version, assignment, "", flags)

    def _task_workers(self, workers: tuple[str, ...], assignment: Assignment) -> tuple[str, ...]:
        """The workers a sample task occupies. Colocated: the ranks the plan gives samples to (the others are free,
        and are not counted busy). Disaggregated: the whole lane / trainer pool (sharded trainer ranks run every
        forward together, even without a sample of their own)."""
        if not self.colocated:
            return workers
        given = {w for w, samples in assignment if samples}
        return tuple(w for w in workers if w in given)

    def _submit(self, kind: TaskKind, step: int, mb: int | None, workers: tuple[str, ...], version: int,
                assignment: Assignment, detail: str, flags: set[str] | None = None) -> Task:
        self._task_ids += 1
        m = None if mb is None else self.steps[step].mbs[mb]
        if m is not None and kind in (TaskKind.GEN, TaskKind.TAG_GEN) and m.retries:
            flags = set(flags or ()) | {"retry"}
        task = Task(self._task_ids, kind, step, mb, tuple(workers), version, tuple(assignment),
                    frozenset(flags or ()))
        now = self.executor.now()
        for w in task.workers:
            assert w not in self.busy, f"{w} is busy with task {self.busy.get(w)}"
            self.busy[w] = task.task_id
        self.in_flight[task.task_id] = (task, now)
        st = self.steps.get(step)
        if st is not None and st.first_start is None:
            st.first_start = now
        self.stats.decisions += 1
        self.trace.decide(Decision(now, "issue", step, mb, task.task_id, f"{task.label} v{version} {detail}".strip()))
        self.executor.submit(task)
        return task

    # ================================================================================ completions
    def _on_completion(self, c: Completion) -> None:
        task = c.task
        if self.in_flight.pop(task.task_id, None) is None:
            raise ScheduleError(f"executor reported a completion for task {task.task_id} ({task.label}), "
                                "which is not in flight")
        for w in task.workers:
            if self.busy.get(w) == task.task_id:
                del self.busy[w]
            self.busy_seconds[w] = self.busy_seconds.get(w, 0.0) + c.duration
        if task.kind in (TaskKind.GEN, TaskKind.TAG_GEN):
            self._gen_futures -= 1
        self.trace.record(c)
        if c.ok:
            self.profiler.observe(c, self.config.worker_class(task.workers[0]) if task.kind != TaskKind.SYNC
                                  else self.config.pools[self.config.trainer_pool].worker_class)
            self._on_success(c)
        else:
            self._on_failure(c)

    def _on_success(self, c: Completion) -> None:
        task = c.task
        kind = task.kind
        if kind in (TaskKind.GEN, TaskKind.TAG_GEN):
            st = self.steps[task.step]
            m = st.mbs[task.microbatch]
            m.status, m.gen_version = MbStatus.GENERATED, task.version
            if kind == TaskKind.GEN:
                for w in task.workers:
                    st.gen_tasks[w] = st.gen_tasks.get(w, 0) + 1
            self.scoring_queue.append((task.step, task.microbatch))
        elif kind == TaskKind.SCORE:
            st = self.steps[task.step]
            st.mbs[task.microbatch].status = MbStatus.READY
            st.scored += 1
            st.infos.append(dict(c.info))
            self.update_queue.append((task.step, task.microbatch))
        elif kind == TaskKind.UPDATE:
            st = self.steps[task.step]
            st.mbs[task.microbatch].status = MbStatus.UPDATED
            st.updated += 1
        elif kind == TaskKind.OPT_STEP:
            self._on_opt_step(c)
        elif kind == TaskKind.SYNC and "join" in task.flags:
            self._joined(task)
        elif kind == TaskKind.SYNC:
            self.gen_version = task.version
            self.sync_needed = False
            self._joined(task)
            self._finish_step(task.step, c.end)
        elif kind == TaskKind.CHECKPOINT:
            self._checkpointed = task.step
            self.checkpoint_pending, self._checkpoint_issued = None, False

    def _on_opt_step(self, c: Completion) -> None:
        st = self.steps[c.task.step]
        st.opt_issued = False
        st.opt_done += 1
        if st.opt_done < self.config.mini_batches_per_step:  # a mini-batch's step: the next mini-batch updates
            return
        st.trained_version = c.task.version - 1
        self.trainer_version = c.task.version
        self.last_update = st.step
        if self.colocated:
            self.gen_version = self.trainer_version
            self._finish_step(st.step, c.end)
        else:
            self.sync_needed = True

    def _finish_step(self, step: int, end: float) -> None:
        st = self.steps.pop(step)
        versions: dict[int, int] = {}
        for m in st.mbs:
            assert m.gen_version is not None and m.status == MbStatus.UPDATED
            versions[m.gen_version] = versions.get(m.gen_version, 0) + len(m.mb.samples)
        assert st.trained_version is not None
        self.finished.append(StepResult(step, st.trained_version, end if st.first_start is None else st.first_start,
                                        end, len(st.mbs), st.tags, st.stale_samples, versions, tuple(st.infos),
                                        dict(st.gen_tasks)))
        self.done_steps += 1
        if self.config.is_checkpoint_step(step):
            self.checkpoint_pending = step

    def _on_failure(self, c: Completion) -> None:
        task = c.task
        dead = set(c.dead_workers) - self.dead
        now = self.executor.now()
        if dead:
            self.dead |= dead
            self.joining = [w for w in self.joining if w not in dead]
            self.retiring -= dead
            self.trace.decide(Decision(now, "dead", task.step, task.microbatch, task.task_id,
                                       f"workers {sorted(dead)} lost: {c.info.get('reason', '')}".strip()))
            if dead & set(self.trn_workers):
                raise self._error(f"trainer worker(s) {sorted(dead & set(self.trn_workers))} died during "
                                  f"{task.label} (id {task.task_id}); accumulated gradients are lost", task)
            self._lanes = self._cut_lanes()
        elif task.microbatch is not None and task.kind in (TaskKind.GEN, TaskKind.TAG_GEN, TaskKind.SCORE):
            # the workers are alive but the task raised (a bug, a bad reward function...): retrying the
            # same work forever would hang the run, so a micro-batch gets MAX_TASK_RETRIES attempts
            m = self.steps[task.step].mbs[task.microbatch]
            m.errors += 1
            if m.errors > MAX_TASK_RETRIES:
                raise self._error(f"{task.label} (id {task.task_id}) failed {m.errors} times on live workers "
                                  f"{', '.join(task.workers)}; last error: {c.info.get('reason', 'no reason given')}",
                                  task)
        if task.kind in (TaskKind.GEN, TaskKind.TAG_GEN) or (task.kind == TaskKind.SCORE and c.info.get("data_lost")):
            self._requeue_generation(task)
        elif task.kind == TaskKind.SCORE:
            st = self.steps[task.step]
            st.mbs[task.microbatch].status = MbStatus.GENERATED
            self.scoring_queue.appendleft((task.step, task.microbatch))
            self.trace.decide(Decision(now, "retry", task.step, task.microbatch, task.task_id, "score again"))
        elif task.kind == TaskKind.SYNC and dead and "join" in task.flags:  # the others join at the next try
            self.trace.decide(Decision(now, "retry", task.step, None, task.task_id, "join without the dead"))
        elif task.kind == TaskKind.SYNC and dead:  # only generators died (trainers raised above)
            self.trace.decide(Decision(now, "retry", task.step, None, task.task_id, "sync to live generators"))
        else:
            raise self._error(f"{task.label} (id {task.task_id}) failed on workers {', '.join(task.workers)}: "
                              f"{c.info.get('reason', 'no reason given')}", task)

    def _requeue_generation(self, task: Task) -> None:
        st = self.steps[task.step]
        m = st.mbs[task.microbatch]
        if m.stale:
            st.stale_samples -= len(m.mb.samples)
        if task.kind == TaskKind.TAG_GEN:
            st.tags -= 1
        m.status, m.stale, m.gen_version = MbStatus.PENDING, False, None
        m.retries += 1
        st.pending.appendleft(task.microbatch)
        st.pending = deque(sorted(st.pending))
        self.trace.decide(Decision(self.executor.now(), "retry", task.step, task.microbatch, task.task_id,
                                   f"{task.label} re-queued"))

    # ================================================================================ errors
    def _error(self, message: str, task: Task | None) -> ScheduleError:
        return ScheduleError(message + "\n" + self.dump_schedule(task))

    def dump_schedule(self, failing: Task | None = None, context_steps: int = 1) -> str:
        """The schedule (text form) of the steps around ``failing``, in-flight tasks included."""
        lo = hi = None
        if failing is not None:
            lo, hi = failing.step - context_steps, failing.step + context_steps
        lines = []
        rows: list[tuple[float, int, str]] = []
        for c in self.trace.completions:
            if lo is None or lo <= c.task.step <= hi:
                rows.append((c.start, c.task.task_id, format_action(c)))
        for task, start in self.in_flight.values():
            if lo is None or lo <= task.step <= hi:
                mark = "  <-- ERROR HERE" if failing is not None and task.task_id == failing.task_id else ""
                rows.append((start, task.task_id, f"{start:.3f} ... {task.label} v{task.version} "
                                                  f"{','.join(task.workers)} running{mark}"))
        for _, tid, text in sorted(rows):
            if failing is not None and tid == failing.task_id and "ERROR HERE" not in text:
                text += "  <-- ERROR HERE"
            lines.append(text)
        return "schedule around the failure:\n" + "\n".join(lines)
