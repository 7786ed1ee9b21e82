"""`python -m digenrl_verl.bench driver`: the real driver + Ray executor over no-op actors that take the real workers'
parameters; figures live in the bench's output, never in a test. The shape of its JSON and its time accounting are
checked on its command-line run (test_trainer_bench_smoke_on_cpu.py)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from digenrl_verl.bench import BENCHMARKS
from digenrl_verl.bench import driver as bench_driver
from digenrl_verl.bench.noop_workers import NoopWorker, StepBatch
from digenrl_verl.diffusion.advantages import AdvantageConfig
from digenrl_verl.schedule.config import PoolSpec, ScheduleConfig, TagConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.types import Task, TaskKind
from digenrl_verl.trainer import ray_executor
from digenrl_verl.trainer.ray_executor import RayExecutor, _InFlight
from digenrl_verl.workers.calls import pack, unpack
from digenrl_verl.workers.roles import GeneratorWorker, TrainerWorker

# the methods RayExecutor calls on each role's actors (trainer: TAG generates, scores when no generator is left), and
# the typed methods their message entry points (`workers.calls`) call
EXECUTOR_CALLS = {GeneratorWorker: ("generate_call", "score_call", "receive_weights", "generate", "score"),
                  TrainerWorker: ("generate_call", "score_call", "update_call", "opt_step", "send_weights", "generate",
                                  "score", "update")}


def _params(fn) -> list[tuple[str, object]]:
    # Ray adds a keyword-only `_ray_trace_ctx` to the methods of a class in place once `ray.remote` wrapped it (another
    # test may have started these workers first): not a parameter of the method
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values() if p.name != "_ray_trace_ctx"]


@pytest.mark.parametrize("role", list(EXECUTOR_CALLS), ids=lambda c: c.__name__)
def test_noop_worker_mirrors_the_real_workers_methods(role):
    """The bench's no-op actors take exactly the parameters the real workers' methods take, so the executor's calls
    in the bench are the calls a real run makes."""
    for name in EXECUTOR_CALLS[role]:
        assert _params(getattr(NoopWorker, name)) == _params(getattr(role, name)), f"{role.__name__}.{name}"


def test_driver_bench_is_registered_and_sizes_its_pools():
    assert BENCHMARKS["driver"] == "digenrl_verl.bench.driver"
    assert bench_driver.shape_of(64, 8) == {"actors": 64, "generators": 56, "trainers": 8, "lanes": 7,
                                            "prompts_per_step": 28}
    assert bench_driver.shape_of(8, 8)["lanes"] == 1
    with pytest.raises(ValueError, match="--actors"):
        bench_driver.shape_of(1, 8)
    batch = StepBatch.of(2, 3)
    part = batch.select_idxs([1, 4])
    assert len(batch) == 6 and list(part.non_tensor_batch["uid"]) == ["uid0", "uid1"] and len(part) == 2


@pytest.mark.slow  # starts no-op actors on the session's Ray instance
def test_the_executor_fetches_no_trajectory_or_decoded_sample(ray_session):
    """Data never passes through the driver process: over a whole step (GEN, SCORE, UPDATE, OPT_STEP, SYNC) the
    executor's `ray.get` sees only small results (a GEN's third return, rewards, losses, versions), never a ref it
    keeps for a later task's inputs (trajectories, decoded samples)."""
    import ray

    fetched: list = []
    kept: set = set()

    class Recording(RayExecutor):
        def _get(self, refs: list) -> list:
            kept.update(self._trajectories.values())
            kept.update(self._images.values())
            fetched.extend(refs)
            return super()._get(refs)

    shape = bench_driver.shape_of(4, 2)
    remote = ray.remote(NoopWorker).options(num_cpus=0)
    workers = {f"gen:{i}": remote.remote(i) for i in range(shape["generators"])}
    workers.update({f"trn:{i}": remote.remote(1000 + i) for i in range(shape["trainers"])})
    try:
        config = ScheduleConfig(mode="disaggregated", tag=TagConfig(policy="off"), num_steps=1, n=2,
                                prompts_per_step=shape["prompts_per_step"],
                                pools={"gen": PoolSpec(shape["generators"]), "trn": PoolSpec(shape["trainers"])})
        batch = StepBatch.of(config.prompts_per_step, 2)
        executor = Recording(workers, lambda step: batch, AdvantageConfig(global_std=False), loss_rows_per_sample=1)
        Driver(config, executor).run()
    finally:
        for w in workers.values():
            ray.kill(w)
    assert fetched and kept, "the step generated nothing"
    assert not kept & set(fetched), "trajectories or decoded samples were fetched into the driver"
    gen_facts = [v for v in ray.get(fetched) if isinstance(v, dict) and set(v) == {"samples", "version"}]
    assert sum(v["samples"] for v in gen_facts) == config.prompts_per_step * 2


