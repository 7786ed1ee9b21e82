"""verl's checkpoint engine over torch.distributed gloo: the trainer's weights to the rollout replicas on CPU hosts.

verl's ``nccl`` backend needs cupy and CUDA buffers, ``nixl`` cupy, pinned memory and CUDA, and ``naive`` is refused
for standalone replicas; this is the same engine on CPU tensors. It subclasses verl's `CheckpointEngine`, is
registered in verl's `CheckpointEngineRegistry` as ``gloo``, and a config selects it the way verl loads out-of-tree
backends (verl imports ``custom_backend_module`` in every trainer and rollout worker before it builds the engine)::

    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=digenrl_verl.weights.gloo_checkpoint_engine

What it does, in the order verl's `CheckpointEngineManager.update_weights` calls it (the topology is the ``nccl``
one): ``prepare`` (trainer rank 0 starts a `TCPStore` on a free port and returns its address), ``build_topology``
(trainer rank 0 is group rank 0, every other trainer rank -1, the rollout workers 1..N), ``init_process_group`` (a
`ProcessGroupGloo` of its own on that store, never the default group: the trainers' and the replicas' default groups
stay as they are), ``send_weights`` / ``receive_weights`` (buckets of ``update_weights_bucket_megabytes``, split and
merged by verl's own `split_weight_chunks` / `merge_weight_chunks`, one gloo broadcast per bucket), ``finalize``
(group and store dropped). A group is built for each update: on CPU it costs milliseconds, and the set of replicas may
change between updates (the elastic pool).

Each bucket goes with a JSON header (no pickle on the wire): its index, whether it is the last, the bucket size, and
the update's **policy version** (``global_steps``, what TCSS reads). verl passes ``global_steps`` to both
``send_weights`` and ``receive_weights`` but carries nothing between them; here the sender's value travels in every
header, the receiver refuses a bucket whose version differs from the one it was asked to receive (or a bucket size
that differs from its own), checks that no bucket and no chunk is missing, and after the last bucket keeps the
version: ``received_version()`` (through verl's ``execute_checkpoint_engine("received_version")`` on the rollout
workers). verl-omni's trainer worker (``ActorRolloutRefWorker.update_weights``, a1139baf) calls ``send_weights`` without
``global_steps``; `VersionedUpdates` (a mixin for verl's / verl-omni's checkpoint-engine manager) stages the version on
the trainer's engine (``stage_version``) before each update so that it still travels. A header without a version (no
mixin, no argument) takes the version verl's manager handed the receiver, and says so once
(``last_transfer()["version_from"]``: ``"trainer"`` or ``"manager"``).

A receiver keeps no reference to a bucket once it has been yielded: every bucket arrives in a fresh CPU tensor, so
what a consumer holds stays valid (verl's ``nccl`` backend reuses two buffers instead).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Generator

import ray
import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (CheckpointEngine, CheckpointEngineRegistry, TensorMeta, merge_weight_chunks,
                                         split_weight_chunks)
from verl.utils.ray_utils import auto_await
from verl.workers.rollout.utils import ensure_async_iterator

logger = logging.getLogger(__name__)

#: the registry key (``checkpoint_engine.backend``) and the module a config names (``custom_backend_module``)
BACKEND = "gloo"
MODULE = __name__
BUCKET_KEY = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"


@dataclass
class GlooMasterMetadata:
    """Where trainer rank 0's store listens (what its ``prepare`` returns and every group member connects to)."""

    host: str
    port: int


def _node_ip() -> str:
    """This node's address as Ray knows it (verl's ``nccl`` backend takes its ZMQ address the same way)."""
    return ray.util.get_node_ip_address().strip("[]")


def _meta_to_json(meta: TensorMeta) -> dict:
    return {"name": meta.name, "shape": list(meta.shape), "dtype": str(meta.dtype).removeprefix("torch."),
            "chunk_offset": meta.chunk_offset, "chunk_size": meta.chunk_size, "offset": meta.offset}


