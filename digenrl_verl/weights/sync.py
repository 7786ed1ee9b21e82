"""Collectives that span both pools: trainer data-parallel gradient reduction and weight sync.

Two kinds of process group, built so that one generator can be replaced without touching a live worker:

- the **trainer world**: torch.distributed's default group holds the trainer ranks only (global ranks
  0 … T−1), rendezvous through a `TCPStore` that trainer rank 0 serves at ``master_addr:master_port``.
  `trainer_group` (the whole world) carries the all-reduce of accumulated gradients and FSDP2's collectives;
- one **pair group** {trainer rank 0, generator g} per generator, for the broadcast of the trainable weights
  after each optimizer step. A pair group is a bare `ProcessGroupGloo` / `ProcessGroupNCCL` of size 2 built
  on a `PrefixStore` of the same TCPStore, keyed ``pair/<g>/<epoch>``: it does not depend on the default world
  (generators never join it, so a generator dying cannot break a trainer collective), and it is built
  lazily, on both sides, by the first weight broadcast between the two. A replaced generator (same rank g,
  a new actor) gets the next *epoch*: trainer rank 0 is told first (`expect`), so its next send to g builds
  a fresh pair under the new key while the new generator's first receive builds its side; the other pairs
  and the trainer world are never rebuilt. A dead generator's pair is simply never used again (the driver
  leaves it out of every SYNC), while a collective over a group with a dead member would hang.

Chosen over a drained re-initialisation of one world spanning both pools: that needs every live worker to
take part at a step boundary (FSDP2's mesh would have to be rebuilt too), and a rejoin would wait for it.

Weights travel as one flat buffer per dtype, so a sync is one collective per dtype and generator.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class CollectiveSpec:
    """Where every worker joins: the trainer world and the pair groups share one TCP rendezvous.

    Args:
        master_addr / master_port: TCPStore served by trainer rank 0 (the driver picks a free loopback port on
            one machine; on a cluster, verl's port on trainer rank 0's node).
        num_trainers / num_generators: pool sizes at start-up (the trainer world is num_trainers ranks; generator
            ranks may later grow past num_generators).
        backend: "gloo" (CPU) or "nccl" (GPU).
    """

    master_addr: str
    master_port: int
    num_trainers: int
    num_generators: int
    backend: str = "gloo"
    timeout_s: float = 300.0

    @property
    def world_size(self) -> int:
        return self.num_trainers + self.num_generators

    def global_rank(self, role: str, rank: int) -> int:
        """A worker's number across both pools (trainers first): for logs; only trainers are in the world."""
        return rank if role == "trainer" else self.num_trainers + rank


class Collectives:
    """The process groups one worker belongs to (created by `join`).

    Args:
        epoch: a generator's incarnation (0 at start-up, +1 per replacement of rank `rank`); its pair group with
            trainer rank 0 lives under that epoch's key.
    """

    def __init__(self, spec: CollectiveSpec, role: str, rank: int, epoch: int = 0) -> None:
        self.spec = spec
        self.role = role
        self.rank = rank
        self.global_rank = spec.global_rank(role, rank)
        self.timeout = datetime.timedelta(seconds=spec.timeout_s)
        is_master = role == "trainer" and rank == 0
        self.store = tcp_store(spec.master_addr, spec.master_port, is_master, self.timeout)
        self.trainer_group = None
        if role == "trainer" and not dist.is_initialized():
            dist.init_process_group(backend=spec.backend, store=dist.PrefixStore("trainers", self.store),
                                    world_size=spec.num_trainers, rank=rank, timeout=self.timeout)
        if role == "trainer":
            self.trainer_group = dist.new_group(ranks=list(range(spec.num_trainers)))
        self.epoch = epoch  # generators: this actor's epoch
        self.expected: dict[int, int] = {}  # trainer rank 0: generator rank -> epoch its next send connects to
        self.pairs: dict[int, tuple[int, object]] = {}  # generator rank -> (epoch, pair process group)

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of `params` over the trainer ranks (each rank accumulated its own shard)."""
        if self.spec.num_trainers == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.trainer_group)
        for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, grads)):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)

    def expect(self, generator: int, epoch: int) -> None:
        """On trainer rank 0: generator `generator` was replaced; its next send builds the pair of `epoch`."""
        self.expected[generator] = epoch

    def pair(self, generator: int, epoch: int):
        """The pair group {trainer rank 0, generator} of `epoch`, built (a rendezvous with the other side, which
        must be building it too) on first use."""
        have = self.pairs.get(generator)
        if have is not None and have[0] == epoch:
            return have[1]
        store = dist.PrefixStore(f"pair/{generator}/{epoch}", self.store)
        rank = 0 if self.role == "trainer" else 1
        if self.spec.backend == "nccl":
            group = dist.ProcessGroupNCCL(store, rank, 2, dist.ProcessGroupNCCL.Options())
        else:
            group = dist.ProcessGroupGloo(store, rank, 2, self.timeout)
        self.pairs[generator] = (epoch, group)
        return group

    def send_weights(self, tensors: Mapping[str, torch.Tensor], generators: list[int]) -> None:
        """On trainer rank 0: send `tensors` to each generator rank listed (pool-local generator ranks)."""
        assert self.role == "trainer" and self.rank == 0, "only trainer rank 0 sends weights"
        for g in generators:
            _broadcast_flat(tensors, self.pair(g, self.expected.get(g, 0)))

    def receive_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """On a generator: overwrite `tensors` in place with trainer rank 0's values."""
        _broadcast_flat(tensors, self.pair(self.rank, self.epoch))

    def close(self) -> None:
        self.pairs.clear()
        if dist.is_initialized():
            dist.destroy_process_group()