class _Ref(str):
    """A stand-in object ref (hashable, printable)."""


def _executor_with(tasks: dict[int, list[str]]) -> RayExecutor:
    """A `RayExecutor` (no actors) with OPT_STEP tasks in flight, task id -> the refs it waits on."""
    ex = RayExecutor({}, lambda step: None, AdvantageConfig(global_std=False), loss_rows_per_sample=1)
    for tid, refs in tasks.items():
        f = _InFlight(Task(tid, TaskKind.OPT_STEP, 0, None, (f"trn:{tid}",), 1, flags=frozenset({"minibatch"})),
                      0.0, [], [])
        for r in refs:
            f.add(_Ref(r), f"trn:{tid}")
        ex._inflight[tid] = f
        ex._pending_refs.update({ref: tid for ref in f.waiting})
    return ex


def test_a_wait_asks_for_the_refs_the_closest_task_lacks(monkeypatch):
    """No task ends before every ref it waits on is ready, so the blocking `ray.wait` asks for as many refs as the
    task closest to its end lacks (one wake-up per task, not one per rank), then collects every other ready ref."""
    ex = _executor_with({1: ["a1", "a2", "a3"], 2: ["b1", "b2", "b3", "b4", "b5"]})
    calls = []

    def fake_wait(refs, num_returns, timeout, fetch_local):
        calls.append((num_returns, timeout))
        return [r for r in refs if r in ("a1", "a2", "a3", "b1")][:num_returns if timeout else None], []

    monkeypatch.setattr(ray_executor.ray, "wait", fake_wait)
    monkeypatch.setattr(ray_executor.ray, "get", lambda refs: [{"ok": r} for r in refs])
    done = ex.wait_any(timeout=1.0)
    assert calls[0][0] == 3 and calls[0][1] > 0 and calls[1] == (8, 0)
    assert [c.task.task_id for c in done] == [1] and done[0].ok
    assert ex._inflight[2].waiting == {"b2", "b3", "b4", "b5"} and ex.stats.waits == 1


def test_completions_of_one_turn_share_one_get_and_a_failure_stays_with_its_task(monkeypatch):
    ex = _executor_with({1: ["a1"], 2: ["b1"], 3: ["c1"]})
    gets = []

    def fake_get(refs):
        gets.append(list(refs))
        if "b1" in refs:
            raise RuntimeError("rank b failed")
        return [{"ok": r} for r in refs]

    monkeypatch.setattr(ray_executor.ray, "wait", lambda refs, num_returns, timeout, fetch_local: (list(refs), []))
    monkeypatch.setattr(ray_executor.ray, "get", fake_get)
    done = {c.task.task_id: c for c in ex.wait_any(timeout=1.0)}
    assert gets[0] == ["a1", "b1", "c1"]  # one get for the turn; it raised, so each task fetched its own
    assert done[1].ok and done[3].ok and not done[2].ok and "rank b failed" in done[2].info["reason"]
    ex2 = _executor_with({1: ["a1"], 3: ["c1"]})
    gets.clear()
    assert all(c.ok for c in ex2.wait_any(timeout=1.0)) and gets == [["a1", "c1"]]


