"""Online cost profiling: running mean of measured durations per (task kind, worker class).

Durations are normalised by ``Task.work`` (the largest per-worker sample count), so a GEN of 3 samples
per rank and one of 2 samples per rank feed the same per-sample estimate. Heterogeneous pools have
different worker classes and therefore separate estimates. As in the paper the profile starts empty
and learns from the run itself; ``seed`` lets a resumed run start from a saved profile.
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
