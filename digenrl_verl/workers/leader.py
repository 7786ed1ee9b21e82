"""A lane leader: one actor that fans a task out to its ranks, so the driver makes one call per task and group.

Without it, `trainer.ray_executor.RayExecutor` makes one actor call per rank a task names (a GEN on a GAP lane of 8
ranks: 8 calls; a SYNC: one per actor), and the driver process pays Ray's submission cost for each
(docs/benchmarks.md#driver-issue-31). With leaders (`trainer.lane_leaders.LeaderRayExecutor`), each group of workers
(a GAP lane's generators, the trainer ranks) has one `LaneLeader`; the driver sends it one call per task holding every
rank's part, the leader makes the rank calls and answers once all of them did: the driver's calls per task fall from
~8.6 to ~1.1 at 64 actors, and its completions arrive one per group.

The leader is a threaded Ray actor (`MAX_CONCURRENCY` calls at once; the driver gives a worker one task at a time, so a
leader has one or two) holding no data and no torch: it submits calls and waits for their small results (threads, not
asyncio: an async leader's fan-out measured ~10 % slower, docs/benchmarks.md#driver-leaders).
The ranks' outputs (a GEN's trajectory and decoded samples) stay in the object store: the leader answers with their
object refs (owned by the leader, borrowed by the driver and by the calls that read them). A rank call that raises does
not fail the leader's call: its place in the answer holds a `RankError` (the worker, the reason, whether the actor died
or its inputs were lost), so the executor attributes the failure as it does for its own calls.

A worker belongs to one leader, and the driver gives it a task only once its last one is done: the rank calls of one
worker never overtake each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import ray
from ray.exceptions import ObjectLostError, RayActorError

MAX_CONCURRENCY = 8  # leader calls served at once (threads)


@dataclass(frozen=True)
class RankError:
    """A rank call that raised, in a leader's answer (in place of the call's result)."""

    worker: str
    reason: str
    dead: bool = False  # the actor died (RayActorError)
    lost: bool = False  # an input object was lost (ObjectLostError)


class LaneLeader:
    """The fan-out of one group of workers (names -> actor handles, `set_workers` replaces them).

    Methods, each answering once every rank call of it is done, results in the order of its `calls`:
    - `fan(calls)`: `calls` = [(worker, method, args)], each `worker.method.remote(*args)`; an `ObjectRef` in `args`
      is resolved by the rank (as a top-level argument), not by the leader;
    - `generate(step, batch_box, calls)`: `calls` = [(worker, sample_ids, message)], each rank's
      `generate_call(shard, message)` with three returns, where the shard is the rows `sample_ids` of the step batch
      (`batch_box[0]`: an `ObjectRef` of it, put once per step by the executor and fetched here once per step);
      answers (trajectory ref, decoded samples ref, facts) per call, or its `RankError` (only the facts were waited
      for).
    """

    def __init__(self, workers: Mapping[str, Any]) -> None:
        self.workers: dict[str, Any] = {}
        self._generate: dict[str, Any] = {}
        self._batch: tuple[int, Any] | None = None  # (step, that step's batch)
        self.set_workers(workers)

    def set_workers(self, workers: Mapping[str, Any]) -> int:
        self.workers.update(workers)
        for w in workers:
            self._generate[w] = self.workers[w].generate_call.options(num_returns=3)
        return len(self.workers)

    def ready(self) -> bool:
        return True

    def fan(self, calls: Sequence[tuple[str, str, tuple]]) -> list:
        refs = [getattr(self.workers[w], method).remote(*args) for w, method, args in calls]
        return _results([w for w, _, _ in calls], refs)

    def generate(self, step: int, batch_box: list, calls: Sequence[tuple[str, Sequence[int], bytes]]) -> list:
        cached = self._batch
        if cached is None or cached[0] != step:
            cached = self._batch = (step, ray.get(batch_box[0]))
        outs = [self._generate[w].remote(cached[1].select_idxs(np.asarray(ids, dtype=np.int64)), message)
                for w, ids, message in calls]
        facts = _results([w for w, _, _ in calls], [o[2] for o in outs])
        return [f if isinstance(f, RankError) else (o[0], o[1], f) for o, f in zip(outs, facts)]


def _results(workers: Sequence[str], refs: Sequence[Any]) -> list:
    """The values of `refs` (one `ray.get`), a `RankError` in place of each that raised."""
    try:
        return ray.get(list(refs))
    except Exception:  # noqa: BLE001 -- one of them raised: each on its own, so the others keep their results
        pass
    out = []
    for w, ref in zip(workers, refs):
        try:
            out.append(ray.get(ref))
        except Exception as e:  # noqa: BLE001
            out.append(_error(w, e))
    return out


def _error(worker: str, e: BaseException) -> RankError:
    dead = isinstance(e, RayActorError) or isinstance(getattr(e, "cause", None), RayActorError)
    lost = isinstance(e, ObjectLostError) or isinstance(getattr(e, "cause", None), ObjectLostError)
    return RankError(worker, f"{type(e).__name__}: {e}", dead=dead, lost=lost)
