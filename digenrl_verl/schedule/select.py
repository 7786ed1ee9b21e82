"""Worker (lane) selection: which free generator lane takes the next task.

The driver asks the selector to order the free lanes each time it dispatches; the first lanes in that
order get the SCORE/GEN tasks that are ready. Selection must be deterministic (same completions, same
decisions on Ray and in the simulator).

To add a selector: subclass `LaneSelector`, implement ``order``, and add it to ``SELECTORS``.
"""

from __future__ import annotations

import abc
from typing import Mapping, Sequence

Lane = tuple[str, ...]


class LaneSelector(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def order(self, free: Sequence[Lane], busy_seconds: Mapping[str, float]) -> list[Lane]:
        """The free lanes, best first. ``busy_seconds``: time each worker has spent on tasks so far."""


class FirstFree(LaneSelector):
    """Lanes in rank order (the default; with identical lanes nothing better exists)."""

    name = "first_free"

    def order(self, free: Sequence[Lane], busy_seconds: Mapping[str, float]) -> list[Lane]:
        return list(free)


class LeastBusy(LaneSelector):
    """The lane whose ranks have worked least first (spreads load when lanes differ in width)."""

    name = "least_busy"

    def order(self, free: Sequence[Lane], busy_seconds: Mapping[str, float]) -> list[Lane]:
        return sorted(free, key=lambda lane: (max(busy_seconds.get(w, 0.0) for w in lane), lane))


SELECTORS: dict[str, type[LaneSelector]] = {FirstFree.name: FirstFree, LeastBusy.name: LeastBusy}


def make_selector(name: str) -> LaneSelector:
    try:
        return SELECTORS[name]()
    except KeyError:
        raise ValueError(f"unknown lane selector {name!r}; valid names: {sorted(SELECTORS)}") from None
