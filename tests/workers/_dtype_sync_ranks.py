"""The two processes of test_workers_generator_dtype_on_cpu.py (both cases, one after the other), in a module of
their own: the test starts them with a spawn context (a fork of the pytest process, which holds threads, could hang),
and a spawned child imports its target by module name (this folder is put on sys.path by the test, and spawn hands
sys.path to the child)."""

from __future__ import annotations

import io
from dataclasses import replace

import torch

from digenrl_verl.engines.diffusers import DiffusersEngine
from digenrl_verl.weights.sync import CollectiveSpec, Collectives


def sent_weights(engine: DiffusersEngine) -> dict[str, torch.Tensor]:
    """What the trainer sends: its trainable weights moved off their init, in the trained dtype (fp32)."""
    g = torch.Generator().manual_seed(0)
    return {k: (p.detach().float() + 0.1 * torch.randn(p.shape, generator=g)) for k, p in engine.trainable().items()}


def trainer(cases: list[tuple[CollectiveSpec, object]], out) -> None:
    """Trainer rank 0 of each case in turn (its own rendezvous): sends its weights, puts what it sent on `out`."""
    torch.set_num_threads(1)
    for spec, policy in cases:
        sent = sent_weights(DiffusersEngine.from_policy(replace(policy, engine=replace(policy.engine,
                                                                                           dtype="float32"))))
        collectives = Collectives(spec, "trainer", 0)
        collectives.send_weights(sent, [0])
        collectives.close()
        out.put(to_bytes(sent))


def generator(cases: list[tuple[CollectiveSpec, object]], out) -> None:
    """Generator rank 0 of each case in turn: its engine in the case's rollout dtype receives, puts what it holds."""
    torch.set_num_threads(1)
    for spec, policy in cases:
        engine = DiffusersEngine.from_policy(policy)
        engine.join(spec, 0)
        engine.receive_weights(1)
        out.put(to_bytes({k: p.detach() for k, p in engine.trainable().items()}))


def to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """Through the queue as bytes (a tensor would be shared by a file descriptor of a process that exits)."""
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()
