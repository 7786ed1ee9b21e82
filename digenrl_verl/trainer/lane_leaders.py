"""`RayExecutor` with lane leaders: one driver call per task and group of workers instead of one per rank.

`RayExecutor` makes one actor call per rank a task names; the driver's cost is Ray's submission of each (a GEN on a
GAP lane of 8 ranks: 8 calls; at 64 actors 8.65 calls per task). `LeaderRayExecutor` gives each group of workers (a
GAP lane's generators, the trainer ranks: `start_leaders`) a `workers.leader.LaneLeader` and sends each task to the
leaders of its workers, one call each holding every rank's part:

| task         | the driver's call, to each leader of its workers | the leader's calls, one per rank (`RayExecutor`'s) |
|--------------|--------------------------------------------------|----------------------------------------------------|
| GEN, TAG_GEN | `generate(step, [step batch ref], parts)`        | `generate_call(shard, message)`, three returns     |
| SCORE        | `fan([(w, "score_call", (message, *refs))])`     | `score_call(message, *image_refs)`                 |
| UPDATE       | `fan([(w, "update_call", (message, *refs))])`    | `update_call(message, *traj_refs)`                 |
| OPT_STEP     | `fan([(w, "opt_step", (version,))])`             | `opt_step(version)`                                |
| SYNC         | `fan` of each leader (generators, trainers)      | `receive_weights` / `send_weights`, all in flight  |

The step batch is `ray.put` once a step and the leaders cut the GEN shards from it (the executor cuts none).

The messages, the workers' methods and what each rank computes are `RayExecutor`'s; only who submits the rank calls
changes. The task completes when its leaders answered (every rank call done); a GEN's trajectory and decoded-sample
refs come in the leader's answer (the leader owns them; nothing of the data passes through either process). The
deferred global std's OPT_STEP (late UPDATEs, then the optimizer steps, in order on each rank) and CHECKPOINT keep
`RayExecutor`'s own path. The schedule is the driver's, unchanged: the executor interprets the same tasks.

Not for the elastic generator pool (`trainer.elastic`): a leader holds its ranks' handles from the start. Not used by
the runner: measured by `bench driver` (docs/benchmarks.md#driver-leaders), it cuts the driver's calls per task from
8.65 to 1.08 and about halves the driver's CPU per task at 64 actors, but runs 0.6-0.7x `RayExecutor`'s task rate on
the 2-core machine, where the leaders' own calls compete for the cores the driver and the actors use: it is for a
driver whose core is the limit.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import ray

from digenrl_verl.schedule.types import Task, TaskKind, worker_pool, worker_rank
from digenrl_verl.trainer.ray_executor import RayExecutor, _InFlight
from digenrl_verl.workers.calls import pack
from digenrl_verl.workers.leader import MAX_CONCURRENCY, LaneLeader, RankError

GENERATES = (TaskKind.GEN, TaskKind.TAG_GEN)


class RankFailure(RuntimeError):
    """Rank calls that raised under a leader: the executor's failure info reads `dead_workers` and `data_lost`."""

    def __init__(self, errors: Sequence[RankError]) -> None:
        super().__init__("; ".join(f"{e.worker}: {e.reason}" for e in errors))
        self.dead_workers = tuple(sorted({e.worker for e in errors if e.dead}))
        self.data_lost = any(e.lost for e in errors)


def start_leaders(workers: Mapping[str, Any], groups: Sequence[Sequence[str]]) -> dict[str, Any]:
    """One `LaneLeader` actor per group of worker ids (threaded; `num_cpus=0`: it only submits calls), started and
    ready; returns worker id -> its group's leader."""
    remote = ray.remote(LaneLeader).options(num_cpus=0, max_concurrency=MAX_CONCURRENCY)
    leaders = [remote.remote({w: workers[w] for w in group}) for group in groups]
    ray.get([leader.ready.remote() for leader in leaders])
    return {w: leader for group, leader in zip(groups, leaders) for w in group}


