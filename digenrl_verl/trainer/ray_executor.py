"""The scheduling engine's `Executor` on Ray: each task kind becomes non-blocking worker calls.

The driver (`schedule.driver`) decides; this class only interprets its tasks:

| task      | calls (all `.remote`, never waited on here)                                      |
|-----------|-----------------------------------------------------------------------------------|
| GEN       | `generate_call(shard, pack(sample_ids, version))` on each generator in the          |
|           | assignment (3 returns; only the third, a few facts, is fetched)                   |
| TAG_GEN   | the same method on trainer workers (their current, not yet stepped weights)       |
| SCORE     | `score_call(pack(sample_ids), *image_refs)` on the generator(s) named by the task  |
| UPDATE    | `update_call(pack(sample_ids, advantages, denominator, tsp, version, max_share),  |
|           | *traj_refs)`: advantages as plain floats                                          |
| OPT_STEP  | `opt_step(version)` on every trainer (gradients all-reduced inside)               |
| SYNC      | `send_weights(version, gens)` on trainers + `receive_weights(version)` on gens    |
| CHECKPOINT| the runner's `on_checkpoint(task)` callback (saves version `task.version`)        |

A data call's plain arguments travel as one message (`workers.calls.pack`: Ray passes bytes as they are, where it
serialises every other argument on its own); the worker's `*_call` entry point unpacks it into the typed method
(`generate`, `score`, `update`).

Data never passes through the driver process: the generators' outputs stay in Ray's object store, keyed
here by (step, sample id), and later tasks receive the object refs. Only rewards (floats) come back, so
the driver can compute group advantages.

A task completes when all of its object refs are ready. The executor keeps one table of the refs not yet
ready (ref -> task), so a `wait_any` turn costs two `ray.wait` calls over that table whatever the number of tasks
in flight (block for the first ready ref, then collect every ready one), and readiness never moves data:
`fetch_local=False` (a trajectory stays in the object store of the node that made it until a trainer reads it).

A task costs one Ray round trip per rank it names (a GEN on a GAP lane of 8 ranks: 8 calls), and that, not the
driver's decisions, bounds the task rate: `python -m digenrl_verl.bench driver` measures both, with the machine's
limits (docs/benchmarks.md).
A call that raises marks the task failed; an actor that died is reported in `info["dead_workers"]`, and the
driver re-issues its work. `stats` counts where the executor's wall time goes (`bench driver` reports it).

CHECKPOINT is the one task run in the driver's process: `submit` only records it, and the next `wait_any` runs
the callback (which blocks until the trainers wrote the state) and reports its completion. Nothing else is in
flight then: the driver issues it at a drained barrier (`schedule.driver`).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import ray
import torch
from ray.exceptions import ObjectLostError, RayActorError

from digenrl_verl.diffusion.advantages import (AdvantageConfig, centred_rewards, certainly_unclamped, gradient_scale,
                                               late_advantage, needs_whole_step, normalize_rewards, std_lower_bound,
                                               step_scale)
from digenrl_verl.schedule.types import Completion, Task, TaskKind, worker_pool, worker_rank
from digenrl_verl.workers.calls import pack

POLL_S = 0.5


@dataclass
class ExecutorStats:
    """Where the executor's wall time went (`time.perf_counter` seconds) and how much it did.

    submit_s: inside `submit` (building the calls' arguments, advantages, `.remote`); wait_s: blocked in
    `ray.wait` for the next ready ref; probe_s: collecting the other ready refs (non-blocking `ray.wait`);
    get_s: `ray.get` of result values (the object transfer back to the driver); complete_s: the rest of completing
    tasks (absorbing scores, callbacks). calls: actor calls the driver made; rank_calls: calls the workers ran (the
    same, unless lane leaders made them: `trainer.lane_leaders`); waits: blocking `ray.wait` calls."""

    submit_s: float = 0.0
    wait_s: float = 0.0
    probe_s: float = 0.0
    get_s: float = 0.0
    complete_s: float = 0.0
    submits: int = 0
    completions: int = 0
    calls: int = 0
    rank_calls: int = 0
    waits: int = 0


@dataclass
class _InFlight:
    task: Task
    start: float
    refs: list                      # every ref that must be ready for the task to be done
    result_refs: list               # refs whose values are the task's results (subset of refs)
    workers_of_ref: dict = field(default_factory=dict)  # ref -> worker id (failure attribution)
    call: Callable[[Task], Mapping[str, Any] | None] | None = None  # run in this process by wait_any (CHECKPOINT)
    waiting: set = field(default_factory=set)  # refs not seen ready yet
    rank_calls: int | None = None  # calls the workers run for it, when not one per result ref (lane leaders)

    def add(self, ref, worker: str, *, result: bool = True) -> None:
        """Track `ref` (a call on `worker`); `result`: its value is one of the task's results."""
        self.refs.append(ref)
        self.waiting.add(ref)
        if result:
            self.result_refs.append(ref)
            self.workers_of_ref[ref] = worker


class RayExecutor:
    """Executor protocol over verl worker groups.

    Args:
        workers: worker id ("gen:0", "trn:1", "col:0") → Ray actor handle.
        step_batch: global step → that step's DataProto (prompts × n rows; see trainer.data).
        advantage_cfg: how rewards become advantages (group-normalised per uid).
        loss_rows_per_sample: K, trained steps per sample (the loss denominator counts rows).
        mini_batches_per_step: optimizer steps per global step (`ScheduleConfig.mini_batches_per_step`): the loss of
            an UPDATE is normalised over its mini-batch's rows.
        on_result: optional callback(task, result values) for metrics (rewards, losses, ...).
        on_checkpoint: callback(task) run for a CHECKPOINT task: saves the trainer state of version
            ``task.version``, returns facts for the completion's info (e.g. the path) or None; if it raises, the
            task fails. Without it a CHECKPOINT fails with a message saying so.
    """

    def __init__(self, workers: Mapping[str, Any], step_batch: Callable[[int], Any], advantage_cfg: AdvantageConfig,
                 loss_rows_per_sample: int, on_result: Callable[[Task, list], None] | None = None,
                 on_checkpoint: Callable[[Task], Mapping[str, Any] | None] | None = None,
                 mini_batches_per_step: int = 1) -> None:
        self.workers = dict(workers)
        self.step_batch = step_batch
        self.advantage_cfg = advantage_cfg
        self.rows_per_sample = loss_rows_per_sample
        self.mini_batches_per_step = mini_batches_per_step
        self.on_result = on_result
        self.on_checkpoint = on_checkpoint
        self._t0 = time.monotonic()
        self._inflight: dict[int, _InFlight] = {}
        self._trajectories: dict[tuple[int, int], Any] = {}   # (step, sample) -> trajectory ref
        self._images: dict[tuple[int, int], Any] = {}         # (step, sample) -> images ref
        self._scores: dict[int, dict[int, float]] = defaultdict(dict)
        self._pending_refs: dict[Any, int] = {}  # ref not seen ready yet -> its task id
        self._generate_methods: dict[str, tuple] = {}  # worker -> (actor, its 3-return `generate_call`)
        self.stats = ExecutorStats()
        # the deferred global std (`AdvantageConfig.deferred_std`): UPDATEs holding samples the clamp may touch (re-run
        # before the step's first OPT_STEP), the step's 1/(σ + ε), its UPDATE results held until it is known
        self._late: dict[int, list[tuple[Task, tuple[int, ...]]]] = defaultdict(list)
        self._grad_scale: dict[int, float] = {}
        self._held: dict[int, list[tuple[Task, list]]] = defaultdict(list)
        self.late_samples = 0  # samples trained late (their first UPDATE gave them 0), over the run

    # -- protocol -------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0

    def submit(self, task: Task) -> None:
        t0 = time.perf_counter()
        launch = {
            TaskKind.GEN: self._generate, TaskKind.TAG_GEN: self._generate, TaskKind.SCORE: self._score,
            TaskKind.UPDATE: self._update, TaskKind.OPT_STEP: self._opt_step, TaskKind.SYNC: self._sync,
            TaskKind.CHECKPOINT: self._checkpoint,
        }[task.kind]
        f = launch(task)
        self._inflight[task.task_id] = f
        for ref in f.waiting:
            self._pending_refs[ref] = task.task_id
        self.stats.submits += 1
        self.stats.calls += len(f.result_refs)  # one result ref per actor call
        self.stats.rank_calls += len(f.result_refs) if f.rank_calls is None else f.rank_calls
        self.stats.submit_s += time.perf_counter() - t0

    def wait_any(self, timeout: float | None) -> list[Completion]:
        for f in list(self._inflight.values()):
            if f.call is not None:
                return [self._run_call(f)]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = [f for f in self._inflight.values() if not f.waiting]
            if done:
                return self._complete_all(done)
            if not self._pending_refs:
                return []
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                return []
            self._collect_ready(left)

    def _collect_ready(self, left: float) -> None:
        """Mark the refs that are ready now, blocking at most `left` seconds for the first batch of them.

        No task can end before every ref it still waits on is ready, so the blocking wait asks for as many refs as
        the task closest to its end still lacks (`num_returns` = the fewest refs any task waits on): a GEN on a lane
        of 8 ranks wakes the driver once, not once per rank. A second, non-blocking wait collects every other ref
        ready by then. Only refs not yet ready are waited on (finished refs of unfinished tasks would return at once:
        a busy loop); short slices so Python signal handlers (Ctrl-C, SIGTERM) run promptly."""
        pending = list(self._pending_refs)
        need = min(len(f.waiting) for f in self._inflight.values() if f.waiting)
        t0 = time.perf_counter()
        ready, _ = ray.wait(pending, num_returns=min(need, len(pending)), timeout=left, fetch_local=False)
        t1 = time.perf_counter()
        self.stats.waits += 1
        self.stats.wait_s += t1 - t0
        if not ready:
            return
        if len(ready) < len(pending):  # every other ref ready by now, in one call
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0, fetch_local=False)
        for ref in ready:
            self._inflight[self._pending_refs.pop(ref)].waiting.discard(ref)
        self.stats.probe_s += time.perf_counter() - t1

    # -- bookkeeping ----------------------------------------------------------------------------
    def _complete_all(self, done: list[_InFlight]) -> list[Completion]:
        """Complete the tasks whose refs are all ready: their results fetched with one `ray.get` (a call that raises
        is then looked at task by task, `_completion`)."""
        values: list | None = None
        refs = [r for f in done for r in f.result_refs]
        if len(done) > 1 and refs:
            try:
                values = self._get(refs)
            except Exception:  # a failed call: each task fetches its own, so the failure is attributed to its task
                values = None
        out, i = [], 0
        for f in done:
            k = len(f.result_refs)
            out.append(self._complete(f, None if values is None else values[i:i + k]))
            i += k
        return out

    def _complete(self, f: _InFlight, values: list | None = None) -> Completion:
        t0 = time.perf_counter()
        get_before = self.stats.get_s
        try:
            return self._completion(f, values)
        finally:
            self.stats.completions += 1
            self.stats.complete_s += time.perf_counter() - t0 - (self.stats.get_s - get_before)

    def _get(self, refs: list) -> list:
        t0 = time.perf_counter()
        try:
            return ray.get(refs)
        finally:
            self.stats.get_s += time.perf_counter() - t0

    def _completion(self, f: _InFlight, values: list | None = None) -> Completion:
        """`values`: the results, already fetched (`_complete_all`), else fetched here."""
        del self._inflight[f.task.task_id]
        end = self.now()
        try:
            if values is None:
                values = self._get(f.result_refs)
            values = self._rank_values(f, values)
        except Exception as e:
            # ray.get raises the first error in list order, which may hide a dead actor behind another
            # worker's error: probe every call (a lane leader names its dead ranks itself: `RankFailure`)
            dead = tuple(sorted({w for r, w in f.workers_of_ref.items() if w in self.workers
                                 and _raises(r, RayActorError)} | set(getattr(e, "dead_workers", ()))))
            info: dict[str, Any] = {"reason": f"{type(e).__name__}: {e}"}
            if dead:
                info["dead_workers"] = dead
            if (isinstance(e, ObjectLostError) or getattr(e, "data_lost", False)
                    or any(_raises(r, ObjectLostError) for r in f.refs)):
                info["data_lost"] = True  # the inputs are gone (e.g. their node died): generate again
            self._forget_outputs(f.task)
            return Completion(f.task, f.start, end, ok=False, info=info)
        info = self._absorb(f.task, values)
        if self.on_result is not None:
            self._report(f.task, values)
        return Completion(f.task, f.start, end, ok=True, info=info)

    def _rank_values(self, f: _InFlight, values: list) -> list:
        """The task's results, one per worker call, from the values of its result refs (here the same; lane leaders
        answer for several calls at once)."""
        return values

    def _run_call(self, f: _InFlight) -> Completion:
        """Run a task that executes in this process (CHECKPOINT); an exception fails the task."""
        del self._inflight[f.task.task_id]
        try:
            info = dict(f.call(f.task) or {})
        except Exception as e:
            return Completion(f.task, f.start, self.now(), ok=False, info={"reason": f"{type(e).__name__}: {e}"})
        return Completion(f.task, f.start, self.now(), ok=True, info=info)

    def _absorb(self, task: Task, values: list) -> dict:
        if task.kind in (TaskKind.GEN, TaskKind.TAG_GEN):  # a colocated (hybrid) engine reports its switch phases
            hybrid = [v for v in values if isinstance(v, Mapping) and v.get("engine")]
            return {k: hybrid[0][k] for k in ("engine", "switch_s", "phases") if k in hybrid[0]} if hybrid else {}
        if task.kind == TaskKind.SCORE:
            rewards = []
            for v in values:
                for sid, r in zip(v["sample_ids"], v["scores"]):
                    self._scores[task.step][int(sid)] = float(r)
                    rewards.append(float(r))
            for s in task.samples:  # only SCORE reads the decoded samples: free them now
                self._images.pop((task.step, s), None)
            finite = [r for r in rewards if math.isfinite(r)]
            return {"reward_mean": float(np.mean(finite)) if finite else float("nan"),
                    "nonfinite_rewards": len(rewards) - len(finite)}
        if task.kind == TaskKind.OPT_STEP and "minibatch" not in task.flags:  # the step's last optimizer step
            self.release_step(task.step)
        return {}

    def _forget_outputs(self, task: Task) -> None:
        if task.kind in (TaskKind.GEN, TaskKind.TAG_GEN):
            for s in task.samples:
                self._trajectories.pop((task.step, s), None)
                self._images.pop((task.step, s), None)

    def release_step(self, step: int) -> None:
        """Drop a finished step's object refs (Ray frees the data) and scores."""
        for key in [k for k in self._trajectories if k[0] == step]:
            self._trajectories.pop(key, None)
            self._images.pop(key, None)
        self._scores.pop(step, None)

    def scores(self, step: int) -> dict[int, float]:
        return dict(self._scores.get(step, {}))

    # -- launching --------------------------------------------------------------------------------
    def _generate(self, task: Task) -> _InFlight:
        batch = self.step_batch(task.step)
        f = _InFlight(task, self.now(), [], [])
        for worker, samples in task.assignment:
            if not samples:
                continue
            shard = batch.select_idxs(np.asarray(samples, dtype=np.int64))
            traj_ref, img_ref, facts_ref = self._generate_method(worker).remote(shard, pack(list(samples),
                                                                                            task.version))
            for s in samples:
                self._trajectories[(task.step, s)] = traj_ref
                self._images[(task.step, s)] = img_ref
            # the three returns of one call are ready together (or fail together): wait on and fetch only the small
            # facts, so neither trajectories nor decoded samples ever travel to this process
            f.add(facts_ref, worker)
        return f

    def _generate_method(self, worker: str) -> Any:
        """`generate_call` of `worker` with its three returns, built once per actor (not per call; a replaced actor,
        see `trainer.elastic`, gets its own)."""
        actor = self.workers[worker]
        cached = self._generate_methods.get(worker)
        if cached is None or cached[0] is not actor:
            cached = self._generate_methods[worker] = (actor, actor.generate_call.options(num_returns=3))
        return cached[1]

    def _refs_for(self, store: dict, step: int, samples) -> list:
        missing = [s for s in samples if (step, s) not in store]
        if missing:
            raise RuntimeError(f"step {step}: samples {missing} were never generated (internal schedule error)")
        seen, refs = set(), []
        for s in samples:
            r = store[(step, s)]
            if id(r) not in seen:
                seen.add(id(r))
                refs.append(r)
        return refs

    def _score(self, task: Task) -> _InFlight:
        f = _InFlight(task, self.now(), [], [])
        for worker, samples in task.assignment:
            if not samples:
                continue
            f.add(self.workers[worker].score_call.remote(pack(list(samples)),
                                                         *self._refs_for(self._images, task.step, samples)), worker)
        return f

    def advantages(self, step: int, samples) -> torch.Tensor:
        """Group-normalised advantages of `samples` (their whole groups must be scored).

        Samples whose reward is NaN/inf are dropped from the statistics and get advantage 0, so they
        contribute no policy gradient; a group left with fewer than two finite rewards gets 0 everywhere.
        """
        return self.advantage_array(self._advantage_map(step, samples), samples)

    def advantage_array(self, adv: Mapping[int, float], samples) -> torch.Tensor:
        """The advantages of `samples` as `update` takes them (fp32 [len(samples)]; the UPDATE call carries them as
        floats, `update_call` makes this tensor)."""
        return torch.tensor([adv[s] for s in samples], dtype=torch.float32)

    def _pool(self, step: int, samples) -> list[int]:
        """The samples whose rewards the advantages of `samples` need (the whole step for the global std without
        deferral, else their groups), all scored."""
        batch = self.step_batch(step)
        uids = batch.non_tensor_batch["uid"]
        if needs_whole_step(self.advantage_cfg):
            pool = list(range(len(batch)))
        else:
            groups = {uids[s] for s in samples}
            pool = [i for i in range(len(batch)) if uids[i] in groups]
        missing = [i for i in pool if i not in self._scores[step]]
        if missing:
            raise RuntimeError(f"step {step}: UPDATE of samples {list(samples)} before samples {missing} of "
                               "their group(s) were scored (internal schedule error)")
        return pool

    def _advantage_map(self, step: int, samples) -> dict[int, float]:
        """Sample -> advantage for every row of the groups of `samples` (global_std: of the whole step batch);
        a group's values do not depend on the other groups asked for, so one call serves every rank of an
        UPDATE. Deferred global std: the values an UPDATE trains with now (`_deferred_map`)."""
        if self.advantage_cfg.deferred_std:
            return self._deferred_map(step, samples)[0]
        uids = self.step_batch(step).non_tensor_batch["uid"]
        scores = self._scores[step]
        pool = self._pool(step, samples)
        finite = [i for i in pool if math.isfinite(scores[i])]
        adv = {i: 0.0 for i in pool}
        if finite:
            res = normalize_rewards(torch.tensor([scores[i] for i in finite], dtype=torch.float64),
                                    [uids[i] for i in finite], self.advantage_cfg)
            adv.update({i: float(a) for i, a in zip(finite, res.advantages)})
        return {i: a if math.isfinite(a) else 0.0 for i, a in adv.items()}

    def _deferred_map(self, step: int, samples) -> tuple[dict[int, float], list[int]]:
        """The deferred global std (`diffusion.advantages`): sample -> the value an UPDATE trains with now (the
        step's 1/(σ + ε) scales the gradient at its optimizer step), and the samples of `samples` the clamp may
        still touch (0 now, trained once the step is scored). Once every reward is in, every value is final."""
        cfg, scores = self.advantage_cfg, self._scores[step]
        n = len(self.step_batch(step))
        pool = self._pool(step, samples)
        a = centred_rewards({i: scores[i] for i in pool}, self.step_batch(step).non_tensor_batch["uid"],
                            cfg.timesteps_per_sample)
        if len(scores) >= n:
            scale = step_scale(list(scores.values()), cfg)
            return {i: late_advantage(a[i], scale, cfg) if i in a else 0.0 for i in pool}, []
        bound = std_lower_bound(list(scores.values()), n, cfg)
        now = {i: a[i] if i in a and certainly_unclamped(a[i], bound, cfg) else 0.0 for i in pool}
        return now, [s for s in samples if s in a and not certainly_unclamped(a[s], bound, cfg)]

    def loss_denominator(self, task: Task) -> float:
        """The loss of every UPDATE of a step is a sum over its rows divided by its mini-batch's rows (the step's
        samples / mini_batches_per_step, x K), so any cut of a mini-batch into micro-batches (GAP groups, colocated
        chunks, TSP chunks) accumulates the gradient of the mean loss over the mini-batch (verl's normalisation
        per optimizer step)."""
        return float(len(self.step_batch(task.step)) // self.mini_batches_per_step * self.rows_per_sample)

    def _update(self, task: Task) -> _InFlight:
        """UPDATE: each rank of the assignment (colocated: the plan's split of the micro-batch; disaggregated: even
        shares over the trainer pool) runs forward/backward over its samples; gradients accumulate until OPT_STEP."""
        f = _InFlight(task, self.now(), [], [])
        every = [s for _, samples in task.assignment for s in samples]
        adv_of, late = {}, []
        if every and self.advantage_cfg.deferred_std:
            adv_of, late = self._deferred_map(task.step, every)
        elif every:
            adv_of = self._advantage_map(task.step, every)  # one normalisation for all ranks
        if late:
            self._late[task.step].append((task, tuple(late)))
        self._submit_update(task, adv_of, f)
        return f

    def _submit_update(self, task: Task, adv_of: Mapping[int, float], f: _InFlight) -> None:
        """The UPDATE calls of `task` (every rank of its assignment) with the advantages `adv_of` (0 for a sample it
        does not name), tracked by `f`."""
        denominator = self.loss_denominator(task)
        max_share = max(len(samples) for _, samples in task.assignment)
        for worker, samples in task.assignment:
            message = pack(list(samples), [float(adv_of.get(s, 0.0)) for s in samples], denominator,
                           "tsp" in task.flags, task.version, max_share)
            f.add(self.workers[worker].update_call.remote(
                message, *(self._refs_for(self._trajectories, task.step, samples) if samples else [])), worker)

    def _opt_step(self, task: Task) -> _InFlight:
        """OPT_STEP. Deferred global std: first the step's samples the clamp might have touched are trained with their
        final values (`_late_updates`), then every rank's optimizer step scales the accumulated gradient by
        1/(σ + ε) (calls on one actor run in order). The optimizer steps' results come first."""
        f = _InFlight(task, self.now(), [], [])
        if not self.advantage_cfg.deferred_std:
            for worker in task.workers:
                f.add(self.workers[worker].opt_step.remote(task.version), worker)
            return f
        if len(self._scores[task.step]) < len(self.step_batch(task.step)):
            raise RuntimeError(f"step {task.step}: OPT_STEP before the step's last reward with the deferred global "
                               "std (internal schedule error: ScheduleConfig.opt_waits_for_step is off)")
        scale = self._grad_scale.setdefault(task.step, gradient_scale(step_scale(
            list(self._scores[task.step].values()), self.advantage_cfg)))
        late = _InFlight(task, self.now(), [], [])
        self._late_updates(task, late)
        for worker in task.workers:
            f.add(self.workers[worker].opt_step.remote(task.version, scale), worker)
        for ref in late.result_refs:
            f.add(ref, late.workers_of_ref[ref])
        return f

    def _late_updates(self, opt: Task, f: _InFlight) -> None:
        """One UPDATE call per trainer rank of `opt` over all of the step's late samples together (their first
        UPDATEs gave them 0), spread evenly, each with its final value; a rank left without one trains a late sample
        with advantage 0 (no gradient; every rank runs a pass, as lock-step ranks must)."""
        recorded = self._late.pop(opt.step, [])
        late = sorted({s for _, samples in recorded for s in samples})
        if not late:
            return
        final, _ = self._deferred_map(opt.step, late)
        trainers = list(opt.workers)
        shares = [late[i::len(trainers)] for i in range(len(trainers))]
        update = recorded[0][0]  # the step's UPDATE arguments: its flags and version
        denominator, max_share = self.loss_denominator(update), max(len(x) for x in shares)
        for worker, share in zip(trainers, shares):
            samples, values = (share, [float(final[s]) for s in share]) if share else ([late[0]], [0.0])
            message = pack(samples, values, denominator, "tsp" in update.flags, update.version, max_share)
            f.add(self.workers[worker].update_call.remote(
                message, *self._refs_for(self._trajectories, opt.step, samples)), worker)
        self.late_samples += len(late)

    def _report(self, task: Task, values: list) -> None:
        """`on_result`, with the deferred global std's UPDATE results held until the step's 1/(σ + ε) is known (at
        its OPT_STEP) and their loss sums scaled by it: the logged losses are the barrier's. The late UPDATEs add only
        their loss sums (their rows were counted by their first UPDATE; a padding row adds 0)."""
        if not self.advantage_cfg.deferred_std or task.kind not in (TaskKind.UPDATE, TaskKind.OPT_STEP):
            self.on_result(task, values)
            return
        if task.kind == TaskKind.UPDATE:
            self._held[task.step].append((task, values))
            return
        opts, late = values[:len(task.workers)], values[len(task.workers):]
        scale = self._grad_scale[task.step]
        held = self._held.pop(task.step, [])
        if late:
            held.append((held[0][0] if held else task, [{k: v[k] for k in ("pg_sum", "loss_sum")} for v in late]))
        for update, vals in held:
            self.on_result(update, [{**v, **{k: v[k] * scale for k in ("pg_sum", "loss_sum", "kl_sum") if k in v}}
                                    for v in vals])
        self.on_result(task, opts)
        if "minibatch" not in task.flags:
            self._grad_scale.pop(task.step, None)

    def _sync(self, task: Task) -> _InFlight:
        f = _InFlight(task, self.now(), [], [])
        generators = [worker_rank(w) for w in task.workers if worker_pool(w) == "gen"]
        for worker in task.workers:
            if worker_pool(worker) == "gen":
                f.add(self.workers[worker].receive_weights.remote(task.version), worker)
            else:
                f.add(self.workers[worker].send_weights.remote(task.version, generators), worker)
        return f


    def _checkpoint(self, task: Task) -> _InFlight:
        def missing(_: Task) -> None:
            raise RuntimeError("RayExecutor got a CHECKPOINT task but no on_checkpoint callback (pass the runner's "
                               "DigenRLTrainer.on_checkpoint)")

        return _InFlight(task, self.now(), [], [], call=self.on_checkpoint or missing)


def _raises(ref, exc_type) -> bool:
    try:
        ray.get(ref, timeout=0)
    except exc_type:
        return True
    except Exception:
        return False
    return False
