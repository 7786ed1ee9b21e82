"""`LeaderRayExecutor`: one call per task and lane leader, the leader making the rank calls `RayExecutor` makes.

The rank calls are compared with `RayExecutor`'s own for the same tasks (stand-in actors and leaders, no Ray); the
real leaders run in `bench driver` (its smoke test runs the driver on them) and below over no-op actors, where a
killed rank fails its task with the rank named dead, as `RayExecutor` reports it."""

from __future__ import annotations

import pytest

from digenrl_verl.bench.noop_workers import NoopWorker, StepBatch
from digenrl_verl.diffusion.advantages import AdvantageConfig
from digenrl_verl.schedule.types import Task, TaskKind
from digenrl_verl.trainer import lane_leaders
from digenrl_verl.trainer.lane_leaders import LeaderRayExecutor, RankFailure, start_leaders
from digenrl_verl.trainer.ray_executor import RayExecutor
from digenrl_verl.workers.leader import RankError


class _Ref(str):
    """A stand-in object ref."""


class _Method:
    """Records `.remote` calls as (owner, method, args) and returns fresh stand-in refs."""

    def __init__(self, owner: str, name: str, log: list, num_returns: int = 1) -> None:
        self.owner, self.name, self.log, self.num_returns = owner, name, log, num_returns

    def options(self, num_returns: int) -> "_Method":
        return _Method(self.owner, self.name, self.log, num_returns)

    def remote(self, *args):
        refs = tuple(_Ref(f"{self.owner}.{self.name}#{len(self.log)}.{i}") for i in range(self.num_returns))
        self.log.append((self.owner, self.name, args))
        return refs if self.num_returns > 1 else refs[0]


class _Actor:
    def __init__(self, owner: str, log: list, names: tuple[str, ...]) -> None:
        for name in names:
            setattr(self, name, _Method(owner, name, log))


RANK_METHODS = ("generate_call", "score_call", "update_call", "opt_step", "send_weights", "receive_weights")
GEN = (("gen:0", (0, 1)), ("gen:1", (2, 3)))
TRN = (("trn:0", (0, 1)), ("trn:1", (2, 3)))


def _tasks() -> list[Task]:
    return [Task(0, TaskKind.GEN, 0, 0, ("gen:0", "gen:1"), 0, GEN),
            Task(1, TaskKind.SCORE, 0, 0, ("gen:0", "gen:1"), 0, GEN),
            Task(2, TaskKind.UPDATE, 0, 0, ("trn:0", "trn:1"), 0, TRN),
            Task(3, TaskKind.OPT_STEP, 0, None, ("trn:0", "trn:1"), 1),
            Task(4, TaskKind.SYNC, 0, None, ("trn:0", "trn:1", "gen:0", "gen:1"), 1)]


def _rank_calls_of(leader_log: list, batch: StepBatch) -> list[tuple[str, str, tuple]]:
    """The rank calls the leaders make for the calls they received (`LaneLeader.generate` / `fan`)."""
    out = []
    for _, method, args in leader_log:
        if method == "generate":
            _, _, calls = args
            out += [(w, "generate_call", (batch.select_idxs(ids), message)) for w, ids, message in calls]
        else:
            out += list(args[0])
    return out


def test_each_task_is_one_call_per_leader_and_the_leaders_make_the_plain_executors_rank_calls(monkeypatch):
    batch = StepBatch.of(2, 2)
    plain_log: list = []
    plain = RayExecutor({w: _Actor(w, plain_log, RANK_METHODS) for w in ("gen:0", "gen:1", "trn:0", "trn:1")},
                        lambda step: batch, AdvantageConfig(global_std=False), loss_rows_per_sample=1)
    leader_log: list = []
    gen_leader, trn_leader = _Actor("lead:gen", leader_log, ("generate", "fan")), _Actor("lead:trn", leader_log,
                                                                                           ("generate", "fan"))
    monkeypatch.setattr(lane_leaders.ray, "put", lambda value: _Ref("batch"))
    led = LeaderRayExecutor({w: None for w in ("gen:0", "gen:1", "trn:0", "trn:1")}, lambda step: batch,
                            AdvantageConfig(global_std=False), loss_rows_per_sample=1,
                            leaders={"gen:0": gen_leader, "gen:1": gen_leader, "trn:0": trn_leader,
                                     "trn:1": trn_leader})
    gen, score, update, opt, sync = _tasks()
    for ex in (plain, led):
        ex.submit(gen)
    # the GEN's answer: the leader's refs of each rank's data, then the facts (what `LaneLeader.generate` returns)
    answer = [(_Ref(f"traj{i}"), _Ref(f"img{i}"), {"samples": 2, "version": 0}) for i in range(2)]
    assert led._rank_values(led._inflight[0], [answer]) == [answer[0][2], answer[1][2]]
    for ex in (plain, led):
        ex._scores[0].update({0: 1.0, 1: 0.0, 2: 0.5, 3: 0.25})
        for task in (score, update, opt, sync):
            ex.submit(task)
    # one driver call per task and leader: GEN, SCORE (generators' leader), UPDATE, OPT_STEP (trainers'), SYNC (both)
    assert [(owner, method) for owner, method, _ in leader_log] == [
        ("lead:gen", "generate"), ("lead:gen", "fan"), ("lead:trn", "fan"), ("lead:trn", "fan"), ("lead:trn", "fan"),
        ("lead:gen", "fan")]
    assert (led.stats.calls, led.stats.rank_calls) == (6, 12) and plain.stats.calls == plain.stats.rank_calls == 12
    assert leader_log[0][2][1] == [_Ref("batch")]  # the step batch by reference, in a list: fetched by the leader
    # the leaders' rank calls are the plain executor's, in its order, the data refs being the GEN answer's
    made = _rank_calls_of(leader_log, batch)
    data = {}  # the plain executor's GEN refs -> the leader's for the same rank and return
    for i, (owner, _, _) in enumerate(plain_log[:2]):
        data.update({_Ref(f"{owner}.generate_call#{i}.0"): f"traj{i}", _Ref(f"{owner}.generate_call#{i}.1"): f"img{i}"})
    assert [(w, m) for w, m, _ in made] == [(w, m) for w, m, _ in plain_log]
    for (w, m, args), (_, _, want) in zip(made, plain_log):
        if m == "generate_call":
            assert list(args[0].sample_ids) == list(want[0].sample_ids) and args[1] == want[1]
        else:
            assert list(args) == [data.get(a, a) if isinstance(a, _Ref) else a for a in want], (w, m)


