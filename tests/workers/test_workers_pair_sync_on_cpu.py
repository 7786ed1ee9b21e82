"""Weight sync over per-pair process groups (weights.sync): a replaced generator rejoins under a new epoch while the
other pair and the trainer world are left alone. Real processes, real gloo groups over one TCPStore."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import queue
import socket

import psutil
import pytest
import torch

from digenrl_verl.weights.sync import (CollectiveSpec, Collectives, free_port, loopback_address, state_checksum,
                                       tcp_store)


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


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_a_loopback_store_listens_on_loopback_only(host):
    """torch's store server listens on every interface ('::'); on a loopback rendezvous address the master serves it
    from a socket bound to that address, and a client still reaches it."""
    if host == "::1" and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    family, address = loopback_address(host)
    port = free_port(address) if family == socket.AF_INET else 0
    if port == 0:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
    timeout = datetime.timedelta(seconds=30)
    master = tcp_store(host, port, True, timeout)
    client = tcp_store(host, port, False, timeout)
    client.set("k", "v")
    assert master.get("k") == b"v"
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert listening == {(address, port)}


def test_only_loopback_hosts_are_loopback():
    assert loopback_address("127.0.0.1") == (socket.AF_INET, "127.0.0.1")
    assert loopback_address("192.0.2.7") is None and loopback_address("no-such-host.invalid") is None


def test_a_rendezvous_port_is_drawn_below_the_ephemeral_range():
    """The OS's own pick (bind to port 0) is an ephemeral port, which an outgoing connection (Ray's gRPC clients)
    can take as its local port before the rendezvous binds it: the suite once failed so (EADDRINUSE on 44247)."""
    from digenrl_verl.weights.sync import ephemeral_low

    low = ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(low // 2 <= p < low for p in ports) and len(ports) > 1, (low, ports)
    with socket.create_server(("127.0.0.1", ports.pop())):  # free when drawn
        pass