def _meta_from_json(d: dict) -> TensorMeta:
    dtype = getattr(torch, d["dtype"])
    return TensorMeta(name=d["name"], shape=torch.Size(d["shape"]), dtype=dtype, chunk_offset=d["chunk_offset"],
                      chunk_size=d["chunk_size"], offset=d["offset"])


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """verl checkpoint engine over a gloo process group of its own, CPU tensors only.

    Args:
        bucket_size: bytes per bucket (verl passes ``update_weights_bucket_megabytes << 20``); the trainer's and the
            replicas' must be the same (a receiver refuses a header with another size, naming the key).
        is_master: trainer rank 0 (verl's trainer worker passes it; rollout workers leave it False).
        timeout_s: timeout of the store and of every collective (``engine_kwargs.gloo.timeout_s``).
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0) -> None:
        if bucket_size <= 0:
            raise ValueError(f"gloo checkpoint engine: bucket size {bucket_size} bytes; set {BUCKET_KEY} >= 1")
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.rank: int | None = None
        self.world_size: int | None = None
        self._store: dist.TCPStore | None = None
        self._group: dist.ProcessGroupGloo | None = None
        self._bucket: torch.Tensor | None = None
        self._staged_version: int | None = None
        self._received_version: int | None = None
        self._last_transfer: dict[str, Any] = {}
        self._warned_untagged = False

    # ---- verl's CheckpointEngine API ------------------------------------------------------------------------------

    def prepare(self) -> GlooMasterMetadata | None:
        """Trainer rank 0: its send bucket and a store on a free port of this node; the others: nothing."""
        if not self.is_master:
            return None
        self._bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        host = _node_ip()
        self._store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=self.timeout)
        return GlooMasterMetadata(host=host, port=self._store.port)

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        """Trainer rank 0 -> group rank 0, the other trainer ranks -1 (not in the group), rollout workers 1..N."""
        world_size = rollout_world_size + 1
        actor_kwargs = {"rank": [0] + [-1] * (actor_wg_world_size - 1),
                        "world_size": [world_size] * actor_wg_world_size,
                        "master_metadata": [metadata[0]] * actor_wg_world_size}
        rollout_kwargs = {"rank": list(range(1, world_size)), "world_size": [world_size] * rollout_world_size,
                          "master_metadata": [metadata[0]] * rollout_world_size}
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, world_size: int, master_metadata: GlooMasterMetadata) -> None:
        """Join this update's gloo group (rank -1: a trainer rank that only drains its weights generator)."""
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        if (rank == 0) != self.is_master:
            raise RuntimeError(f"gloo checkpoint engine: group rank {rank} but is_master={self.is_master}; only "
                               "trainer rank 0 (the one whose prepare() started the store) may be group rank 0")
        if rank > 0:
            self._store = dist.TCPStore(master_metadata.host, master_metadata.port, is_master=False,
                                        timeout=self.timeout)
        self._group = dist.ProcessGroupGloo(self._store, rank, world_size, self.timeout)

    def finalize(self) -> None:
        """Drop this update's group, store and bucket (the next update builds new ones)."""
        self._group = self._store = self._bucket = None
        self.rank = self.world_size = None

    @torch.no_grad()
    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: int | None = None) -> None:
        """Trainer rank 0: every weight, in buckets, to every rollout worker, each header tagged `global_steps`
        (when None: the version `stage_version` staged for this update, if any)."""
        self._require_group("send_weights")
        global_steps, self._staged_version = (global_steps if global_steps is not None else self._staged_version), None
        if self.rank < 0:  # the other trainer ranks: drain the generator (it may gather shards collectively)
            async for _ in ensure_async_iterator(weights):
                pass
            return
        if self.rank != 0:
            raise RuntimeError(f"gloo checkpoint engine: send_weights on group rank {self.rank}; only trainer rank 0 "
                               "sends")
        start, index, offset, metas, chunks, nbytes = time.perf_counter(), 0, 0, [], 0, 0
        async for meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if offset + meta.chunk_size > self.bucket_size:
                await self._send_bucket(index, metas, offset, global_steps, last=None)
                index, offset, metas = index + 1, 0, []
            meta.offset = offset
            self._bucket[offset:offset + meta.chunk_size].copy_(chunk)
            metas.append(meta)
            offset += meta.chunk_size
            chunks, nbytes = chunks + 1, nbytes + meta.chunk_size
        await self._send_bucket(index, metas, offset, global_steps, last={"chunks": chunks, "bytes": nbytes})
        self._last_transfer = {"global_steps": global_steps, "buckets": index + 1, "chunks": chunks, "bytes": nbytes,
                               "seconds": time.perf_counter() - start}

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """A rollout worker: (name, tensor) for every weight of the update tagged `global_steps` (any, when None)."""
        async for name, weight in merge_weight_chunks(self._receive_chunks(global_steps), self.bucket_size):
            yield name, weight

    def stage_version(self, global_steps: int | None) -> None:
        """Trainer side: the version the next `send_weights` tags its buckets with when it is given none."""
        self._staged_version = global_steps

    # ---- what the receive side reads after an update ----------------------------------------------------------------

    def received_version(self) -> int | None:
        """The policy version (``global_steps``) of the last update received in full; None before the first."""
        return self._received_version

    def last_transfer(self) -> dict[str, Any]:
        """The last update on this side: global_steps, buckets, chunks, bytes, seconds (empty before the first)."""
        return dict(self._last_transfer)

    # ---- the wire --------------------------------------------------------------------------------------------------

    def _require_group(self, what: str) -> None:
        if self.rank is None or (self.rank >= 0 and self._group is None):
            raise RuntimeError(f"gloo checkpoint engine: {what} before init_process_group (verl's "
                               "CheckpointEngineManager.build_process_group runs prepare/init_process_group first)")

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = self.timeout
        self._group.broadcast([tensor], opts).wait()

    def _broadcast_bucket(self, header: bytes | None, data: torch.Tensor | None) -> tuple[dict, torch.Tensor]:
        """One bucket: header length, header (JSON), then the bucket's used bytes; root sends, the others receive."""
        size = torch.tensor([len(header) if header is not None else 0], dtype=torch.int64)
        self._broadcast(size)
        raw = (torch.frombuffer(bytearray(header), dtype=torch.uint8) if header is not None
               else torch.empty(int(size.item()), dtype=torch.uint8))
        self._broadcast(raw)
        parsed = json.loads(raw.numpy().tobytes().decode())
        if data is None:
            data = torch.empty(parsed["nbytes"], dtype=torch.uint8)
        if parsed["nbytes"]:
            self._broadcast(data)
        return parsed, data

    async def _send_bucket(self, index: int, metas: list[TensorMeta], nbytes: int, global_steps: int | None,
                           last: dict | None) -> None:
        header = {"index": index, "global_steps": global_steps, "bucket_size": self.bucket_size, "nbytes": nbytes,
                  "metas": [_meta_to_json(m) for m in metas], "last": last}
        await asyncio.to_thread(self._broadcast_bucket, json.dumps(header).encode(), self._bucket[:nbytes])

    async def _receive_chunks(self, global_steps: int | None) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        self._require_group("receive_weights")
        if self.rank <= 0:
            raise RuntimeError(f"gloo checkpoint engine: receive_weights on group rank {self.rank}; only rollout "
                               "workers (group ranks 1..N) receive")
        start, index, chunks, nbytes = time.perf_counter(), 0, 0, 0
        while True:
            header, data = await asyncio.to_thread(self._broadcast_bucket, None, None)
            self._check_header(header, index, global_steps)
            for meta in map(_meta_from_json, header["metas"]):
                yield meta, data[meta.offset:meta.offset + meta.chunk_size]
                chunks, nbytes = chunks + 1, nbytes + meta.chunk_size
            if header["last"] is not None:
                break
            index += 1
        if (chunks, nbytes) != (header["last"]["chunks"], header["last"]["bytes"]):
            raise RuntimeError(f"gloo checkpoint engine: received {chunks} chunks / {nbytes} bytes, the trainer sent "
                               f"{header['last']['chunks']} / {header['last']['bytes']}")
        version, source = header["global_steps"], "trainer"
        if version is None and global_steps is not None:
            version, source = global_steps, "manager"
            if not self._warned_untagged:
                self._warned_untagged = True
                logger.warning("gloo checkpoint engine: the trainer sent weights without a version (its worker called "
                               "send_weights without global_steps); recording global_steps=%s, the version verl's "
                               "manager asked for. Use %s.VersionedUpdates on the manager to tag them at the source",
                               global_steps, MODULE)
        self._received_version = version
        self._last_transfer = {"global_steps": version, "version_from": source, "buckets": index + 1,
                               "chunks": chunks, "bytes": nbytes, "seconds": time.perf_counter() - start}

    def _check_header(self, header: dict, index: int, global_steps: int | None) -> None:
        if header["index"] != index:
            raise RuntimeError(f"gloo checkpoint engine: bucket {header['index']} arrived where bucket {index} was "
                               "due (a bucket was lost)")
        if header["bucket_size"] != self.bucket_size:
            raise ValueError(f"gloo checkpoint engine: the trainer's buckets are {header['bucket_size']} bytes, this "
                             f"replica's {self.bucket_size}; set {BUCKET_KEY} to one value for both")
        if None not in (global_steps, header["global_steps"]) and header["global_steps"] != global_steps:
            raise ValueError(f"gloo checkpoint engine: asked for the weights of global_steps={global_steps}, the "
                             f"trainer sent global_steps={header['global_steps']}")


class VersionedUpdates:
    """Mixin for verl's `CheckpointEngineManager` (or verl-omni's `OmniCheckpointEngineManager`): before each update
    it stages ``global_steps`` on every trainer rank's engine (``execute_checkpoint_engine("stage_version")``), so the
    version travels with the weights even when the trainer worker calls ``send_weights`` without it (verl-omni's
    does). Use it first in the bases: ``class Manager(VersionedUpdates, OmniCheckpointEngineManager)``."""

    @auto_await
    async def update_weights(self, global_steps: int | None = None):
        if self.backend != "naive" and getattr(self.backend_cls, "stage_version", None) is not None:
            n = self.actor_wg.world_size
            ray.get(self.actor_wg.execute_checkpoint_engine(["stage_version"] * n, [global_steps] * n))
        await super().update_weights(global_steps=global_steps)
