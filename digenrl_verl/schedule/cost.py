"""Online cost profiling: running mean of measured durations per (task kind, worker class).

Durations are normalised by ``Task.work`` (the largest per-worker sample count), so a GEN of 3 samples
per rank and one of 2 samples per rank feed the same per-sample estimate. Heterogeneous pools have
different worker classes and therefore separate estimates. As in the paper the profile starts empty
and learns from the run itself; ``seed`` lets a resumed run start from a saved profile, ``seed_floor`` from a
lower bound that the first measurement replaces.

**What g' (TAG_GEN) measures.** A completion's duration is ``end - start`` as the executor reports it: in the Ray
executor (`trainer.ray_executor`) ``start`` is taken when the TAG task's calls are launched and ``end`` when its last
result is ready, so everything the trainer ranks do inside the task counts, and in the simulator a TAG on
verl-omni's hybrid engine lasts its switch (wake-up, weight sync, sleep) plus its generation
(`sim.executor.SimExecutor`). A real hybrid-engine TAG whose switch runs inside the task's calls is therefore measured
with its switch, and BTS's g' includes it; a switch run outside the task (e.g. by the driver's process between two
tasks) would not be, and BTS would under-estimate g' (`tests/sim/test_sim_hybrid_tag_on_cpu.py` shows the decisions
that changes). The switch is a fixed per-task cost divided here by ``Task.work`` like the rest: exact while TAG
micro-batches have one size (GAP: one prompt group over the trainer ranks), proportional otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl_verl.schedule.types import Completion, TaskKind


@dataclass
class _Mean:
    count: int = 0
    mean: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.mean += (value - self.mean) / self.count


class CostProfiler:
    """Running mean of per-unit durations, keyed by (kind, worker class).

    The worker class of a task is the class of its first worker for single-pool tasks; SYNC spans both
    pools and is keyed by the trainer class.
    """

    def __init__(self) -> None:
        self._means: dict[tuple[TaskKind, str], _Mean] = {}

    def observe(self, completion: Completion, worker_class: str) -> None:
        """Record a successful completion (failed ones say nothing about the cost)."""
        if not completion.ok:
            return
        task = completion.task
        key = (task.kind, worker_class)
        self._means.setdefault(key, _Mean()).add(completion.duration / task.work)

    def seed(self, kind: TaskKind, worker_class: str, unit_cost: float, count: int = 1) -> None:
        """Start an estimate from a known per-unit cost (e.g. a saved profile)."""
        self._means[(kind, worker_class)] = _Mean(count, float(unit_cost))

    def seed_floor(self, kind: TaskKind, worker_class: str, unit_cost: float) -> None:
        """Start an estimate from a lower bound, not a measurement: it is the estimate until the first measurement
        replaces it, and `is_floor` says so meanwhile (BTS then decides ties for skip, `schedule.tag.BtsTag`). E.g.
        g' on verl-omni's hybrid engine is at least the engine switch, which can be timed before any TAG."""
        self._means[(kind, worker_class)] = _Mean(0, float(unit_cost))

    def is_floor(self, kind: TaskKind, worker_class: str) -> bool:
        """Whether the estimate is a `seed_floor` lower bound that nothing has measured yet."""
        entry = self._means.get((kind, worker_class))
        return entry is not None and entry.count == 0

    def unit_cost(self, kind: TaskKind, worker_class: str) -> float | None:
        """Mean per-unit duration, or None if never measured."""
        entry = self._means.get((kind, worker_class))
        return entry.mean if entry else None

    def estimate(self, kind: TaskKind, worker_class: str, work: int = 1) -> float | None:
        unit = self.unit_cost(kind, worker_class)
        return None if unit is None else unit * work

    def count(self, kind: TaskKind, worker_class: str) -> int:
        entry = self._means.get((kind, worker_class))
        return entry.count if entry else 0

    def snapshot(self) -> dict[str, float]:
        """``{"GEN@H800": unit_cost, ...}`` for logging and for saving with a checkpoint."""
        return {f"{k.value}@{cls}": m.mean for (k, cls), m in sorted(self._means.items(),
                                                                     key=lambda kv: (kv[0][0].value, kv[0][1]))}