def test_a_rank_error_in_a_leaders_answer_fails_the_task_with_the_dead_rank_named(monkeypatch):
    monkeypatch.setattr(lane_leaders.ray, "put", lambda value: _Ref("batch"))
    log: list = []
    leader = _Actor("lead", log, ("generate", "fan"))
    ex = LeaderRayExecutor({"gen:0": None, "gen:1": None}, lambda step: StepBatch.of(2, 2),
                           AdvantageConfig(global_std=False), loss_rows_per_sample=1,
                           leaders={"gen:0": leader, "gen:1": leader})
    ex.submit(_tasks()[0])
    f = ex._inflight[0]
    answer = [(_Ref("t0"), _Ref("i0"), {"samples": 2}), RankError("gen:1", "RayActorError: died", dead=True)]
    with pytest.raises(RankFailure) as err:
        ex._rank_values(f, [answer])
    assert err.value.dead_workers == ("gen:1",) and not err.value.data_lost
    monkeypatch.setattr(lane_leaders.RayExecutor, "_get", lambda self, refs: [answer])
    done = ex._completion(f)
    assert not done.ok and done.dead_workers == ("gen:1",) and "died" in done.info["reason"]
    assert not ex._trajectories and not ex._images and not ex._parts  # the failed GEN's outputs are forgotten
    with pytest.raises(ValueError, match="no lane leader"):
        LeaderRayExecutor({"gen:0": None, "trn:0": None}, lambda step: None, AdvantageConfig(global_std=False),
                          loss_rows_per_sample=1, leaders={"gen:0": leader})


@pytest.mark.slow  # starts no-op actors and two leaders on the session's Ray instance
def test_real_leaders_run_a_lane_and_report_a_killed_rank_dead(ray_session):
    import ray

    remote = ray.remote(NoopWorker).options(num_cpus=0)
    workers = {"gen:0": remote.remote(0), "gen:1": remote.remote(1), "trn:0": remote.remote(2),
               "trn:1": remote.remote(3)}
    leaders = start_leaders(workers, [["gen:0", "gen:1"], ["trn:0", "trn:1"]])
    batch = StepBatch.of(2, 2)
    try:
        ex = LeaderRayExecutor(workers, lambda step: batch, AdvantageConfig(global_std=False),
                               loss_rows_per_sample=1, leaders=leaders)
        gen, score, update, opt, _ = _tasks()
        for task in (gen, score, update, opt):
            ex.submit(task)
            (done,) = ex.wait_any(timeout=60)
            assert done.ok, done.info
            if task is gen:  # gen:1's trajectory, by the leader's ref
                assert ray.get(ex._trajectories[(0, 2)])["sample_id"].tolist() == [2, 3]
            if task is score:
                assert set(ex.scores(0)) == {0, 1, 2, 3}
        assert ex.stats.calls == 4 and ex.stats.rank_calls == 8 and not ex._trajectories  # OPT_STEP released step 0
        ray.kill(workers["gen:1"])
        with pytest.raises(ray.exceptions.RayActorError):  # (ray.kill returns before the actor is gone)
            ray.get(workers["gen:1"].ready.remote(), timeout=60)
        ex.submit(Task(5, TaskKind.GEN, 1, 0, ("gen:0", "gen:1"), 1, GEN))
        (failed,) = ex.wait_any(timeout=60)
        assert not failed.ok and failed.dead_workers == ("gen:1",), failed.info
    finally:
        for actor in {id(a): a for a in [*workers.values(), *leaders.values()]}.values():
            ray.kill(actor)
