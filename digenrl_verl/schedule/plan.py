"""Micro-batch plans: how one global step's samples are cut into pipeline units, and who runs them.

Three planners, each a pure function of (prompts, n, ranks) and its own parameters; `planner_for(config)` picks
the one a `ScheduleConfig` runs (the driver, hence the Ray runtime and the simulator, use it):

* **GAP** (generation-axis pipeline, the paper's Fig. 5b): a micro-batch is *one prompt group*; its n
  samples are spread over a *lane* of generator ranks, so a complete group (all a GRPO advantage needs)
  is ready after ``ceil(n / lane_width)`` samples of generation instead of ``n``. Pipeline units per
  step = prompts.
* **Batch-axis** (the baseline, Fig. 5a): each rank owns whole groups; a micro-batch is one group per
  rank, run together. Pipeline units per step = ``ceil(prompts / ranks)``.
* **Colocated** (verl-omni's layout, every colocated run): the step's ``prompts * n`` samples are cut into
  contiguous per-rank shares (verl's data-parallel split of the batch, sizes differing by at most one), and
  each share into chunks of ``micro_batch_size`` samples (``ppo_micro_batch_size_per_gpu``; None: the whole
  share). Micro-batch ``i`` is the ``i``-th chunk of every rank, run together, so every rank is busy in every
  micro-batch but (when the shares do not divide evenly) the last ones. A micro-batch may cut prompt groups:
  colocated updates wait for the whole scored batch (advantages need whole groups). Units per step =
  ``ceil(ceil(prompts * n / ranks) / micro_batch_size)``. The plan's per-rank split is part of the
  micro-batch (`MicroBatch.split`), so generation, scoring and update of a micro-batch run on the same ranks.

Fig. 5's example, 2 GPUs and 4 prompts x 2 samples::

    >>> len(GapPlanner().microbatches(step=0, prompts=4, n=2, ranks=2))
    4
    >>> len(BatchAxisPlanner().microbatches(step=0, prompts=4, n=2, ranks=2))
    2

The 32-rank FLUX recipe (32 prompts x 16, ``ppo_micro_batch_size_per_gpu=8``): 2 micro-batches of 8 samples on
each of the 32 ranks::

    >>> mbs = ColocatedPlanner(8).microbatches(step=0, prompts=32, n=16, ranks=32)
    >>> len(mbs), {len(s) for s in mbs[0].split}, len(mbs[0].split)
    (2, {8}, 32)

Uneven sizes:

* ``n`` not a multiple of the lane width: the group is cut into contiguous chunks whose sizes differ by
  at most one sample (the first ``n % width`` ranks get one more); the task lasts as long as its
  largest chunk, which ``Task.work`` reports.
* ``n < ranks`` (GAP): the pool is cut into ``ceil(ranks / n)`` lanes of at most ``n`` ranks (widths
  differ by at most one), each running its own group, so no rank of a lane is ever left without a
  sample and several groups are generated at once.
* ``prompts`` not a multiple of ``ranks`` (batch-axis): the last micro-batch has fewer groups; ranks
  without a group are left out of that task.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence

from digenrl_verl.schedule.config import ScheduleConfig, minibatch_groups
from digenrl_verl.schedule.types import Assignment


@dataclass(frozen=True)
class MicroBatch:
    """One pipeline unit of a global step.

    Attributes:
        step: global step.
        index: micro-batch index within the step, ``0 .. B-1``.
        prompts: prompt indices the samples belong to (GAP and batch-axis: whole groups only, so group statistics
            need nothing else; colocated: possibly parts of groups).
        samples: sample indices (GAP and batch-axis: ``prompt * n + j`` for each prompt and ``j < n``), ascending.
        split: the plan's per-rank split, rank ``r``'s samples at position ``r`` (colocated plan); empty: the
            planner cuts ``samples`` over whichever ranks run the micro-batch.
        minibatch: the mini-batch (optimizer step of the global step) it belongs to (`step_microbatches`).
    """

    step: int
    index: int
    prompts: tuple[int, ...]
    samples: tuple[int, ...]
    split: tuple[tuple[int, ...], ...] = ()
    minibatch: int = 0

    def __post_init__(self) -> None:
        if self.split and sorted(s for part in self.split for s in part) != list(self.samples):
            raise ValueError(f"micro-batch {self.index} of step {self.step}: its split {self.split} does not hold "
                             f"exactly its samples {self.samples}")


def split_even(items: Sequence[int], workers: Sequence[str]) -> Assignment:
    """Contiguous chunks of ``items`` over ``workers``, sizes differing by at most one.

    Workers that would get nothing are left out (only happens when there are more workers than items).

        >>> split_even([0, 1, 2, 3, 4], ["a", "b"])
        (('a', (0, 1, 2)), ('b', (3, 4)))
    """
    if not workers:
        raise ValueError("split_even needs at least one worker")
    base, extra = divmod(len(items), len(workers))
    out: list[tuple[str, tuple[int, ...]]] = []
    pos = 0
    for rank, worker in enumerate(workers):
        size = base + (1 if rank < extra else 0)
        if size:
            out.append((worker, tuple(items[pos:pos + size])))
        pos += size
    return tuple(out)


def split_lanes(workers: Sequence[str], count: int) -> list[tuple[str, ...]]:
    """Cut ``workers`` into ``count`` contiguous lanes whose widths differ by at most one."""
    count = max(1, min(count, len(workers)))
    base, extra = divmod(len(workers), count)
    lanes, pos = [], 0
    for i in range(count):
        width = base + (1 if i < extra else 0)
        lanes.append(tuple(workers[pos:pos + width]))
        pos += width
    return lanes


def _group_samples(prompts: Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(p * n + j for p in prompts for j in range(n))


class Planner(abc.ABC):
    """Cuts a step into micro-batches and the generator pool into lanes; assigns samples to ranks."""

    name: str = ""

    @abc.abstractmethod
    def microbatches(self, step: int, prompts: int, n: int, ranks: int) -> list[MicroBatch]:
        """The micro-batches of one step, in generation order; together they hold every sample once."""

    @abc.abstractmethod
    def lanes(self, workers: Sequence[str], n: int) -> list[tuple[str, ...]]:
        """Groups of generator ranks that each run one micro-batch at a time."""

    @abc.abstractmethod
    def assign(self, mb: MicroBatch, lane: Sequence[str], n: int) -> Assignment:
        """Which samples of ``mb`` each rank of ``lane`` handles (generation and scoring)."""

    def update_assignment(self, mb: MicroBatch, trainers: Sequence[str]) -> Assignment:
        """Which samples of ``mb`` each trainer rank updates: contiguous, even shares over all of them."""
        return split_even(mb.samples, trainers)


class GapPlanner(Planner):
    """Generation-axis pipeline: one prompt group per micro-batch, spread over a lane."""

    name = "gap"

    def microbatches(self, step: int, prompts: int, n: int, ranks: int) -> list[MicroBatch]:
        return [MicroBatch(step, p, (p,), _group_samples((p,), n)) for p in range(prompts)]

    def lanes(self, workers: Sequence[str], n: int) -> list[tuple[str, ...]]:
        return split_lanes(workers, -(-len(workers) // n)) if workers else []

    def assign(self, mb: MicroBatch, lane: Sequence[str], n: int) -> Assignment:
        return split_even(mb.samples, lane)


class BatchAxisPlanner(Planner):
    """Batch-axis split: one group per rank per micro-batch; all ranks form one lane."""

    name = "batch_axis"

    def microbatches(self, step: int, prompts: int, n: int, ranks: int) -> list[MicroBatch]:
        out = []
        for index, first in enumerate(range(0, prompts, ranks)):
            group = tuple(range(first, min(first + ranks, prompts)))
            out.append(MicroBatch(step, index, group, _group_samples(group, n)))
        return out

    def lanes(self, workers: Sequence[str], n: int) -> list[tuple[str, ...]]:
        return [tuple(workers)] if workers else []

    def assign(self, mb: MicroBatch, lane: Sequence[str], n: int) -> Assignment:
        groups = [tuple(range(p * n, (p + 1) * n)) for p in mb.prompts]
        if len(groups) <= len(lane):
            return tuple((lane[i], groups[i]) for i in range(len(groups)))
        # fewer live ranks than groups (after a failure): deal whole groups round-robin
        per_rank: dict[str, list[int]] = {w: [] for w in lane}
        for i, grp in enumerate(groups):
            per_rank[lane[i % len(lane)]].extend(grp)
        return tuple((w, tuple(s)) for w, s in per_rank.items() if s)


class ColocatedPlanner(Planner):
    """verl-omni's colocated micro-batches: chunks of ``micro_batch_size`` samples of every rank's share of the
    batch (see the module docstring). The pool is one lane; a micro-batch is generated, scored and updated on the
    ranks of its split.

    Args:
        micro_batch_size: samples per rank per micro-batch (``ppo_micro_batch_size_per_gpu``); None: a rank's whole
            share, one micro-batch per step.
    """

    name = "colocated"

    def __init__(self, micro_batch_size: int | None = None) -> None:
        if micro_batch_size is not None and (isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int)
                                             or micro_batch_size < 1):
            raise ValueError(f"ColocatedPlanner(micro_batch_size={micro_batch_size!r}): use an integer >= 1 or None")
        self.micro_batch_size = micro_batch_size

    def microbatches(self, step: int, prompts: int, n: int, ranks: int) -> list[MicroBatch]:
        shares = [s for _, s in split_even(range(prompts * n), [str(r) for r in range(max(ranks, 1))])]
        size = self.micro_batch_size or max(len(s) for s in shares)
        out = []
        for index in range(-(-max(len(s) for s in shares) // size)):
            split = tuple(tuple(s[index * size:(index + 1) * size]) for s in shares)
            # shares shrink with the rank (split_even), so the ranks left without a sample are the last ones
            split = tuple(part for part in split if part)
            samples = tuple(sorted(i for part in split for i in part))
            out.append(MicroBatch(step, index, tuple(sorted({i // n for i in samples})), samples, split))
        return out

    def lanes(self, workers: Sequence[str], n: int) -> list[tuple[str, ...]]:
        return [tuple(workers)] if workers else []

    def assign(self, mb: MicroBatch, lane: Sequence[str], n: int) -> Assignment:
        if len(mb.split) > len(lane):  # the plan was cut for more ranks than are given: even shares
            return split_even(mb.samples, lane)
        return tuple((lane[r], part) for r, part in enumerate(mb.split))

    def update_assignment(self, mb: MicroBatch, trainers: Sequence[str]) -> Assignment:
        return self.assign(mb, trainers, 0)


def step_microbatches(planner: Planner, step: int, prompts: int, n: int, ranks: int,
                      minibatches: int = 1, dp_ranks: int = 1) -> list[MicroBatch]:
    """The micro-batches of one step cut into ``minibatches`` mini-batches (optimizer steps) as verl cuts them over
    ``dp_ranks`` data-parallel ranks (`config.minibatch_groups`: mini-batch ``j`` is every rank's ``j``-th
    contiguous block of its share; one rank: the ``j``-th block of the batch, no shuffle); each mini-batch is
    planned by ``planner`` as a batch of its own (its groups in ascending order), and indices run on across
    mini-batches, so micro-batch order is mini-batch order.

        >>> [(m.index, m.minibatch, m.prompts) for m in step_microbatches(GapPlanner(), 0, 4, 2, 2, minibatches=2)]
        [(0, 0, (0,)), (1, 0, (1,)), (2, 1, (2,)), (3, 1, (3,))]
        >>> [(m.minibatch, m.prompts) for m in step_microbatches(GapPlanner(), 0, 4, 2, 2, 2, dp_ranks=2)]
        [(0, (0,)), (0, (2,)), (1, (1,)), (1, (3,))]
    """
    out: list[MicroBatch] = []
    for j, groups in enumerate(minibatch_groups(prompts, minibatches, dp_ranks)):
        # the mini-batch's own sample s (its planned batch) is the step's sample groups[s // n] * n + s % n
        at = [g * n + i for g in groups for i in range(n)]
        for mb in planner.microbatches(step, len(groups), n, ranks):
            out.append(MicroBatch(step, len(out), tuple(groups[p] for p in mb.prompts),
                                  tuple(at[s] for s in mb.samples),
                                  tuple(tuple(at[s] for s in part) for part in mb.split), j))
    return out


def make_planner(gap: bool) -> Planner:
    """The disaggregated plans: GAP, or the batch-axis split."""
    return GapPlanner() if gap else BatchAxisPlanner()


def planner_for(config: ScheduleConfig) -> Planner:
    """The plan a schedule runs: colocated runs follow `ColocatedPlanner` (``config.micro_batch_size``), whatever
    ``gap`` says; disaggregated runs GAP or the batch-axis split (``config.gap``)."""
    if config.mode == "colocated":
        return ColocatedPlanner(config.micro_batch_size)
    return make_planner(config.gap)
