"""verl-omni's STOCK trainer worker on the host CPU (issue 30 item 1, first part): the two places where its
`TrainingWorker` stopped before building a model, each proven in a fresh interpreter on verl's CPU platform.

* verl's `initialize_global_process_group_ray` built ``cpu:gloo,cpu:gloo`` (torch: "Duplicate device type cpu");
  `digenrl_verl.platform.verl_fixes` gives it ``cpu:gloo`` where the device is the CPU, and the name verl-omni's
  worker module imported is the fixed one;
* verl-omni registers its FSDP diffusion engines for cuda/npu only ("No engine registered for device='cpu'");
  `integrations.verl_omni_cpu_engines` registers the same classes for ``cpu`` from verl's own table.

With both, `python -m verl_omni.trainer.main_diffusion` (v0, colocated, Qwen-Image LoRA) builds its actor worker and
its hybrid vLLM-Omni replica on CPU and fails later, in verl-omni's LoRA collector (see docs/verl_omni.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import free_port, run_code  # noqa: E402

from digenrl_verl.platform.verl_fixes import cpu_backend  # noqa: E402

_PROBE = """
import os
import verl
from verl_omni.workers import engine_workers
import verl_omni.workers.engine.fsdp.diffusers_impl as impl
from verl.workers.engine.base import EngineRegistry
import torch.distributed as dist
print("engine:", EngineRegistry.get_engine_cls("diffusion_model", "fsdp2").__qualname__)
print("stock:", EngineRegistry.get_engine_cls("diffusion_model", "fsdp2") is impl.PPODiffusersFSDPEngine)
engine_workers.initialize_global_process_group_ray(timeout_second=None)  # the name verl-omni's worker calls
print("backend:", dist.get_backend())
"""


def test_cpu_backend_changes_only_the_cpu_default():
    assert cpu_backend(None, "cpu") == "cpu:gloo"
    assert cpu_backend(None, "cuda") is None  # verl builds cpu:gloo,cuda:nccl itself
    assert cpu_backend("nccl", "cpu") == "nccl"  # a caller's choice stays


@pytest.mark.slow
def test_verl_omnis_stock_worker_gets_a_process_group_and_its_engine_on_cpu():
    out = run_code(_PROBE, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                   HF_HUB_OFFLINE="1")
    assert "engine: PPODiffusersFSDPEngine" in out and "stock: True" in out  # verl-omni's own class, not ours
    assert "backend: cpu:gloo" in out  # verl's default would have been cpu:gloo,cpu:gloo (refused by torch)


_RECEIVE = """
import asyncio, os, threading, time
import torch
import verl
from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as bwt

SENT = {"lora_A": torch.arange(300_000, dtype=torch.float32), "lora_B": torch.full((300_000,), 3.0)}  # 1.2 MB each


def receive(method):
    # verl's sender and receiver over shared memory, a 2 MB bucket: two buckets, the one buffer reused
    handle = f"ipc:///tmp/digenrl-receive-{os.getpid()}-{method.__name__}.sock"
    sender = bwt.BucketedWeightSender(handle, bucket_size_mb=2, use_shm=True)
    thread = threading.Thread(target=lambda: asyncio.run(sender.async_send_weights(iter(SENT.items()))))
    thread.start()
    time.sleep(0.2)
    receiver = bwt.BucketedWeightReceiver(handle, torch.device("cpu"), use_shm=True)
    kept = {}  # as verl-omni's LoRA receive keeps every bucket until add_lora
    try:
        method(receiver, lambda weights: kept.update(weights))
        outcome = "equal" if all(torch.equal(kept[k], v) for k, v in SENT.items()) else "corrupted"
    except BufferError as e:
        outcome = f"BufferError ({e})"
    thread.join(timeout=60)
    return outcome


from digenrl_verl.platform.verl_fixes import PATCHED

fixed = bwt.BucketedWeightReceiver.receive_weights
print("patched:", getattr(fixed, PATCHED, False))
print("verl's own:", receive(fixed.__wrapped__))
print("fixed:", receive(fixed))
"""


@pytest.mark.slow
def test_verls_shared_memory_receive_hands_copies_on_cpu():
    """verl's `BucketedWeightReceiver` over shared memory, a LoRA-like receive that keeps every bucket (verl-omni's
    `update_weights_from_ipc`): verl's own method fails on the CPU (its views of the shared memory outlive the
    buffer); the method as the CPU platform leaves it, once verl's module is imported, hands copies."""
    out = run_code(_RECEIVE)
    print("\n".join(line for line in out.splitlines() if line.startswith(("patched:", "verl's own:", "fixed:"))))
    assert "patched: True" in out  # applied when the module loaded, not imported ahead of time
    assert "verl's own: equal" not in out  # the failure the fix is for (BufferError, or a bucket overwritten)
    assert "fixed: equal" in out
