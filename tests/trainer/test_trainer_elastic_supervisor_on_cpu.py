"""The elastic pool's Ray-side bookkeeping without Ray: restarts per rank, drop after max_restarts, resize, the control
file, and the max_restarts setting."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from digenrl_verl.config.digenrl import DigenRLConfig
from digenrl_verl.errors import ConfigError
from digenrl_verl.schedule.driver import WorkerEvent
from digenrl_verl.trainer.elastic import MAX_RESTARTS_KEY, GeneratorSupervisor
from digenrl_verl.trainer.runner import POOLS_FILE, DigenRLTrainer
from digenrl_verl.weights.sync import CollectiveSpec


class _Call:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def remote(self, *args):
        self.log.append((self.name, *args))
        return (self.name, *args)


class FakeActor:
    """Records the calls made on it (`.method.remote(...)`)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.calls: list = []
        self.join = _Call(self.calls, "join")
        self.expect_generator = _Call(self.calls, "expect_generator")


def _supervisor(max_restarts: int, gens: int = 2):
    started, stopped = [], []
    workers = {f"gen:{i}": FakeActor(i) for i in range(gens)} | {"trn:0": FakeActor(0)}

    def start(rank):
        started.append(FakeActor(rank))
        return started[-1]

    sup = GeneratorSupervisor(workers, start, workers["trn:0"], CollectiveSpec("127.0.0.1", 1, 1, gens),
                              max_restarts, lambda rank, actor: stopped.append((rank, actor)))
    return sup, workers, started, stopped


def test_each_death_starts_a_replacement_with_the_next_epoch_until_max_restarts_then_drops(capsys):
    sup, workers, started, _ = _supervisor(max_restarts=2)
    for expected_epoch in (1, 2):
        sup.on_dead("gen:1")
        sup.on_dead("gen:1")  # a second report of the same death (another task on it) starts nothing more
        assert len(started) == expected_epoch and started[-1].rank == 1
        assert started[-1].calls == [("join", sup.spec, expected_epoch)]
        assert workers["trn:0"].calls[-1] == ("expect_generator", 1, expected_epoch)
        sup.starting.pop("gen:1")  # as if it joined (poll) and died again later
    sup.on_dead("gen:1")
    assert len(started) == 2 and sup.restarts == {"gen:1": 2} and "gen:1" in sup.dropped
    assert f"{MAX_RESTARTS_KEY}=2" in capsys.readouterr().err
    assert sup.poll() == [WorkerEvent("removed", "gen:1", f"dropped: died 3 time(s), {MAX_RESTARTS_KEY}=2")]
    sup.on_dead("gen:1")  # dropped: nothing more
    assert len(started) == 2 and sup.poll() == []


def test_max_restarts_zero_drops_at_the_first_death():
    sup, _, started, _ = _supervisor(max_restarts=0)
    sup.on_dead("gen:0")
    assert not started and sup.dropped == {"gen:0"}


def test_resize_grows_the_lowest_free_ranks_and_shrinks_the_highest():
    sup, workers, started, stopped = _supervisor(max_restarts=2, gens=2)
    assert sup.resize(4, ["gen:0", "gen:1"]) == []
    assert [a.rank for a in started] == [2, 3] and sup.pending() == ["gen:2", "gen:3"]
    assert [c for c in workers["trn:0"].calls] == [("expect_generator", 2, 0), ("expect_generator", 3, 0)]
    # back to 1: the starting ones are stopped, the live gen:1 gets a removed event
    events = sup.resize(1, ["gen:0", "gen:1"])
    assert events == [WorkerEvent("removed", "gen:1", "shrink to 1")]
    assert sorted(rank for rank, _ in stopped) == [2, 3] and sup.pending() == []
    assert sup.resize(2, ["gen:0"]) == [] and started[-1].rank == 1  # the lowest free rank again
    assert workers["trn:0"].calls[-1] == ("expect_generator", 1, 1)  # rank 1 had epoch 0: a new pair
    sup.release(["gen:1"])
    assert "gen:1" not in workers and stopped[-1][0] == 1


def test_the_control_file_is_read_when_it_changes_and_a_bad_one_is_reported(tmp_path, capsys):
    stub = SimpleNamespace(output_dir=tmp_path, _pools_file_seen=None)
    path = tmp_path / POOLS_FILE
    assert DigenRLTrainer.read_pools_file(stub) is None
    path.write_text('{"generator": 3}')
    assert DigenRLTrainer.read_pools_file(stub) == 3
    assert DigenRLTrainer.read_pools_file(stub) is None  # unchanged
    for body in ('{"generator": 0}', '{"gen": 2}', "not json", '{"generator": true}'):
        path.write_text(body)
        os.utime(path, (stub._pools_file_seen + 1, stub._pools_file_seen + 1))
        assert DigenRLTrainer.read_pools_file(stub) is None
        assert f"ignoring {path}" in capsys.readouterr().err


def test_max_restarts_is_checked_and_warned_about_where_it_has_no_effect():
    with pytest.raises(ConfigError, match=r"trainer\.digenrl\.pools\.generator\.max_restarts"):
        DigenRLConfig.from_node({"mode": "disaggregated", "pools": {"generator": {"max_restarts": -1}}})
    assert DigenRLConfig.from_node({"mode": "disaggregated",
                                    "pools": {"generator": {"max_restarts": 5}}}).pools.generator.max_restarts == 5
    with pytest.warns(UserWarning, match=r"trainer\.digenrl\.pools\.trainer\.max_restarts has no effect"):
        DigenRLConfig.from_node({"mode": "disaggregated", "pools": {"trainer": {"max_restarts": 1}}})