class _Method:
    """An actor method that records its `.remote` calls and returns fresh stand-in refs (`num_returns` of them)."""

    def __init__(self, name: str, log: list, num_returns: int = 1) -> None:
        self.name, self.log, self.num_returns = name, log, num_returns

    def options(self, num_returns: int) -> "_Method":
        return _Method(self.name, self.log, num_returns)

    def remote(self, *args):
        refs = [_Ref(f"{self.name}#{len(self.log)}.{i}") for i in range(self.num_returns)]
        self.log.append((self.name, args))
        return tuple(refs) if self.num_returns > 1 else refs[0]


class _RecordingActor:
    def __init__(self, log: list) -> None:
        for name in ("generate_call", "score_call", "update_call", "opt_step", "send_weights", "receive_weights"):
            setattr(self, name, _Method(name, log))


def test_the_data_calls_carry_one_message_and_object_refs_and_the_workers_unpack_it():
    """GEN, SCORE and UPDATE each pass one `bytes` message (Ray sends it as it is; GEN's shard of the step batch
    ahead of it) and then only object refs; the message holds the typed method's plain arguments (sample ids,
    version; advantages as floats), and the real workers' and the no-op workers' entry points call their typed
    method with them (the advantages as fp32 tensor / numpy)."""
    log: list = []
    batch = StepBatch.of(2, 2)
    workers = {"gen:0": _RecordingActor(log), "gen:1": _RecordingActor(log), "trn:0": _RecordingActor(log)}
    ex = RayExecutor(workers, lambda step: batch, AdvantageConfig(global_std=False), loss_rows_per_sample=1)
    gen = (("gen:0", (0, 1)), ("gen:1", (2, 3)))
    ex.submit(Task(0, TaskKind.GEN, 0, 0, ("gen:0", "gen:1"), 0, gen))
    ex.submit(Task(1, TaskKind.SCORE, 0, 0, ("gen:0", "gen:1"), 0, gen))
    ex._scores[0].update({0: 1.0, 1: 0.0, 2: 0.5, 3: 0.25})
    ex.submit(Task(2, TaskKind.UPDATE, 0, 0, ("trn:0",), 0, (("trn:0", (0, 1, 2, 3)),)))
    kept = set(ex._trajectories.values()) | set(ex._images.values())
    assert [name for name, _ in log] == ["generate_call"] * 2 + ["score_call"] * 2 + ["update_call"]
    for name, args in log:  # GEN: its shard first (a DataProto, as Ray passes any argument), then the message
        message, *refs = args[1:] if name == "generate_call" else args
        assert isinstance(message, bytes) and refs == [r for r in refs if r in kept], name
    shard, (ids, version) = log[1][1][0], unpack(log[1][1][1])
    assert list(shard.sample_ids) == [2, 3] and ids == [2, 3] and version == 0
    assert unpack(log[3][1][0]) == ([2, 3],)
    update = unpack(log[4][1][0])
    assert update[0] == [0, 1, 2, 3] and all(type(a) is float for a in update[1]) and update[2:] == (4.0, False, 0, 4)
    assert update[1] == pytest.approx(ex.advantages(0, [0, 1, 2, 3]).tolist())
    # the entry points: the real trainer's (whose `update` verl-omni's worker overrides) and the no-op worker's
    for cls, advantages_type in ((TrainerWorker, torch.Tensor), (NoopWorker, np.ndarray)):
        typed = _TypedMethods()
        for name, args in log:
            getattr(cls, name)(typed, *args)
        g_shard, g_ids, g_version = typed.seen["generate"]
        assert list(g_shard.sample_ids) == [2, 3] and (g_ids, g_version) == ([2, 3], 0)
        assert typed.seen["score"] == ([2, 3], *log[3][1][1:])
        sample_ids, adv, *rest = typed.seen["update"]
        assert isinstance(adv, advantages_type) and str(adv.dtype).endswith("float32"), cls.__name__
        assert sample_ids == update[0] and adv.tolist() == pytest.approx(update[1]) and tuple(rest[:4]) == update[2:]
        assert list(rest[4:]) == list(log[4][1][1:])


