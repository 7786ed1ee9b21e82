"""The elastic generator pool on Ray: replacements for dead generators, grow and shrink between steps.

The schedule's side is pure (`schedule.driver.WorkerEvent`: ids only); this is the Ray side (docs/elastic.md):

- `GeneratorSupervisor` starts generator actors through a callback of the runner (a replacement goes into the dead
  actor's placement-group bundle, a rank beyond the pool's into a placement group of its own), has each join the
  weight sync with a new *epoch* (trainer rank 0 is told first, `TrainerWorker.expect_generator`, so its next
  send to that rank builds a fresh pair group; `weights.sync`), and reports it ``added`` once it answered its
  join: the driver then sends it the current weights (a ``join`` SYNC) and gives it tasks. It counts restarts per
  rank: a rank that died more than ``trainer.digenrl.pools.generator.max_restarts`` times is dropped, with a
  message, and the run goes on without it. `resize` grows (new ranks) or shrinks (``removed`` events for the
  highest ranks; the driver lets a running task finish) the pool; `release` stops what the driver has removed.
- `ElasticRayExecutor`: the Ray executor that reports dead generators to the supervisor and hands the
  supervisor's events to the driver (`poll_events`, the driver's `EventSource`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import ray
from ray.exceptions import RayActorError

from digenrl_verl.schedule.driver import WorkerEvent
from digenrl_verl.schedule.types import Completion, Task, worker_pool, worker_rank
from digenrl_verl.trainer.ray_executor import RayExecutor
from digenrl_verl.weights.sync import CollectiveSpec

GEN_POOL = "gen"
MAX_RESTARTS_KEY = "trainer.digenrl.pools.generator.max_restarts"


@dataclass
class _Starting:
    actor: Any
    joined: Any  # the ref of its `join` call
    epoch: int
    reason: str


class GeneratorSupervisor:
    """Starts, counts and stops generator actors (see the module docstring).

    Args:
        workers: worker id -> actor handle, the runner's table (updated in place when a new actor joined).
        start_actor: rank -> a new generator actor for that rank (placed by the runner).
        trainer0: trainer rank 0's actor (told the epoch of each new generator before its first SYNC).
        spec: the weight sync's rendezvous, given to every new generator's `join`.
        max_restarts: replacements per rank before the rank is dropped.
        stop_actor: (rank, actor) -> None, stops an actor and frees its placement when it has one of its own.
    """

    def __init__(self, workers: dict[str, Any], start_actor: Callable[[int], Any], trainer0: Any,
                 spec: CollectiveSpec, max_restarts: int, stop_actor: Callable[[int, Any], None]) -> None:
        self.workers = workers
        self.start_actor = start_actor
        self.trainer0 = trainer0
        self.spec = spec
        self.max_restarts = max_restarts
        self.stop_actor = stop_actor
        self.epochs = {worker_rank(w): 0 for w in workers if worker_pool(w) == GEN_POOL}
        self.restarts: dict[str, int] = {}
        self.starting: dict[str, _Starting] = {}
        self.dropped: set[str] = set()
        self.events: list[WorkerEvent] = []
        self.messages: list[str] = []

    # -- deaths ---------------------------------------------------------------------------------
    def on_dead(self, worker: str) -> None:
        """`worker` died: start a replacement, or drop it once it used up its restarts."""
        if worker in self.starting or worker in self.dropped:
            return
        used = self.restarts.get(worker, 0)
        if used >= self.max_restarts:
            self.dropped.add(worker)
            message = (f"digenrl: generator {worker} died {used + 1} time(s); dropped after {used} restart(s) "
                       f"({MAX_RESTARTS_KEY}={self.max_restarts}); the run goes on without it")
            print(message, file=sys.stderr)
            self.messages.append(message)
            self.events.append(WorkerEvent("removed", worker, f"dropped: died {used + 1} time(s), "
                                                              f"{MAX_RESTARTS_KEY}={self.max_restarts}"))
            return
        self.restarts[worker] = used + 1
        self._start(worker, f"restart {used + 1}/{self.max_restarts}")

    def _start(self, worker: str, reason: str) -> None:
        rank = worker_rank(worker)
        epoch = self.epochs[rank] + 1 if rank in self.epochs else 0
        self.epochs[rank] = epoch
        self.trainer0.expect_generator.remote(rank, epoch)  # runs before any later call on trainer rank 0
        actor = self.start_actor(rank)
        self.starting[worker] = _Starting(actor, actor.join.remote(self.spec, epoch), epoch, reason)

    # -- grow / shrink --------------------------------------------------------------------------
    def resize(self, count: int, members: Iterable[str]) -> list[WorkerEvent]:
        """Aim at `count` generators. `members`: the driver's generators (live or joining). Grows by starting new
        ranks (the lowest free ones); shrinks by cancelling starting actors, then by ``removed`` events for the
        highest live ranks (returned: the runner posts them to the driver)."""
        current = sorted(set(members) | set(self.starting), key=worker_rank)
        if count > len(current):
            taken = {worker_rank(w) for w in current}
            free = (r for r in range(count + len(taken)) if r not in taken)
            for _, rank in zip(range(count - len(current)), free):
                worker = f"{GEN_POOL}:{rank}"
                self.dropped.discard(worker)
                self._start(worker, f"grow to {count}")
            return []
        out = []
        for worker in reversed(current[count:]):
            start = self.starting.pop(worker, None)
            if start is not None:
                self.stop_actor(worker_rank(worker), start.actor)
            else:
                out.append(WorkerEvent("removed", worker, f"shrink to {count}"))
        return out

    # -- polling --------------------------------------------------------------------------------
    def poll(self) -> list[WorkerEvent]:
        """Events since the last poll: ``added`` for each new actor that joined, ``removed`` for dropped ranks."""
        for worker, start in list(self.starting.items()):
            ready, _ = ray.wait([start.joined], timeout=0)
            if not ready:
                continue
            del self.starting[worker]
            try:
                ray.get(start.joined)
            except RayActorError:  # died while starting: one more death of the rank
                self.on_dead(worker)
                continue
            self.workers[worker] = start.actor
            self.events.append(WorkerEvent("added", worker, f"({start.reason}, epoch {start.epoch})"))
        out, self.events = self.events, []
        return out

    def release(self, removed: Iterable[str]) -> None:
        """Stop the actors of workers the driver removed (they run nothing any more)."""
        for worker in sorted(removed):
            actor = self.workers.pop(worker, None)
            if actor is not None:
                self.stop_actor(worker_rank(worker), actor)

    def pending(self) -> list[str]:
        return sorted(self.starting, key=worker_rank)


class ElasticRayExecutor(RayExecutor):
    """`RayExecutor` + the elastic pool: dead generators go to the supervisor, its events to the driver.

    A death is reported once per actor: a failure of a task submitted before the worker's current actor joined
    is about the actor it replaced."""

    def __init__(self, workers: Mapping[str, Any], *args: Any, supervisor: GeneratorSupervisor, **kwargs: Any) -> None:
        super().__init__(workers, *args, **kwargs)
        self.supervisor = supervisor
        self.last_task_id = 0
        self.joined_after: dict[str, int] = {}  # worker -> the last task id submitted before its actor joined

    def submit(self, task: Task) -> None:
        self.last_task_id = task.task_id
        super().submit(task)

    def wait_any(self, timeout: float | None) -> list[Completion]:
        out = super().wait_any(timeout)
        for c in out:
            for w in c.dead_workers:
                if worker_pool(w) == GEN_POOL and c.task.task_id > self.joined_after.get(w, 0):
                    self.supervisor.on_dead(w)
        return out

    def poll_events(self) -> list[WorkerEvent]:
        events = self.supervisor.poll()
        for e in events:
            if e.kind == "added":
                self.workers[e.worker] = self.supervisor.workers[e.worker]
                self.joined_after[e.worker] = self.last_task_id
        return events
