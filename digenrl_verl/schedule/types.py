"""The vocabulary shared by the scheduler and every executor: task kinds, tasks, completions.

A *worker* is one rank, named ``"<pool>:<index>"``: ``"gen:0"`` (generator pool), ``"trn:1"`` (trainer
pool) or ``"col:3"`` (colocated pool). Its *worker class* (the pool's accelerator type, e.g. ``"H800"``)
keys the cost model, so heterogeneous pools are profiled separately.

Samples of a global step are numbered ``0 .. prompts_per_step * n - 1``; sample ``i`` is prompt ``i // n``,
rollout index ``i % n``. A task's ``assignment`` says which samples each of its workers handles, so an
executor needs nothing else to move data.

Example (what the driver hands an executor)::

    >>> t = Task(task_id=7, kind=TaskKind.GEN, step=0, microbatch=3, workers=("gen:0", "gen:1"),
    ...          version=0, assignment=(("gen:0", (12, 13)), ("gen:1", (14, 15))))
    >>> t.samples
    (12, 13, 14, 15)
    >>> t.work
    2
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable


class TaskKind(str, enum.Enum):
    """What a task does. The value is the short name used in traces and the text form."""

    GEN = "GEN"
    """Generator rank(s) sample trajectories of one micro-batch with the generator's policy version."""
    TAG_GEN = "TAG"
    """Trainer ranks sample trajectories of one micro-batch (trainer-assisted generation)."""
    SCORE = "SCORE"
    """Reward of one generated micro-batch, on the generator pool (TAG output is scored there too)."""
    UPDATE = "UPDATE"
    """One micro-batch forward/backward on the trainer ranks; gradients accumulate until OPT_STEP."""
    OPT_STEP = "OPT"
    """One optimizer step on the trainer ranks, once every micro-batch of the global step is updated."""
    SYNC = "SYNC"
    """Weights trainer -> generators; afterwards the generators hold ``task.version``."""
    CHECKPOINT = "CKPT"
    """Save the trainer state of version ``task.version`` (after global step ``task.step``) on the trainer ranks.

    Issued at a checkpoint barrier (``ScheduleConfig.checkpoint_every``) once the step's SYNC (colocated: its
    OPT_STEP) ended; nothing of step ``task.step + 1`` starts before it ends, so the saved state is drained."""


SAMPLE_KINDS = frozenset({TaskKind.GEN, TaskKind.TAG_GEN, TaskKind.SCORE, TaskKind.UPDATE})
"""Kinds whose tasks carry samples (an assignment with sample indices)."""

Assignment = tuple[tuple[str, tuple[int, ...]], ...]
"""((worker_id, sample indices), ...), in the order of ``Task.workers``."""


def parse_worker(worker_id: str) -> tuple[str, int]:
    """(pool, rank) of a worker id: ``"gen:3"`` -> ``("gen", 3)``. The one place that reads the id's form."""
    pool, sep, index = worker_id.partition(":")
    if not sep or not index.isdigit():
        raise ValueError(f"worker id {worker_id!r} is not of the form '<pool>:<index>' (e.g. 'gen:0')")
    return pool, int(index)


def worker_pool(worker_id: str) -> str:
    """The pool part of a worker id: ``"gen:3"`` -> ``"gen"``."""
    return parse_worker(worker_id)[0]


def worker_rank(worker_id: str) -> int:
    """The rank part of a worker id: ``"gen:3"`` -> ``3``."""
    return parse_worker(worker_id)[1]


@dataclass(frozen=True)
class Task:
    """One unit of work issued by the driver.

    Attributes:
        task_id: unique per driver run, increasing in issue order.
        kind: what to do.
        step: global step of the data (for SYNC/OPT_STEP/CHECKPOINT: the step they close).
        microbatch: micro-batch index within the step; ``None`` for OPT_STEP, SYNC and CHECKPOINT.
        workers: the worker ids that run it together (all of them are busy until it completes).
        version: the policy version used: weights version for GEN/TAG_GEN/UPDATE, the version the
            generators hold after a SYNC, the version produced by an OPT_STEP, the version a CHECKPOINT saves.
        assignment: sample indices per worker (empty tuples for OPT_STEP/SYNC/CHECKPOINT).
        flags: free-form markers for the executor: ``"tsp"`` (run the update with time-step
            parallelism), ``"stale"`` (generated with version < step), ``"probe"`` (first TAG,
            measuring trainer-side generation), ``"retry"`` (re-issued after a failure).
    """

    task_id: int
    kind: TaskKind
    step: int
    microbatch: int | None
    workers: tuple[str, ...]
    version: int
    assignment: Assignment = ()
    flags: frozenset[str] = field(default_factory=frozenset)

    @property
    def samples(self) -> tuple[int, ...]:
        """All sample indices of the task, in assignment order."""
        return tuple(i for _, idx in self.assignment for i in idx)

    @property
    def work(self) -> int:
        """Cost units: the largest per-worker sample count (1 for tasks without samples).

        Workers of a task run in lock-step, so the slowest (most loaded) one sets the duration.
        The cost profiler divides measured durations by this to get a per-unit cost.
        """
        if self.kind not in SAMPLE_KINDS:
            return 1
        return max((len(idx) for _, idx in self.assignment), default=1) or 1

    @property
    def label(self) -> str:
        """Short human-readable name, e.g. ``GEN s0 m3``."""
        mb = "-" if self.microbatch is None else str(self.microbatch)
        return f"{self.kind.value} s{self.step} m{mb}"


@dataclass(frozen=True)
class Completion:
    """What an executor reports when a task ends.

    Attributes:
        task: the task as submitted.
        start, end: executor clock (seconds) when it started and ended.
        ok: False if the task failed; its outputs must then be considered lost.
        info: executor facts. Keys the driver reads: ``"dead_workers"`` (tuple of worker ids that
            are gone for good), ``"reason"`` (str). Anything else (e.g. ``"reward_mean"``) is kept
            in the trace and in the step result.
    """

    task: Task
    start: float
    end: float
    ok: bool = True
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def dead_workers(self) -> tuple[str, ...]:
        return tuple(self.info.get("dead_workers", ()))


@runtime_checkable
class Executor(Protocol):
    """Runs tasks. Implemented by the simulator (virtual clock) and by the Ray runtime.

    The driver never blocks inside ``submit``; it learns about progress only through ``wait_any``.
    """

    def now(self) -> float:
        """The executor's clock in seconds (virtual in the simulator, wall time on Ray)."""
        ...

    def submit(self, task: Task) -> None:
        """Start ``task`` on ``task.workers`` without waiting for it."""
        ...

    def wait_any(self, timeout: float | None) -> list[Completion]:
        """Block until at least one submitted task completes, or ``timeout`` seconds pass.

        Returns the completions (possibly several that ended together); an empty list only on timeout.
        """
        ...


class ScheduleError(RuntimeError):
    """The schedule cannot continue (a trainer task failed, a task timed out, no live worker left)."""