class _TypedMethods:
    """Stands in for a worker's typed methods: records the last call of each."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple] = {}

    def generate(self, *args):
        self.seen["generate"] = args

    def score(self, *args):
        self.seen["score"] = args

    def update(self, *args):
        self.seen["update"] = args


def test_a_message_is_bytes_and_round_trips():
    assert unpack(pack([1, 2], [0.5], 3.0, True, 2, 1)) == ([1, 2], [0.5], 3.0, True, 2, 1)
    assert unpack(pack(list(np.arange(3)), [0.1 + 0.2])) == ([0, 1, 2], [0.1 + 0.2])  # numpy ids; floats exact
    with pytest.raises(TypeError, match="bytes"):
        unpack(([1, 2],))
    with pytest.raises(TypeError, match="plain values"):
        pack(object())  # a message never holds what only a pickle could carry


def test_the_schedule_replay_issues_each_task_once_what_it_waited_for_is_done(monkeypatch):
    """`ray_schedule_ceiling_tasks_per_s` replays a driver run's tasks with `ready()` calls: a task is issued once
    the tasks that had completed when the driver issued it are done (its dependencies, whatever they were), and not
    before; the warm-up's tasks are left out."""
    from digenrl_verl.schedule.types import Completion

    def done(tid, kind, workers, start, end, assignment=()):
        return Completion(Task(tid, kind, 0, 0, workers, 0, assignment), start, end, ok=True)

    runs = [done(0, TaskKind.SYNC, ("gen:0",), -2.0, -1.0),  # warm-up: before `since`
            done(1, TaskKind.GEN, ("gen:0", "gen:1"), 0.0, 1.0, (("gen:0", (0,)), ("gen:1", (1,)))),
            done(2, TaskKind.GEN, ("gen:2",), 0.1, 2.0, (("gen:2", (2,)),)),
            done(3, TaskKind.SCORE, ("gen:0", "gen:1"), 1.5, 3.0, (("gen:0", (0,)), ("gen:1", ()))),
            done(4, TaskKind.UPDATE, ("trn:0", "trn:1"), 3.5, 4.0, (("trn:0", (0, 1)), ("trn:1", ())))]
    schedule = bench_driver.schedule_of(runs, since=0.0)
    # (workers called: an UPDATE calls every rank, a SCORE only those with samples; completions before; own place)
    assert schedule == [(("gen:0", "gen:1"), 0, 0), (("gen:2",), 0, 1), (("gen:0",), 1, 2),
                        (("trn:0", "trn:1"), 3, 3)]
    issued, finished, queue = [], [], []  # a stand-in Ray: refs complete one at a time, first issued first

    def call(workers):
        refs = [_Ref(f"{len(issued)}:{w}") for w in workers]
        issued.append((workers, len(finished)))
        queue.extend(refs)
        return refs

    def wait(refs, num_returns, timeout=None, fetch_local=True):
        if timeout is None:
            return [], refs
        finished.append(queue.pop(0))
        return [finished[-1]], [r for r in refs if r != finished[-1]]

    monkeypatch.setattr(bench_driver.ray, "wait", wait)
    monkeypatch.setattr(bench_driver.ray, "get", lambda refs: refs)
    out = bench_driver.ray_schedule_round_trips(schedule, call)
    assert out["tasks"] == 4 and out["tasks_per_s"] > 0
    # the SCORE waits for its GEN's 2 calls; the UPDATE for every call before it (the 2 GENs and the SCORE: 4 calls)
    assert issued == [(("gen:0", "gen:1"), 0), (("gen:2",), 0), (("gen:0",), 2), (("trn:0", "trn:1"), 4)]
