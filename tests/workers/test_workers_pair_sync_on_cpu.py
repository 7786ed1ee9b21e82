"""Weight sync over per-pair process groups (weights.sync): a replaced generator rejoins under a new epoch while the
other pair and the trainer world are left alone. Real processes, real gloo groups over one TCPStore."""

from __future__ import annotations

import multiprocessing as mp
import queue

import pytest
import torch

from digenrl_verl.weights.sync import CollectiveSpec, Collectives, free_port, state_checksum


def _weights(fill: float) -> dict[str, torch.Tensor]:
    return {"a": torch.full((5,), fill), "b": torch.arange(3, dtype=torch.int64) * int(fill), "c": torch.ones(2, 2)}


def _trainer(spec: CollectiveSpec, out, go) -> None:
    c = Collectives(spec, "trainer", 0)
    w = _weights(1.0)
    c.send_weights(w, [0, 1])
    out.put(("trn", 1, state_checksum(w)))
    go.get(timeout=60)  # generator 1 died and its replacement was started
    w = _weights(2.0)
    c.expect(1, 1)
    c.send_weights(w, [1, 0])
    out.put(("trn", 2, state_checksum(w)))


def _generator(spec: CollectiveSpec, rank: int, epoch: int, rounds: int, out) -> None:
    c = Collectives(spec, "generator", rank, epoch)
    w = _weights(0.0)
    for i in range(rounds):
        c.receive_weights(w)
        out.put((f"gen:{rank}@{epoch}", i, state_checksum(w)))


@pytest.mark.slow  # four processes
def test_a_replaced_generator_rejoins_under_a_new_epoch_and_receives_what_the_trainer_sends():
    ctx = mp.get_context("fork")  # the targets live in this test module, which a spawned child cannot import
    out, go = ctx.Queue(), ctx.Queue()
    spec = CollectiveSpec("127.0.0.1", free_port(), 1, 2, timeout_s=60.0)
    trainer = ctx.Process(target=_trainer, args=(spec, out, go))
    gen0 = ctx.Process(target=_generator, args=(spec, 0, 0, 2, out))
    gen1 = ctx.Process(target=_generator, args=(spec, 1, 0, 1, out))  # receives once, then "dies" (exits)
    procs = [trainer, gen0, gen1]
    for p in procs:
        p.start()
    try:
        gen1.join(120)
        assert gen1.exitcode == 0
        replacement = ctx.Process(target=_generator, args=(spec, 1, 1, 1, out))
        replacement.start()
        procs.append(replacement)
        go.put(True)
        got = {}
        for _ in range(6):
            who, i, checksum = out.get(timeout=120)
            got[(who, i)] = checksum
    except queue.Empty:
        pytest.fail(f"a party of the sync did not answer; got so far: {sorted(got)}")
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    first, second = state_checksum(_weights(1.0)), state_checksum(_weights(2.0))
    assert got == {("trn", 1): first, ("gen:0@0", 0): first, ("gen:1@0", 0): first,
                   ("trn", 2): second, ("gen:0@0", 1): second, ("gen:1@1", 0): second}
