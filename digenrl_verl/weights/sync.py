"""Collectives that span both pools: trainer data-parallel gradient reduction and weight sync.

One torch.distributed default group holds every worker of both pools (gloo on CPU, NCCL on GPU): the
trainer ranks come first (global ranks 0 … T−1), then the generator ranks (T … T+G−1). Two subgroups are
created collectively on every rank at start-up:
- `trainer_group`: the trainer ranks, for the all-reduce of accumulated gradients at the optimizer step;
- one pair group {trainer rank 0, generator g} per generator, for the broadcast of the trainable weights
  after each optimizer step (the generators then hold policy version v+1). Pair groups, rather than one
  broadcast over everything, keep the sync working when a generator has died: its pair is skipped,
  while a collective over a group with a dead member would hang.
Weights travel as one flat buffer per dtype, so a sync is one collective per dtype and generator.
"""

from __future__ import annotations

import datetime
import hashlib
import socket
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class CollectiveSpec:
    """Where every worker joins the shared process group.

    Args:
        master_addr / master_port: TCP rendezvous (the driver picks a free loopback port on one machine).
        num_trainers / num_generators: pool sizes; trainer ranks first.
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
        return rank if role == "trainer" else self.num_trainers + rank


class Collectives:
    """The process groups one worker belongs to (created by `join`)."""

    def __init__(self, spec: CollectiveSpec, role: str, rank: int) -> None:
        self.spec = spec
        self.role = role
        self.global_rank = spec.global_rank(role, rank)
        if not dist.is_initialized():
            dist.init_process_group(
                backend=spec.backend,
                init_method=f"tcp://{spec.master_addr}:{spec.master_port}",
                world_size=spec.world_size,
                rank=self.global_rank,
                timeout=datetime.timedelta(seconds=spec.timeout_s),
            )
        # new_group is collective: every rank must call it, members or not, in the same order.
        self.trainer_group = dist.new_group(ranks=list(range(spec.num_trainers)))
        self.pair_groups = [dist.new_group(ranks=[0, spec.num_trainers + g]) for g in range(spec.num_generators)]

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

    def send_weights(self, tensors: Mapping[str, torch.Tensor], generators: list[int]) -> None:
        """On trainer rank 0: send `tensors` to each generator rank listed (pool-local generator ranks)."""
        assert self.global_rank == 0, "only trainer rank 0 sends weights"
        for g in generators:
            _broadcast_flat(tensors, self.pair_groups[g], src=0)

    def receive_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """On a generator: overwrite `tensors` in place with trainer rank 0's values."""
        g = self.global_rank - self.spec.num_trainers
        _broadcast_flat(tensors, self.pair_groups[g], src=0)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _broadcast_flat(tensors: Mapping[str, torch.Tensor], group, src: int) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for name in sorted(tensors):
        by_dtype.setdefault(tensors[name].dtype, []).append(tensors[name])
    for same in by_dtype.values():
        flat = torch._utils._flatten_dense_tensors([t.detach() for t in same])
        dist.broadcast(flat, src=src, group=group)
        with torch.no_grad():
            for t, new in zip(same, torch._utils._unflatten_dense_tensors(flat, same)):
                t.copy_(new)


def state_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over names and raw bytes of a state, in name order (bit-exact comparison across processes)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