class LeaderRayExecutor(RayExecutor):
    """`RayExecutor` whose rank calls the workers' lane leaders make (`leaders`: worker id -> its leader's handle,
    every worker of a task must have one; `start_leaders`). The other arguments are `RayExecutor`'s."""

    def __init__(self, workers: Mapping[str, Any], *args: Any, leaders: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(workers, *args, **kwargs)
        missing = sorted(set(self.workers) - set(leaders))
        if missing:
            raise ValueError(f"LeaderRayExecutor: workers {missing} have no lane leader")
        handles: dict[int, Any] = {}
        self._leader_of: dict[str, int] = {}
        for w, leader in leaders.items():
            self._leader_of[w] = next((i for i, h in handles.items() if h is leader), len(handles))
            handles.setdefault(self._leader_of[w], leader)
        self._leaders = handles
        self._parts: dict[Any, list[tuple[str, tuple[int, ...]]]] = {}  # leader ref -> its calls' (worker, samples)
        self._batch_refs: dict[int, Any] = {}  # step -> its batch in the object store (the leaders cut the shards)

    # -- launching ----------------------------------------------------------------------------------
    def _by_leader(self, parts: Sequence[tuple[str, Any]]) -> list[tuple[int, list[tuple[str, Any]]]]:
        """`parts` ((worker, payload) pairs) grouped by leader, in first-seen order, each group in the given order."""
        groups: dict[int, list[tuple[str, Any]]] = {}
        for w, payload in parts:
            groups.setdefault(self._leader_of[w], []).append((w, payload))
        return list(groups.items())

    def _led(self, task: Task, calls: Sequence[tuple[str, tuple[int, ...], str, tuple]]) -> _InFlight:
        """A task whose calls ((worker, samples, method, args)) its workers' leaders make, one `fan` per leader."""
        f = _InFlight(task, self.now(), [], [], rank_calls=len(calls))
        for i, part in self._by_leader([(w, (s, m, a)) for w, s, m, a in calls]):
            ref = self._leaders[i].fan.remote([(w, m, a) for w, (_, m, a) in part])
            self._track(f, i, ref, [(w, s) for w, (s, _, _) in part])
        return f

    def _track(self, f: _InFlight, leader: int, ref: Any, part: list[tuple[str, tuple[int, ...]]]) -> None:
        f.add(ref, f"leader:{leader}")
        self._parts[ref] = part

    def _generate(self, task: Task) -> _InFlight:
        parts = [(w, tuple(s)) for w, s in task.assignment if s]
        f = _InFlight(task, self.now(), [], [], rank_calls=len(parts))
        box = [self._batch_ref(task.step)]  # in a list: the leader fetches it, once per step, not Ray per call
        for i, part in self._by_leader(parts):
            calls = [(w, list(s), pack(list(s), task.version)) for w, s in part]
            self._track(f, i, self._leaders[i].generate.remote(task.step, box, calls), part)
        return f

    def _batch_ref(self, step: int) -> Any:
        ref = self._batch_refs.get(step)
        if ref is None:
            ref = self._batch_refs[step] = ray.put(self.step_batch(step))
        return ref

    def _score(self, task: Task) -> _InFlight:
        return self._led(task, [(w, tuple(s), "score_call",
                                 (pack(list(s)), *self._refs_for(self._images, task.step, s)))
                                for w, s in task.assignment if s])

    def _submit_update(self, task: Task, adv_of: Mapping[int, float], f: _InFlight) -> None:
        denominator = self.loss_denominator(task)
        max_share = max(len(samples) for _, samples in task.assignment)
        calls = []
        for worker, samples in task.assignment:
            message = pack(list(samples), [float(adv_of.get(s, 0.0)) for s in samples], denominator,
                           "tsp" in task.flags, task.version, max_share)
            refs = self._refs_for(self._trajectories, task.step, samples) if samples else []
            calls.append((worker, tuple(samples), "update_call", (message, *refs)))
        led = self._led(task, calls)
        for ref in led.result_refs:
            f.add(ref, led.workers_of_ref[ref])
        f.rank_calls = led.rank_calls

    def _opt_step(self, task: Task) -> _InFlight:
        if self.advantage_cfg.deferred_std:  # late UPDATEs then the optimizer steps, in order: RayExecutor's calls
            return super()._opt_step(task)
        return self._led(task, [(w, (), "opt_step", (task.version,)) for w in task.workers])

    def _sync(self, task: Task) -> _InFlight:
        generators = [worker_rank(w) for w in task.workers if worker_pool(w) == "gen"]
        return self._led(task, [(w, (), "receive_weights", (task.version,)) if worker_pool(w) == "gen"
                                else (w, (), "send_weights", (task.version, generators)) for w in task.workers])

    # -- completing ---------------------------------------------------------------------------------
    def _rank_values(self, f: _InFlight, values: list) -> list:
        """One result per rank call, in the order the leaders made them (a direct call's value as it is); a GEN's
        data refs recorded for the tasks that read them. A rank call that raised fails the task (`RankFailure`)."""
        out, errors = [], []
        for ref, value in zip(f.result_refs, values):
            part = self._parts.get(ref)
            if part is None:
                out.append(value)
                continue
            for (_, samples), v in zip(part, value):
                if isinstance(v, RankError):
                    errors.append(v)
                elif f.task.kind in GENERATES:
                    traj_ref, img_ref, facts = v
                    for s in samples:
                        self._trajectories[(f.task.step, s)] = traj_ref
                        self._images[(f.task.step, s)] = img_ref
                    out.append(facts)
                else:
                    out.append(v)
        if errors:
            raise RankFailure(errors)
        return out

    def _completion(self, f: _InFlight, values: list | None = None):
        try:
            return super()._completion(f, values)
        finally:
            for ref in f.result_refs:
                self._parts.pop(ref, None)

    def release_step(self, step: int) -> None:
        super().release_step(step)
        self._batch_refs.pop(step, None)
