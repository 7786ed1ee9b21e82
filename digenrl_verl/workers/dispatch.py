"""GAP-aware splitting of a step's DataProto into per-rank shards, and gathering back in sample order.

The schedule assigns sample indices (rows of the step's batch: prompts repeated `rollout.n` times,
row i = prompt i // n, sample i % n) to worker ranks. GAP spreads one prompt group over all generator
ranks; the batch-axis baseline gives each rank whole groups. Either way, an `Assignment` is a per-rank
list of row indices, and these helpers move data accordingly.

Also registered as a verl dispatch mode (`DIGENRL_ASSIGNED`) so a worker method can declare
`@register(dispatch_mode=assigned_dispatch_mode())` and be called as `wg.method(data, assignment)`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import ray
from verl import DataProto
from verl.single_controller.base.decorator import DISPATCH_MODE_FN_REGISTRY, Dispatch, register_dispatch_mode

Assignment = Sequence[Sequence[int]]

DISPATCH_MODE_NAME = "DIGENRL_ASSIGNED"
ROWS_KEY = "digenrl_rows"
"""meta_info key: the step-batch rows a shard holds; a method under this dispatch mode must copy it into
its output's meta_info so the collect side can restore the sample order."""


def validate_assignment(assignment: Assignment, num_rows: int | None = None) -> None:
    flat = [int(i) for rows in assignment for i in rows]
    if len(flat) != len(set(flat)):
        raise ValueError(f"assignment gives a row to two ranks: {assignment}")
    if num_rows is not None and any(i < 0 or i >= num_rows for i in flat):
        raise ValueError(f"assignment names rows outside [0, {num_rows}): {assignment}")


def split_by_assignment(data, assignment: Assignment) -> list:
    """One DataProto per rank holding the rows `assignment[rank]` names, in that order (may be empty)."""
    validate_assignment(assignment, len(data))
    return [data.select_idxs(np.asarray(list(rows), dtype=np.int64)) for rows in assignment]


def gather_in_sample_order(parts: Sequence, assignment: Assignment):
    """Concatenate per-rank outputs and reorder rows by their original index (ascending)."""
    nonempty = [(p, rows) for p, rows in zip(parts, assignment) if len(rows) > 0]
    if not nonempty:
        raise ValueError("nothing to gather: every rank's shard is empty")
    for p, rows in nonempty:
        if len(p) != len(rows):
            raise ValueError(f"a rank returned {len(p)} rows for an assignment of {len(rows)}")
    for p, _ in nonempty:  # per-shard bookkeeping would conflict in DataProto.concat's meta_info check
        p.meta_info = {k: v for k, v in p.meta_info.items() if k != ROWS_KEY}
    merged = DataProto.concat([p for p, _ in nonempty])
    order = np.concatenate([np.asarray(list(rows), dtype=np.int64) for _, rows in nonempty])
    return merged.select_idxs(np.argsort(order, kind="stable"))


def _dispatch(worker_group, data, assignment: Assignment, **kwargs):
    if len(assignment) != worker_group.world_size:
        raise ValueError(f"assignment has {len(assignment)} ranks, the worker group {worker_group.world_size}")
    shards = split_by_assignment(data, assignment)
    for shard, rows in zip(shards, assignment):
        shard.meta_info = {**shard.meta_info, ROWS_KEY: [int(r) for r in rows]}
    return (shards,), {k: [v] * worker_group.world_size for k, v in kwargs.items()}


class AssignedFuture:
    """Non-blocking result of an assigned call: the per-rank object refs and how to reassemble them."""

    def __init__(self, refs: list, assignment: Assignment) -> None:
        self.refs = refs
        self.assignment = [list(r) for r in assignment]

    def get(self):
        return gather_in_sample_order(ray.get(self.refs), self.assignment)


def _collect(worker_group, outputs):
    # The assignment travels with the call: `_dispatch` cannot hand it to `_collect` directly, so the
    # worker returns its own row indices in meta_info["digenrl_rows"].
    if outputs and isinstance(outputs[0], ray.ObjectRef):
        return outputs  # non-blocking call: the caller waits on the refs (see AssignedFuture)
    parts = list(outputs)
    rows = [p.meta_info.get(ROWS_KEY, []) for p in parts]
    return gather_in_sample_order(parts, rows)


_registered = None


def assigned_dispatch_mode():
    """The verl `Dispatch` member for assigned shards (registered on first use, once per process)."""
    global _registered
    if _registered is None:
        existing = getattr(Dispatch, DISPATCH_MODE_NAME, None)
        if existing is not None and existing in DISPATCH_MODE_FN_REGISTRY:
            _registered = existing
        else:
            register_dispatch_mode(DISPATCH_MODE_NAME, _dispatch, _collect)
            _registered = getattr(Dispatch, DISPATCH_MODE_NAME)
    return _registered