#: dtype codes of the header that precedes each broadcast (a receiver may hold a tensor in another dtype)
_WIRE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
                torch.int8, torch.uint8, torch.bool)


#: the most bytes one broadcast of a weight sync carries (a bucket); where a tensor lives elsewhere than the group's
#: device (a generator's host-memory shadow under NCCL), each bucket is staged on the group's device
BUCKET_BYTES = 512 << 20


def _buckets(sizes: list[tuple[int, int]], limit: int) -> list[list[int]]:
    """Consecutive index groups of (numel, element bytes) `sizes`, each at most `limit` bytes but for a single
    tensor larger than that: the same on both sides of a broadcast, which know the same names, shapes and dtypes."""
    out: list[list[int]] = []
    used = limit
    for i, (numel, width) in enumerate(sizes):
        size = numel * width
        if used + size > limit:
            out.append([])
            used = 0
        out[-1].append(i)
        used += size
    return out


def group_device(group) -> torch.device | None:
    """The device a pair group's backend reads its tensors from: the current CUDA device for NCCL, else None (gloo
    reads each tensor where it lives)."""
    if isinstance(group, getattr(dist, "ProcessGroupNCCL", ())):
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _wire(live: torch.Tensor, dtype: torch.dtype, device: torch.device, sending: bool) -> torch.Tensor:
    """What one tensor goes over the group as: itself where it is in `dtype` on `device`; else, on the sending side,
    a copy there (its values go out), on the receiving side an empty buffer there (cast into place after)."""
    if live.dtype == dtype and live.device == device:
        return live
    if sending:
        return live.detach().to(device=device, dtype=dtype)
    return torch.empty_like(live, dtype=dtype, device=device)


def _broadcast_flat(tensors: Mapping[str, torch.Tensor], group, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Pair-rank 0 (trainer rank 0) -> pair-rank 1, on a bare pair group (not registered with the default world,
    so through the group's own `broadcast`). A header of the sender's dtypes goes first: a receiver that holds a
    tensor in another dtype (a generator sampling in `rollout.dtype`) receives it in the sender's dtype and casts
    it into place. Then one flat broadcast per bucket of one dtype (`_buckets`): a tensor held in another dtype, or
    elsewhere than the group's device (`group_device`: a generator whose engine keeps the weights in host memory,
    e.g. verl-omni's replica engine's shadow, under NCCL), is received into a staging buffer on that device."""
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    names = sorted(tensors)
    if not names:
        return
    device = group_device(group) or tensors[names[0]].device  # where the group's backend reads (cuda for NCCL)
    header = torch.tensor([_WIRE_DTYPES.index(tensors[n].dtype) for n in names], dtype=torch.int64, device=device)
    group.broadcast([header], opts).wait()  # the receiver's own dtypes are overwritten by the sender's
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for name, code in zip(names, header.tolist()):
        by_dtype.setdefault(_WIRE_DTYPES[code], []).append(tensors[name])
    sending = group.rank() == 0
    for dtype, lives in by_dtype.items():
        width = torch.empty((), dtype=dtype).element_size()
        for bucket in _buckets([(t.numel(), width) for t in lives], bucket_bytes):
            pairs = [(lives[i], _wire(lives[i], dtype, device, sending)) for i in bucket]
            wires = [w.detach() for _, w in pairs]
            flat = torch._utils._flatten_dense_tensors(wires)
            group.broadcast([flat], opts).wait()
            with torch.no_grad():
                for (live, _), new in zip(pairs, torch._utils._unflatten_dense_tensors(flat, wires)):
                    live.copy_(new)


def state_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over names and raw bytes of a state, in name order (bit-exact comparison across processes)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


#: where the OS draws ephemeral ports when Linux does not say (/proc/sys/net/ipv4/ip_local_port_range)
EPHEMERAL_LOW = 32768


def ephemeral_low() -> int:
    """The lowest port of this machine's ephemeral range: the local ports of outgoing connections come from it."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, for a listener that another process binds later (a rendezvous).

    Drawn below the ephemeral range, in [low / 2, low): a port the OS hands out (``bind(0)``) is one of its ephemeral
    ports, which every outgoing connection of the machine (Ray's gRPC clients among them) may take as its local port
    before the listener binds it (``EADDRINUSE``, seen in the suite). Falls back to the OS's pick when none of 200
    draws binds."""
    low = ephemeral_low()
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(max(1024, low // 2), low)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def loopback_address(host: str) -> tuple[socket.AddressFamily, str] | None:
    """(family, address) of `host` (an address or a name) when it is this machine's loopback (``127.0.0.1``,
    ``::1``, ``localhost``), else None."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
        return (family, sockaddr[0]) if ipaddress.ip_address(sockaddr[0]).is_loopback else None
    except (OSError, ValueError):
        return None


def tcp_store(host: str, port: int, is_master: bool, timeout: datetime.timedelta) -> dist.TCPStore:
    """The rendezvous store at ``host:port``; the master serves it. torch's server listens on every interface of its
    machine, whatever `host` is; on a loopback `host` (every one-node run the trainer starts) the master hands it a
    socket bound to that address instead, so nothing on the network can reach the store."""
    loopback = loopback_address(host) if is_master else None
    if loopback is None:
        return dist.TCPStore(host, port, is_master=is_master, timeout=timeout, wait_for_workers=False)
    family, address = loopback
    listen_fd = socket.create_server((address, port), family=family, backlog=128).detach()
    try:
        return dist.TCPStore(host, port, is_master=True, timeout=timeout, wait_for_workers=False,
                             master_listen_fd=listen_fd)  # the store owns the socket from here
    except Exception:
        os.close(listen_fd)
        raise
