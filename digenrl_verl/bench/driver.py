"""Driver throughput on real Ray: ``python -m digenrl_verl.bench driver [--json] [--actors 8,32,64] [--profile]``.

The real `schedule.driver.Driver` drives the real `trainer.ray_executor.RayExecutor` over no-op worker actors
(`bench.noop_workers`: the real workers' methods, answering at once; `num_cpus=0`, so any number fits on this
machine) in disaggregated mode: 1 trainer rank per 8 actors, the rest generators, GAP lanes of `n` ranks, TAG off,
staleness 0, `--steps` global steps of 4 micro-batches per lane, the first step a warm-up (not measured). Each row
reports task completions, actor calls (round trips) and driver decisions per second, and where the wall time of
the measured steps went:

- ``decision_s``: the driver's own time (`Driver.stats.wall_s`) less the executor's `submit`: planning,
  selection, queues, trace;
- ``submit_s``: the executor building each call's arguments (shards, advantages, packed in one message each) and
  `.remote`;
- ``wait_s``: blocked in `ray.wait` for the next ready ref (the workers' and Ray's round trip);
- ``probe_s``: collecting the other ready refs; ``get_s``: `ray.get` of the results (object transfer back);
- ``complete_s``: absorbing results (scores); ``other_s``: the rest (the loop, timestamps).

The machine's limits, measured on the same actors right after the driver ran, with no driver at all (`ceilings`):

- ``ray_ceiling_calls_per_s``: bare Ray round trips (one no-op call in flight per actor, the executor's
  two-`ray.wait` turn, `ray.get`, resubmit): the task rate a dispatch of one actor call per task could reach;
- ``ray_lane_ceiling_tasks_per_s``: tasks of one call per rank over the run's groups (each GAP lane, the trainer
  ranks), one in flight per group, each call `ready()` (no argument, one small return): Ray's own lane ceiling;
- ``ray_call_lane_ceiling_tasks_per_s``: the same lanes making the driver's calls with their content
  (`DriverCalls`: GEN with a shard and three returns, SCORE and UPDATE with their arguments and refs, each call's plain
  arguments in one message as the executor sends them): Ray's own rate for these calls, no driver;
- ``ray_schedule_ceiling_tasks_per_s``: the driver run's own tasks replayed with no driver (`schedule_of`,
  `ray_schedule_round_trips`): in issue order, each task issued as soon as the tasks that had completed when the driver
  issued it have completed, each a `ready()` call on every worker it called: the same dependencies (a SCORE after its
  GEN, the step barrier: OPT_STEP, SYNC), task mix and one-task-per-worker as the driver's run, none of its decisions
  or data; replayed for at least ``--ceiling-s``. The lane ceilings have neither barrier nor dependency, and their
  trainer group runs 1 task in 8 where the driver's runs a third of them (the UPDATEs), one at a time;
- with lane leaders (the default; ``--no-leaders``), the same driver on `trainer.lane_leaders.LeaderRayExecutor`
  (``leaders``: its figures; ``leaders_tasks_per_s``), and the same ceilings through the same leaders, so a ratio
  compares like with like: ``ray_leader_lane_ceiling_tasks_per_s`` (each group's task one `fan` call of `ready()`
  to its leader), ``ray_leader_call_lane_ceiling_tasks_per_s`` (`LeaderDriverCalls`: the driver's calls through the
  leaders), ``ray_leader_schedule_ceiling_tasks_per_s`` (the leader run's tasks replayed, one `fan` per leader);
- with ``--cgraph``, the static fan-out (`receive_weights(version)` on every rank of each group, as a SYNC) plain
  (``plain_fanout_tasks_per_s``) and as Ray Compiled Graphs (``cgraph_lane_executions_per_s``: shared-memory channels
  instead of a call per rank, one graph per group), and ``lane_ceiling_idle_cgraph_tasks_per_s``: the plain lane
  ceiling while a compiled graph over every actor is kept, idle (what keeping a compiled SYNC costs the other calls).

``calls_per_task`` = actor calls / tasks: the task rate is at most ``ray_ceiling_calls_per_s`` / ``calls_per_task``.
``vs_lane_ceiling``, ``vs_call_lane_ceiling``, ``vs_schedule_ceiling``: the driver's task rate over those ceilings,
each within one run (``leaders_vs_*``: the driver on leaders over the plain ceilings and over its leader ceilings);
``vs_lane_ceiling_calls`` and ``vs_call_lane_ceiling_calls``: its actor calls per second over theirs (the ceilings' task
mix differs from the driver's: at 8 actors most of their tasks are the lone trainer rank's one-call tasks; calls/s
compares them at the driver's calls per task).
Each row runs `--repeat` times (driver, driver on leaders, then the ceilings) on the same actors; the row's figures
are the run of median rate, ``medians`` the medians over its runs, ``runs`` every run with the load average at its
start and end.

``driver_cpu_s`` is the CPU time the driver process used meanwhile (all its threads, Ray's included):
``cpu_share`` = CPU / wall shows how much of a core it got on a shared machine, and ``tasks_per_cpu_s`` the
completions per second of driver CPU, the rate a driver with a core of its own would approach while the actors
keep up.

Goal: >= 500 task completions/s at 64 actors, the driver's decisions a small share of the wall time.
The bench hands the actors a numpy step batch (the advantages travel as floats; the no-op `update_call` makes them
numpy), so the actor processes never import torch (see `bench.noop_workers`).
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from typing import Any, Callable

import numpy as np
import ray
from ray.dag import InputNode, MultiOutputNode

from digenrl_verl.bench.noop_workers import NoopWorker, StepBatch
from digenrl_verl.diffusion.advantages import AdvantageConfig
from digenrl_verl.schedule.config import PoolSpec, ScheduleConfig, TagConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.plan import GapPlanner
from digenrl_verl.schedule.types import TaskKind, worker_pool
from digenrl_verl.trainer.lane_leaders import LeaderRayExecutor, start_leaders
from digenrl_verl.trainer.ray_executor import RayExecutor
from digenrl_verl.trainer.ray_runtime import init_local_ray
from digenrl_verl.workers.calls import pack

ACTORS = (8, 32, 64)
TARGET_TASKS_PER_S = 500.0
TARGET_VS_LANE_CEILING = 0.9  # issue 31: the driver's task rate over Ray's `ready()` lane ceiling, at every row
MB_PER_LANE = 4  # micro-batches (prompt groups) per lane and step
CEILING_S = 3.0  # seconds of each ceiling measurement per row (after a warm-up)
CGRAPH_WARMUP_TIMEOUT_S = 120.0
CEILING_KEYS = ("ray_ceiling_calls_per_s", "ray_lane_ceiling_tasks_per_s", "ray_call_lane_ceiling_tasks_per_s",
                "ray_lane_ceiling_calls_per_s", "ray_call_lane_ceiling_calls_per_s",
                "ray_leader_lane_ceiling_tasks_per_s", "ray_leader_call_lane_ceiling_tasks_per_s",
                "ray_schedule_ceiling_tasks_per_s", "ray_leader_schedule_ceiling_tasks_per_s",
                "plain_fanout_tasks_per_s", "cgraph_lane_executions_per_s", "lane_ceiling_idle_cgraph_tasks_per_s")
RATIOS = {"vs_lane_ceiling": ("tasks_per_s", "ray_lane_ceiling_tasks_per_s"),
          "vs_call_lane_ceiling": ("tasks_per_s", "ray_call_lane_ceiling_tasks_per_s"),
          "vs_lane_ceiling_calls": ("calls_per_s", "ray_lane_ceiling_calls_per_s"),
          "vs_call_lane_ceiling_calls": ("calls_per_s", "ray_call_lane_ceiling_calls_per_s"),
          "vs_schedule_ceiling": ("tasks_per_s", "ray_schedule_ceiling_tasks_per_s"),
          "leaders_vs_lane_ceiling": ("leaders_tasks_per_s", "ray_lane_ceiling_tasks_per_s"),
          "leaders_vs_schedule_ceiling": ("leaders_tasks_per_s", "ray_schedule_ceiling_tasks_per_s"),
          "leaders_vs_leader_schedule_ceiling": ("leaders_tasks_per_s", "ray_leader_schedule_ceiling_tasks_per_s"),
          "leaders_vs_leader_lane_ceiling": ("leaders_tasks_per_s", "ray_leader_lane_ceiling_tasks_per_s"),
          "leaders_vs_leader_call_lane_ceiling": ("leaders_tasks_per_s", "ray_leader_call_lane_ceiling_tasks_per_s")}
"""ratio -> (the driver's rate, the ceiling it is divided by), both from the same run. The `_calls` ratios count actor
calls, not tasks: the ceilings' groups finish tasks of different sizes at different rates (at 8 actors a lane of 7
ranks beside one trainer rank, whose one-call tasks are most of the ceiling's), so their tasks/s holds a task mix other
than the driver's; calls/s is the ceiling's task rate at the driver's calls per task."""
TIME_KEYS = ("decision_s", "submit_s", "wait_s", "probe_s", "get_s", "complete_s", "other_s")


def shape_of(actors: int, n: int) -> dict[str, int]:
    """Pool sizes, lanes and prompts per step for `actors` no-op actors."""
    if actors < 2:
        raise ValueError(f"--actors: {actors} is too few; a disaggregated run needs a generator and a trainer")
    trainers = max(1, actors // 8)
    generators = actors - trainers
    lanes = len(GapPlanner().lanes([f"gen:{i}" for i in range(generators)], n))
    return {"actors": actors, "generators": generators, "trainers": trainers, "lanes": lanes,
            "prompts_per_step": MB_PER_LANE * lanes}


def ray_round_trips(actors: list, seconds: float) -> dict[str, float]:
    """Bare Ray round trips per second over `actors` (no driver): `ray_lane_round_trips` with one actor per group,
    so each actor keeps one no-op call (`ready`) in flight."""
    out = ray_lane_round_trips([[a] for a in actors], seconds)
    return {"calls": out["tasks"], "wall_s": out["wall_s"], "calls_per_s": out["tasks_per_s"]}


def ray_lane_round_trips(groups: list[list], seconds: float,
                         call: Callable[[int, list], list] | None = None) -> dict[str, float]:
    """Bare Ray tasks per second when a task is one call per rank of a group (a GEN or SCORE on a GAP lane, an
    UPDATE on the trainer ranks), no driver: each group keeps one task in flight, done when all its ranks answered,
    then resubmitted. A turn blocks in `ray.wait` for the first ready ref, collects every other ready one, `ray.get`s
    them and resubmits. `call(g, ranks)` makes group g's calls and returns the refs to wait on (default: `ready()`
    on each rank, no argument, one small return)."""
    call = call or (lambda g, ranks: [a.ready.remote() for a in ranks])
    ray.get([a.ready.remote() for g in groups for a in g])  # warm-up round
    owner: dict = {}
    left: dict[int, int] = {}

    def issue(g: int) -> None:
        refs = call(g, groups[g])
        for ref in refs:
            owner[ref] = g
        left[g] = len(refs)

    for g in range(len(groups)):
        issue(g)
    tasks, calls, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        refs = list(owner)
        ray.wait(refs, num_returns=1, fetch_local=False)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        ray.get(ready)
        calls += len(ready)
        for ref in ready:
            g = owner.pop(ref)
            left[g] -= 1
            if left[g] == 0:
                tasks += 1
                issue(g)
    wall = time.perf_counter() - start
    ray.get(list(owner))
    return {"tasks": tasks, "calls": calls, "wall_s": wall, "tasks_per_s": tasks / wall, "calls_per_s": calls / wall}


def schedule_of(completions: list, since: float) -> list[tuple[tuple[str, ...], int, int]]:
    """The tasks a driver run issued from `since` on (executor time), in issue order: (the workers it called, how many
    of these tasks had completed when it was issued, its own place in their completion order). A replay that issues
    each task once the tasks completed before it are (`ray_schedule_round_trips`) keeps every dependency the driver
    waited for, and adds none."""
    measured = sorted((c for c in completions if c.start >= since), key=lambda c: (c.start, c.task.task_id))
    by_end = sorted(range(len(measured)), key=lambda i: measured[i].end)
    place = {i: p for p, i in enumerate(by_end)}
    ends = [measured[i].end for i in by_end]
    return [(_called(c.task), bisect.bisect_right(ends, c.start), place[i]) for i, c in enumerate(measured)]


def _called(task: Any) -> tuple[str, ...]:
    """The workers `RayExecutor` makes a call on for `task` (an UPDATE calls every rank of its assignment)."""
    named = tuple(w for w, samples in task.assignment if samples or task.kind == TaskKind.UPDATE)
    return named or tuple(task.workers)


def ray_schedule_round_trips(schedule: list[tuple[tuple[str, ...], int, int]],
                             call: Callable[[tuple[str, ...]], list]) -> dict[str, float]:
    """Ray's own rate for a driver run's schedule, no driver: its tasks (`schedule_of`) replayed in issue order, each
    issued once the tasks that had completed when the driver issued it have completed here (the schedule's
    dependencies: a lane's SCORE after its GEN, the step barrier, one task per worker), each task `call(workers)` (its
    refs to wait on); the wait turn of `ray_lane_round_trips`."""
    done = [False] * len(schedule)  # by the driver run's completion order
    owner: dict = {}
    left: dict[int, int] = {}
    prefix, nxt = 0, 0  # the driver run's first `prefix` completions are done here; the next task to issue
    start = time.perf_counter()
    while nxt < len(schedule) or owner:
        while nxt < len(schedule) and schedule[nxt][1] <= prefix:
            refs = call(schedule[nxt][0])
            owner.update({ref: nxt for ref in refs})
            left[nxt] = len(refs)
            nxt += 1
        refs = list(owner)
        ray.wait(refs, num_returns=1, fetch_local=False)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        ray.get(ready)
        for ref in ready:
            t = owner.pop(ref)
            left[t] -= 1
            if left[t] == 0:
                done[schedule[t][2]] = True
        while prefix < len(done) and done[prefix]:
            prefix += 1
    wall = time.perf_counter() - start
    return {"tasks": len(schedule), "wall_s": wall, "tasks_per_s": len(schedule) / wall}


def replay_ceiling(schedule: list[tuple[tuple[str, ...], int, int]], call: Callable[[tuple[str, ...]], list],
                   seconds: float) -> float:
    """`ray_schedule_round_trips` of `schedule` over and over for at least `seconds` (after one warm-up replay):
    tasks per second."""
    ray_schedule_round_trips(schedule, call)
    tasks, wall = 0, 0.0
    while wall < seconds:
        out = ray_schedule_round_trips(schedule, call)
        tasks, wall = tasks + out["tasks"], wall + out["wall_s"]
    return tasks / wall


def _fan_ready(leader_of: dict[str, Any], workers: tuple[str, ...]) -> list:
    """`ready()` on each of `workers` through their lane leaders: one `fan` call per leader."""
    groups: dict[int, tuple[Any, list]] = {}
    for w in workers:
        groups.setdefault(id(leader_of[w]), (leader_of[w], []))[1].append((w, "ready", ()))
    return [leader.fan.remote(calls) for leader, calls in groups.values()]


class DriverCalls:
    """`ray_lane_round_trips`' calls with the content of the driver's: each GAP lane alternates a GEN
    (`generate_call(shard, pack(sample_ids, version))`, three returns, the facts waited on) and a SCORE of its decoded
    samples (`score_call(pack(sample_ids), images_ref)`), one sample per rank (a group of n on a lane of n ranks, as
    the bench's micro-batches); the trainer ranks (the last group) run UPDATEs (`update_call(pack(sample_ids,
    advantages, denominator, tsp, version, max_share), trajectory_ref)`) of lane 0's trajectories. The same calls as
    the executor's (`workers.calls` messages: a `StepBatch` shard, advantages as floats), no driver: Ray's own rate
    for the driver's calls. SYNC and OPT_STEP (one int argument each; 2 of a step's tasks) are left out."""

    def __init__(self, lanes: int, batch: StepBatch) -> None:
        self.lanes, self.batch = lanes, batch
        self.turns = [0] * lanes
        self.images: dict[int, Any] = {}  # actor index in its lane -> its latest decoded samples (ref)
        self.trajectories: dict[int, Any] = {}  # rank of lane 0 -> its latest trajectory (ref)
        self.generate: dict[Any, Any] = {}

    def __call__(self, g: int, ranks: list) -> list:
        if g >= self.lanes:  # the trainer ranks: UPDATE, trajectories by reference
            traj = [self.trajectories[r % len(self.trajectories)] for r in range(len(ranks))]
            return [a.update_call.remote(pack([r], [0.0], float(len(ranks)), False, 0, 1), t)
                    for r, (a, t) in enumerate(zip(ranks, traj))]
        self.turns[g] += 1
        if self.turns[g] % 2 == 0:  # SCORE of the lane's last GEN
            return [a.score_call.remote(pack([r]), self.images[(g, r)]) for r, a in enumerate(ranks)]
        refs = []
        for r, a in enumerate(ranks):
            method = self.generate.get(a)
            if method is None:
                method = self.generate[a] = a.generate_call.options(num_returns=3)
            traj, images, facts = method.remote(self.batch.select_idxs(np.asarray([r], dtype=np.int64)), pack([r], 0))
            self.images[(g, r)] = images
            if g == 0:
                self.trajectories[r] = traj
            refs.append(facts)
        return refs


class LeaderDriverCalls(DriverCalls):
    """`DriverCalls` made as `LeaderRayExecutor` makes them: one call per group and task to the group's lane leader
    (`heads[g]`, its workers `names[g]`), which makes the rank calls (a GEN's shards cut by the leader from the step
    batch, put once), no driver: Ray's own rate for the driver's calls through the same leaders. A lane's SCORE reads
    the decoded-sample refs of its GEN's answer (ready by then); the UPDATEs read lane 0's latest trajectories."""

    def __init__(self, lanes: int, batch: StepBatch, heads: list, names: list[list[str]]) -> None:
        super().__init__(lanes, batch)
        self.heads, self.names = heads, names
        self.box = [ray.put(batch)]
        self.answers: dict[int, Any] = {}  # lane -> its last GEN's answer (ref)
        self.traj_list: list = []

    def __call__(self, g: int, ranks: list) -> list:
        names, head = self.names[g], self.heads[g]
        if g >= self.lanes:  # the trainer ranks: UPDATE, lane 0's trajectories by reference
            if not self.traj_list:
                self.traj_list = [a[0] for a in ray.get(self.answers[0])]
            calls = [(w, "update_call", (pack([r], [0.0], float(len(names)), False, 0, 1),
                                         self.traj_list[r % len(self.traj_list)])) for r, w in enumerate(names)]
            return [head.fan.remote(calls)]
        self.turns[g] += 1
        if self.turns[g] % 2 == 0:  # SCORE of the lane's last GEN (answered: the lane's task is done)
            answer = ray.get(self.answers[g])
            if g == 0:
                self.traj_list = [a[0] for a in answer]
            return [head.fan.remote([(w, "score_call", (pack([r]), a[1]))
                                     for r, (w, a) in enumerate(zip(names, answer))])]
        ref = head.generate.remote(0, self.box, [(w, [r], pack([r], 0)) for r, w in enumerate(names)])
        self.answers[g] = ref
        return [ref]


def groups_of(workers: dict[str, Any], n: int) -> list[list[str]]:
    """The run's groups of worker ids: its GAP lanes of `n` generators (the planner's), then the trainer ranks."""
    gens = [w for w in workers if worker_pool(w) == "gen"]
    return [list(lane) for lane in GapPlanner().lanes(gens, n)] + [[w for w in workers if worker_pool(w) == "trn"]]


def cgraph_lane_executions(groups: list[list], seconds: float) -> dict[str, float]:
    """Ray Compiled Graphs (shared-memory channels, no per-call RPC) over the same groups: one graph per group
    (`receive_weights` on every rank, outputs gathered), executed round-robin, one execution in flight per graph.
    Executions per second after a warm-up of 3 each (the first one takes seconds here); then torn down, since an actor
    takes part in one compiled graph at a time."""
    dags = []
    try:
        for group in groups:
            with InputNode() as inp:
                dags.append(MultiOutputNode([a.receive_weights.bind(inp) for a in group]).experimental_compile())
        for _ in range(3):
            for dag in dags:
                ray.get(dag.execute(0), timeout=CGRAPH_WARMUP_TIMEOUT_S)
        refs = [dag.execute(0) for dag in dags]
        execs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for i, dag in enumerate(dags):
                ray.get(refs[i])
                refs[i] = dag.execute(0)
                execs += 1
        wall = time.perf_counter() - start
        for r in refs:
            ray.get(r)
    finally:
        for dag in dags:
            dag.teardown()
    return {"executions": execs, "wall_s": wall, "executions_per_s": execs / wall}


def run_case(actors: int, steps: int, n: int, profile: bool = False, ceiling_s: float = CEILING_S,
             cgraph: bool = False, repeat: int = 1, leaders: bool = True) -> dict[str, Any]:
    """One row: start the actors (and with `leaders` one lane leader per group), then `repeat` times: the driver with
    `RayExecutor` (a warm-up step, `steps - 1` measured), the driver with `LeaderRayExecutor` (the same), and the
    ceilings on the same actors right after them. The row's figures are the run of median driver rate (its time
    accounting adds up); `medians` has the median over the runs of the rates, every ceiling and every ratio (each
    ratio is taken within its run: driver and ceiling minutes apart, under the same load)."""
    shape = shape_of(actors, n)
    t0 = time.perf_counter()
    remote = ray.remote(NoopWorker).options(num_cpus=0)
    workers = {f"gen:{i}": remote.remote(i) for i in range(shape["generators"])}
    workers.update({f"trn:{i}": remote.remote(1000 + i) for i in range(shape["trainers"])})
    ray.get([w.ready.remote() for w in workers.values()])
    leader_of = start_leaders(workers, groups_of(workers, n)) if leaders else None
    startup_s = time.perf_counter() - t0
    runs = []
    try:
        for _ in range(repeat):
            runs.append(_run(workers, leader_of, shape, steps, n, profile, ceiling_s, cgraph))
    finally:
        for w in [*workers.values(), *{id(h): h for h in (leader_of or {}).values()}.values()]:
            ray.kill(w)
    row = sorted(runs, key=lambda r: r["tasks_per_s"])[(len(runs) - 1) // 2]
    keys = ("tasks_per_s", "calls_per_s", "leaders_tasks_per_s", *CEILING_KEYS, *RATIOS)
    return {**shape, "n": n, "steps_measured": steps - 1, "startup_s": startup_s, "repeat": repeat, **row,
            "medians": {k: statistics.median(r[k] for r in runs) for k in keys if k in row},
            "runs": [{k: r[k] for k in (*keys, "load_avg_start", "load_avg_end") if k in r} for r in runs]}


def _run(workers: dict[str, Any], leader_of: dict[str, Any] | None, shape: dict[str, int], steps: int, n: int,
         profile: bool, ceiling_s: float, cgraph: bool) -> dict[str, Any]:
    """One run of a row: the driver on `RayExecutor`, then (with leaders) on `LeaderRayExecutor` (its figures under
    `leaders`), then the ceilings; the ratios of this run."""
    load = os.getloadavg()[0]
    run = measure_driver(workers, shape, steps, n, profile)
    plain = lambda ws: [workers[w].ready.remote() for w in ws]  # noqa: E731
    replays = {"ray_schedule_ceiling_tasks_per_s": (run.pop("_schedule"), plain)}
    if leader_of is not None:
        led = measure_driver(workers, shape, steps, n, profile, leader_of)
        replays["ray_leader_schedule_ceiling_tasks_per_s"] = (led.pop("_schedule"),
                                                              lambda ws: _fan_ready(leader_of, ws))
        run["leaders"] = led
        run["leaders_tasks_per_s"] = led["tasks_per_s"]
    run.update(ceilings(workers, n, ceiling_s, cgraph, leader_of))
    for key, (schedule, call) in replays.items():
        run[key] = replay_ceiling(schedule, call, ceiling_s)
    for key, (rate, ceiling) in RATIOS.items():
        if rate in run and ceiling in run:
            run[key] = run[rate] / run[ceiling]
    return {**run, "load_avg_start": load, "load_avg_end": os.getloadavg()[0]}


def ceilings(workers: dict[str, Any], n: int, seconds: float, cgraph: bool,
             leader_of: dict[str, Any] | None = None) -> dict[str, float]:
    """The machine's limits on these actors, no driver: bare round trips (one call per task), tasks of one call per
    rank over the run's groups (its GAP lanes and the trainer ranks): `ready()` calls, and the driver's calls
    (`DriverCalls`). With `leader_of` (worker -> its lane leader), the same two through the leaders: one call per
    group and task, the leader making the rank calls (`fan` of `ready()`, and `LeaderDriverCalls`). With `cgraph`,
    the static fan-out (`receive_weights(version)` on every rank of each group, as a SYNC) plain and as compiled
    graphs, and the plain lane ceiling while a compiled graph is kept on every actor (what keeping one costs every
    other call)."""
    names = groups_of(workers, n)
    groups = [[workers[w] for w in g] for g in names]
    batch = StepBatch.of(MB_PER_LANE * (len(groups) - 1), n)
    bare = ray_round_trips(list(workers.values()), seconds)["calls_per_s"]
    lane = ray_lane_round_trips(groups, seconds)
    call_lane = ray_lane_round_trips(groups, seconds, DriverCalls(len(groups) - 1, batch))
    out = {"ray_ceiling_calls_per_s": bare,
           "ray_lane_ceiling_tasks_per_s": lane["tasks_per_s"], "ray_lane_ceiling_calls_per_s": lane["calls_per_s"],
           "ray_call_lane_ceiling_tasks_per_s": call_lane["tasks_per_s"],
           "ray_call_lane_ceiling_calls_per_s": call_lane["calls_per_s"]}
    if leader_of is not None:
        heads = [leader_of[g[0]] for g in names]
        fan = lambda g, ranks: [heads[g].fan.remote([(w, "ready", ()) for w in names[g]])]  # noqa: E731
        out["ray_leader_lane_ceiling_tasks_per_s"] = ray_lane_round_trips(groups, seconds, fan)["tasks_per_s"]
        calls = LeaderDriverCalls(len(groups) - 1, batch, heads, names)
        out["ray_leader_call_lane_ceiling_tasks_per_s"] = ray_lane_round_trips(groups, seconds, calls)["tasks_per_s"]
    if cgraph:
        fanout = lambda g, ranks: [a.receive_weights.remote(0) for a in ranks]  # noqa: E731
        out["plain_fanout_tasks_per_s"] = ray_lane_round_trips(groups, seconds, fanout)["tasks_per_s"]
        out["cgraph_lane_executions_per_s"] = cgraph_lane_executions(groups, seconds)["executions_per_s"]
        out["lane_ceiling_idle_cgraph_tasks_per_s"] = lane_ceiling_beside_cgraph(groups, seconds)
    return out


def lane_ceiling_beside_cgraph(groups: list[list], seconds: float) -> float:
    """`ray_lane_round_trips` (plain `ready()` calls) while one compiled graph over every actor (`receive_weights`
    on each, a SYNC's fan-out) is compiled and idle, as an executor that kept a compiled SYNC would leave it between
    two steps: each actor's compiled-graph loop then runs beside its plain calls."""
    with InputNode() as inp:
        dag = MultiOutputNode([a.receive_weights.bind(inp) for g in groups for a in g]).experimental_compile()
    try:
        ray.get(dag.execute(0), timeout=CGRAPH_WARMUP_TIMEOUT_S)
        return ray_lane_round_trips(groups, seconds)["tasks_per_s"]
    finally:
        dag.teardown()


def measure_driver(workers: dict[str, Any], shape: dict[str, int], steps: int, n: int, profile: bool,
                   leader_of: dict[str, Any] | None = None) -> dict[str, Any]:
    """The real driver and executor over `workers`: one warm-up step, then `steps - 1` measured. With `leader_of`
    (worker -> its lane leader) the executor is `LeaderRayExecutor`, else `RayExecutor`."""
    config = ScheduleConfig(mode="disaggregated", tag=TagConfig(policy="off"), num_steps=steps, n=n,
                            prompts_per_step=shape["prompts_per_step"],
                            pools={"gen": PoolSpec(shape["generators"]), "trn": PoolSpec(shape["trainers"])})
    batch = StepBatch.of(config.prompts_per_step, n)
    args = (workers, lambda step: batch, AdvantageConfig(global_std=False))
    executor = (RayExecutor(*args, loss_rows_per_sample=1) if leader_of is None
                else LeaderRayExecutor(*args, loss_rows_per_sample=1, leaders=leader_of))
    driver = Driver(config, executor)
    driver.run_steps(1)  # warm-up: first calls on every actor, cost estimates
    before, since = _counters(driver, executor), executor.now()
    prof = cProfile.Profile() if profile else None
    start, cpu_start = time.perf_counter(), time.process_time()
    if prof is not None:
        prof.enable()
    driver.run()
    if prof is not None:
        prof.disable()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    after = _counters(driver, executor)
    d = {k: after[k] - before[k] for k in after}
    times = {"decision_s": d["driver_s"] - d["submit_s"], "submit_s": d["submit_s"], "wait_s": d["wait_s"],
             "probe_s": d["probe_s"], "get_s": d["get_s"], "complete_s": d["complete_s"]}
    times["other_s"] = max(0.0, wall - sum(times.values()))
    row: dict[str, Any] = {
        "wall_s": wall, "tasks": d["tasks"], "actor_calls": d["calls"], "rank_calls": d["rank_calls"],
        "decisions": d["decisions"], "calls_per_task": d["calls"] / max(d["tasks"], 1),
        "waits": d["waits"], "tasks_per_s": d["tasks"] / wall, "calls_per_s": d["calls"] / wall,
        "decisions_per_s": d["decisions"] / wall,
        "us_per_decision": 1e6 * times["decision_s"] / max(d["decisions"], 1),
        "driver_cpu_s": cpu, "cpu_share": cpu / wall, "tasks_per_cpu_s": d["tasks"] / cpu if cpu > 0 else None,
        **times, "shares": {k: v / wall for k, v in times.items()},
    }
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        row["profile_top"] = out.getvalue()
    row["_schedule"] = schedule_of(driver.trace.sorted_completions(), since)  # (for the replay; not reported)
    return row


def _counters(driver: Driver, executor: RayExecutor) -> dict[str, float]:
    s = executor.stats
    return {"driver_s": driver.stats.wall_s, "decisions": driver.stats.decisions, "tasks": s.completions,
            "calls": s.calls, "rank_calls": s.rank_calls, "submit_s": s.submit_s, "wait_s": s.wait_s,
            "probe_s": s.probe_s, "get_s": s.get_s, "complete_s": s.complete_s, "waits": s.waits}


def _actors(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--actors {text!r}: use comma-separated integers, e.g. 8,32,64") from None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m digenrl_verl.bench driver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--actors", type=_actors, default=ACTORS, help="actor counts, comma-separated (8,32,64)")
    parser.add_argument("--steps", type=int, default=6, help="global steps per row, the first a warm-up (>= 2)")
    parser.add_argument("--n", type=int, default=8, help="group size: generator ranks per GAP lane")
    parser.add_argument("--repeat", type=int, default=3,
                        help="driver + ceilings runs per row on the same actors; medians reported, every run kept")
    parser.add_argument("--profile", action="store_true", help="cProfile the measured steps (top 15 by own time)")
    parser.add_argument("--ceiling-s", type=float, default=CEILING_S,
                        help="seconds of each ceiling measurement per row (bare Ray, lanes, compiled graphs)")
    parser.add_argument("--cgraph", action="store_true",
                        help="also measure the static fan-out plain and as Ray Compiled Graphs, and the lane ceiling "
                             "beside an idle compiled graph (loads the machine heavily while it runs)")
    parser.add_argument("--no-leaders", action="store_true",
                        help="leave out the driver on lane leaders (LeaderRayExecutor) and its ceilings")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: needs >= 2 (the first step is a warm-up)")
    if args.ceiling_s <= 0:
        parser.error(f"--ceiling-s {args.ceiling_s}: needs > 0 seconds")
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: needs >= 1")
    for a in args.actors:
        shape_of(a, args.n)
    if not ray.is_initialized():  # (tests run it on their shared Ray instance)
        init_local_ray(num_cpus=2)
    load_start = list(os.getloadavg())
    rows = [run_case(a, args.steps, args.n, args.profile, args.ceiling_s, args.cgraph, args.repeat,
                     leaders=not args.no_leaders) for a in args.actors]
    _print_table(rows)
    head = max(rows, key=lambda r: r["actors"])
    out = {"bench": "driver", "steps": args.steps, "n": args.n, "repeat": args.repeat, "load_avg_start": load_start,
           "load_avg": list(os.getloadavg()), "cpus": os.cpu_count(),
           "rows": [_without_profile(r) for r in rows],
           "headline": {"actors": head["actors"], "tasks_per_s": head["medians"]["tasks_per_s"],
                        "decision_share": head["shares"]["decision_s"], "calls_per_task": head["calls_per_task"],
                        **{k: head["medians"][k] for k in (*CEILING_KEYS, *RATIOS) if k in head["medians"]},
                        "target_tasks_per_s": TARGET_TASKS_PER_S,
                        "meets_target": head["medians"]["tasks_per_s"] >= TARGET_TASKS_PER_S,
                        **_ratio_target(rows)}}
    if args.json:
        print(json.dumps(out))
    return 0


def _ratio_target(rows: list[dict]) -> dict[str, Any]:
    """Issue 31's goal, per row (median `vs_lane_ceiling`) and for the whole run: met when every row meets it, with
    `RayExecutor` or on lane leaders (`leaders_vs_lane_ceiling`, the same `ready()` lanes)."""
    best = {r["actors"]: max(r["medians"][k] for k in ("vs_lane_ceiling", "leaders_vs_lane_ceiling")
                             if k in r["medians"]) for r in rows}
    return {"target_vs_lane_ceiling": TARGET_VS_LANE_CEILING, "best_vs_lane_ceiling_by_actors": best,
            "meets_vs_lane_target": all(v >= TARGET_VS_LANE_CEILING for v in best.values())}


def _without_profile(row: dict) -> dict:
    out = {k: v for k, v in row.items() if k != "profile_top"}
    if "leaders" in out:
        out["leaders"] = {k: v for k, v in out["leaders"].items() if k != "profile_top"}
    return out


def _print_table(rows: list[dict]) -> None:
    """Medians over the runs (rate, ceilings, ratios), then the median run's accounting."""
    nan = float("nan")
    print(f"{'actors':>6} {'lanes':>5} {'tasks/s':>8} {'lane-ce':>8} {'x lane':>6} {'call-ce':>8} {'x call':>6} "
          f"{'sched-ce':>8} {'x sched':>7} {'xlane-c':>7} {'ceiling':>8} {'cgraph':>8} {'call/tk':>7} {'us/dec':>7} "
          f"{'cpu%':>5} {'t/cpu-s':>7} " + " ".join(f"{k[:-2]:>8}" for k in TIME_KEYS))
    for r in rows:
        m = r["medians"]
        print(f"{r['actors']:>6} {r['lanes']:>5} {m['tasks_per_s']:>8.1f} {m['ray_lane_ceiling_tasks_per_s']:>8.1f} "
              f"{m['vs_lane_ceiling']:>6.2f} {m['ray_call_lane_ceiling_tasks_per_s']:>8.1f} "
              f"{m['vs_call_lane_ceiling']:>6.2f} {m['ray_schedule_ceiling_tasks_per_s']:>8.1f} "
              f"{m['vs_schedule_ceiling']:>7.2f} {m['vs_lane_ceiling_calls']:>7.2f} "
              f"{m['ray_ceiling_calls_per_s']:>8.0f} "
              f"{m.get('cgraph_lane_executions_per_s', nan):>8.0f} {r['calls_per_task']:>7.2f} "
              f"{r['us_per_decision']:>7.0f} {r['cpu_share']:>5.0%} {r['tasks_per_cpu_s'] or 0:>7.0f} "
              + " ".join(f"{r['shares'][k]:>8.1%}" for k in TIME_KEYS))
        if "profile_top" in r:
            print(r["profile_top"])
    if any("leaders" in r for r in rows):
        _print_leaders(rows)


def _print_leaders(rows: list[dict]) -> None:
    """The driver on lane leaders: medians of its rate and ratios, then the median run's accounting."""
    nan = float("nan")
    print(f"lane leaders:\n{'actors':>6} {'tasks/s':>8} {'x lane':>6} {'x sched':>7} {'lead-ce':>8} {'x lead':>6} "
          f"{'lcall-ce':>8} {'x lcall':>7} {'lsched-ce':>9} {'x lsched':>8} {'call/tk':>7} {'rank/tk':>7} {'cpu%':>5} "
          f"{'t/cpu-s':>7} " + " ".join(f"{k[:-2]:>8}" for k in TIME_KEYS))
    for r in rows:
        m, led = r["medians"], r.get("leaders")
        if led is None:
            continue
        print(f"{r['actors']:>6} {m['leaders_tasks_per_s']:>8.1f} {m.get('leaders_vs_lane_ceiling', nan):>6.2f} "
              f"{m.get('leaders_vs_schedule_ceiling', nan):>7.2f} "
              f"{m.get('ray_leader_lane_ceiling_tasks_per_s', nan):>8.1f} "
              f"{m.get('leaders_vs_leader_lane_ceiling', nan):>6.2f} "
              f"{m.get('ray_leader_call_lane_ceiling_tasks_per_s', nan):>8.1f} "
              f"{m.get('leaders_vs_leader_call_lane_ceiling', nan):>7.2f} "
              f"{m.get('ray_leader_schedule_ceiling_tasks_per_s', nan):>9.1f} "
              f"{m.get('leaders_vs_leader_schedule_ceiling', nan):>8.2f} {led['calls_per_task']:>7.2f} "
              f"{led['rank_calls'] / max(led['tasks'], 1):>7.2f} {led['cpu_share']:>5.0%} "
              f"{led['tasks_per_cpu_s'] or 0:>7.0f} " + " ".join(f"{led['shares'][k]:>8.1%}" for k in TIME_KEYS))
        if "profile_top" in led:
            print(led["profile_top"])
