"""`SimExecutor`: the `Executor` protocol on a virtual clock.

A task lasts ``profile.unit(kind) * task.work / speed(worker class)`` seconds, times an optional seeded
jitter factor ``max(0.05, 1 + jitter * N(0, 1))`` drawn from (seed, kind, step, micro-batch, workers), so
a run is reproducible and the same task gets the same duration however tasks are numbered. SYNC spans
both pools and runs at the slowest of its workers' speeds. A CHECKPOINT writes to disk: ``profile.checkpoint``
seconds whatever the accelerator's speed.

A TAG task on verl-omni's hybrid engine (a profile with ``tag_switch``, `sim.profiles.HybridEngine`) lasts its
generation as above plus the engine switch (wake-up, weight sync, sleep: bandwidth-bound, so not divided by the
speed), all times the same jitter factor. The switch is inside the task, as a real executor's TAG task would run it,
so the driver's profiler measures it as part of g' (`schedule.cost`). Its completion's ``info`` says so:
``engine="hybrid"``, ``switch_s`` (the three switch phases together) and ``phases`` ((name, seconds) in order:
wake, sync, generate, sleep; they sum to the duration), which the trace draws as sub-spans.

Fault injection (``Fault``):

* ``fail``: the matching task ends at its normal time with ``ok=False`` (workers stay alive);
* ``lose``: like ``fail``, and ``info["data_lost"]`` says its input trajectories are gone (a SCORE
  then makes the driver generate the micro-batch again);
* ``kill``: a worker dies at ``at`` seconds, or part-way (``fraction``) through the matching task; every
  task running on it ends then with ``ok=False`` and ``info["dead_workers"]``; later tasks that include
  it fail at once;
* ``hang``: the matching task never completes (to exercise the driver's timeout).

A fault matches the ``occurrence``-th submitted task with the given kind / step / microbatch / worker
(``None`` matches anything); ``occurrence=None`` matches every such task (e.g. a micro-batch whose
generation always raises).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from digenrl_verl.schedule.types import Completion, Task, TaskKind, worker_pool
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.profiles import CostProfile

FAULT_KINDS = ("fail", "lose", "kill", "hang")


@dataclass(frozen=True)
class Fault:
    """One injected fault (see the module docstring)."""

    action: str
    task_kind: TaskKind | None = None
    step: int | None = None
    microbatch: int | None = None
    worker: str | None = None
    occurrence: int | None = 1
    at: float | None = None
    fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.action not in FAULT_KINDS:
            raise ValueError(f"Fault.action={self.action!r} is invalid: use one of {list(FAULT_KINDS)}")
        if self.action == "kill" and self.worker is None:
            raise ValueError("Fault(action='kill') needs the worker that dies")
        if self.occurrence is not None and (isinstance(self.occurrence, bool) or self.occurrence < 1):
            raise ValueError(f"Fault.occurrence={self.occurrence!r} is invalid: use an integer >= 1, "
                             "or None for every matching task")

    def matches(self, task: Task) -> bool:
        return ((self.task_kind is None or task.kind == self.task_kind)
                and (self.step is None or task.step == self.step)
                and (self.microbatch is None or task.microbatch == self.microbatch)
                and (self.worker is None or self.worker in task.workers))


@dataclass
class _Running:
    task: Task
    start: float
    end: float
    ok: bool = True
    info: dict[str, Any] = field(default_factory=dict)


class SimExecutor:
    """Virtual-clock executor driven by a cost profile and a cluster spec."""

    def __init__(self, cluster: ClusterSpec, profile: CostProfile, *, jitter: float = 0.0, seed: int = 0,
                 faults: tuple[Fault, ...] = (), start_time: float = 0.0) -> None:
        if jitter < 0:
            raise ValueError(f"jitter={jitter} must be >= 0")
        self.cluster = cluster
        self.profile = profile
        self.jitter = jitter
        self.seed = seed
        self.faults = list(faults)
        self._seen = [0] * len(self.faults)
        self._now = start_time
        self._heap: list[tuple[float, int]] = []
        self._running: dict[int, _Running] = {}
        self.dead: set[str] = set()
        self._kills: list[tuple[float, str]] = sorted((f.at, f.worker) for f in self.faults
                                                      if f.action == "kill" and f.at is not None)
        self.submitted: list[Task] = []

    # -- Executor protocol --------------------------------------------------------------------------
    def now(self) -> float:
        return self._now

    def submit(self, task: Task) -> None:
        self.submitted.append(task)
        run = _Running(task, self._now, self._now + self.duration(task), info=self._switch_info(task))
        dead = [w for w in task.workers if w in self.dead]
        if dead:
            run.end, run.ok, run.info = self._now, False, {"dead_workers": tuple(dead), "reason": "worker is dead"}
        else:
            self._apply_faults(run)
        self._running[task.task_id] = run
        if run.end != float("inf"):
            heapq.heappush(self._heap, (run.end, task.task_id))

    def wait_any(self, timeout: float | None) -> list[Completion]:
        self._drop_stale()
        next_end = self._heap[0][0] if self._heap else float("inf")
        if self._kills and self._kills[0][0] <= next_end:
            self._kill(*self._kills.pop(0))
            return self.wait_any(timeout)
        if next_end == float("inf"):
            if timeout is None:
                raise RuntimeError("SimExecutor.wait_any: nothing can complete (every task hangs or none runs)")
            self._now += timeout
            return []
        if timeout is not None and next_end > self._now + timeout:
            self._now += timeout
            return []
        self._now = max(self._now, next_end)
        out = []
        while self._heap and self._heap[0][0] <= next_end:
            _, tid = heapq.heappop(self._heap)
            run = self._running.pop(tid, None)
            if run is not None and run.end == next_end:
                out.append(Completion(run.task, run.start, run.end, run.ok, dict(run.info)))
            elif run is not None:  # rescheduled by a kill: keep it
                self._running[tid] = run
        return sorted(out, key=lambda c: c.task.task_id)

    # -- costs and faults ---------------------------------------------------------------------------
    def duration(self, task: Task) -> float:
        """Modelled duration of ``task`` (deterministic for a given seed and task id)."""
        base = self._compute_seconds(task)
        if self._switched(task):
            base += self.profile.tag_switch_s
        if self.jitter:
            base *= self._jitter_factor(task)
        return base

    def _compute_seconds(self, task: Task) -> float:
        speeds = [self.cluster.speed(self._class_of(w)) for w in task.workers]
        speed = 1.0 if task.kind == TaskKind.CHECKPOINT else min(speeds)
        return self.profile.unit(task.kind, tsp="tsp" in task.flags) * task.work / speed

    def _jitter_factor(self, task: Task) -> float:
        rng = random.Random(f"{self.seed}:{task.kind.value}:{task.step}:{task.microbatch}:{','.join(task.workers)}")
        return max(0.05, 1.0 + self.jitter * rng.gauss(0.0, 1.0))

    def _switched(self, task: Task) -> bool:
        """A TAG task on the hybrid engine (it pays the engine switch)."""
        return task.kind == TaskKind.TAG_GEN and self.profile.tag_switch is not None

    def _switch_info(self, task: Task) -> dict[str, Any]:
        """The completion facts of a hybrid-engine TAG (see the module docstring); empty for every other task."""
        switch = self.profile.tag_switch
        if switch is None or not self._switched(task):
            return {}
        factor = self._jitter_factor(task) if self.jitter else 1.0
        phases = switch.phases(self._compute_seconds(task), factor)
        return {"engine": "hybrid", "switch_s": switch.total_s * factor, "phases": phases}

    def _class_of(self, worker: str) -> str:
        return self.cluster.pools[worker_pool(worker)].worker_class

    def _apply_faults(self, run: _Running) -> None:
        for i, fault in enumerate(self.faults):
            if fault.action == "kill" and fault.at is not None:
                continue
            if not fault.matches(run.task):
                continue
            self._seen[i] += 1
            if fault.occurrence is not None and self._seen[i] != fault.occurrence:
                continue
            if fault.action in ("fail", "lose"):
                run.ok, run.info = False, {"reason": "injected failure"}
                if fault.action == "lose":
                    run.info["data_lost"] = True
            elif fault.action == "hang":
                run.end = float("inf")
            else:
                at = run.start + fault.fraction * (run.end - run.start)
                self._kills.append((at, fault.worker))  # type: ignore[arg-type]
                self._kills.sort()

    def _kill(self, at: float, worker: str) -> None:
        self._now = max(self._now, at)
        self.dead.add(worker)
        for tid, run in self._running.items():
            if worker in run.task.workers and run.ok and run.end > at:
                run.end, run.ok = at, False
                run.info = {"dead_workers": (worker,), "reason": f"{worker} died at {at:.3f}"}
                heapq.heappush(self._heap, (at, tid))

    def _drop_stale(self) -> None:
        while self._heap:
            end, tid = self._heap[0]
            run = self._running.get(tid)
            if run is not None and run.end == end:
                return
            heapq.heappop(self._heap)
