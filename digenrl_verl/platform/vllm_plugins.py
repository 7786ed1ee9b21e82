"""vLLM's and vLLM-Omni's platform plugins for the host CPU (entry points in setup.py, groups
``vllm.platform_plugins`` and ``vllm_omni.platform_plugins``).

Both packages resolve their platform once per process from the installed entry points of these groups, in every
process: the driver, an `AsyncOmni`'s stage processes and the diffusion workers it **spawns**, where no in-process
patch reaches. Each function returns the qualified name of the platform class when it should be active, else None,
and it is active only when all three hold:

- no accelerator is visible to torch (CUDA / ROCm, XPU, NPU, MUSA): on a GPU host, and in a CPU-only actor of a GPU
  host, vLLM's and vLLM-Omni's own platforms decide;
- ``DIGENRL_CPU_PLATFORM`` is not ``0`` (the switch that turns both off);
- (vLLM only) vLLM is not itself a CPU build (its version carries ``+cpu``): then its own `CpuPlatform` activates.

`cpu_worker_plugin` (entry point of ``vllm_omni.general_plugins``, which every diffusion worker process loads before
it builds its `WorkerProc`) applies, on CPU and in a diffusion worker process only, the three patches no hook covers:
- `WorkerProc._async_output_loop` (the thread that moves a result to shared memory) builds a side stream from
  ``torch.accelerator.current_accelerator().type``, None on a host without an accelerator, so the thread dies and
  every request waits forever; and a stream handed to `pack_diffusion_output_shm` means a pinned, stream-ordered
  copy. That thread is answered the CPU device, and a CPU stream is not handed on (the plain copy path);
- the worker's main thread (COMPUTE_DONE, RPC replies) and that output thread (OUTPUT_READY) both write the one
  result `MessageQueue`, whose `enqueue` is not thread-safe (its ring-buffer slot and its zmq socket); on CPU the
  output thread writes at once, so a reply can race it: libzmq aborts the worker (``Assertion failed: check ()
  (src/msg.cpp:387)``) and the request waits forever. Writes to one queue are serialized (`_serialized_enqueue`);
- float32 attention always goes through vLLM-Omni's stock `SDPAImpl`, whose `forward` refuses an out-of-tree
  platform (`digenrl_verl.platform.omni_cpu_attention.patch_sdpa_forward`);
and, where torchvision is not installed, empty torchvision modules (`digenrl_verl.platform.torchvision_stub`).
patches/vllm-omni-0.27.0rc1/README.md writes both up as the upstream fixes.

This module imports neither vLLM nor torch at import time: the resolvers import it in every process.
"""

from __future__ import annotations

import os
import threading
from typing import Any

SWITCH_VAR = "DIGENRL_CPU_PLATFORM"
VLLM_PLATFORM = "digenrl_verl.platform.vllm_cpu.CpuVllmPlatform"
OMNI_PLATFORM = "digenrl_verl.platform.omni_cpu.CpuOmniPlatform"
OUTPUT_THREAD = "DiffusionAsyncOutput"  # the name vLLM-Omni's WorkerProc gives its output thread


def accelerator_visible() -> str | None:
    """The kind of accelerator torch sees in this process, else None."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    for kind in ("xpu", "npu", "musa"):
        module = getattr(torch, kind, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            return kind
    return None


def cpu_platform_active() -> bool:
    """True when the package's CPU platforms should be vLLM's and vLLM-Omni's in this process."""
    if os.environ.get(SWITCH_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return accelerator_visible() is None


def vllm_platform_plugin() -> str | None:
    """Entry point of ``vllm.platform_plugins``: `CpuVllmPlatform`, on a host without an accelerator."""
    if not cpu_platform_active():
        return None
    from importlib.metadata import version

    if "cpu" in version("vllm"):  # a CPU build of vLLM: its own CpuPlatform activates
        return None
    return VLLM_PLATFORM


def omni_platform_plugin() -> str | None:
    """Entry point of ``vllm_omni.platform_plugins``: `CpuOmniPlatform`, on a host without an accelerator (the
    torchvision stand-ins go in first where torchvision is not installed)."""
    if not cpu_platform_active():
        return None
    from digenrl_verl.platform.torchvision_stub import stub_torchvision

    stub_torchvision()  # before verl-omni's server module imports torchvision (`import verl_omni` resolves us first)
    return OMNI_PLATFORM



def _cpu_for_output_thread(original: Any) -> Any:
    """`torch.accelerator.current_accelerator`, answering the CPU device in the output thread when torch has none."""
    import torch

    def current_accelerator(*args: Any, **kwargs: Any) -> Any:
        found = original(*args, **kwargs)
        if found is None and threading.current_thread().name == OUTPUT_THREAD:
            return torch.device("cpu")
        return found

    current_accelerator.digenrl_cpu_output_thread = True
    return current_accelerator


def _no_cpu_stream(pack: Any) -> Any:
    """`pack_diffusion_output_shm` that takes a CPU stream as no stream (its plain copy path)."""

    def pack_diffusion_output_shm(output: Any, d2h_stream: Any = None) -> Any:
        if d2h_stream is not None and d2h_stream.device.type == "cpu":
            d2h_stream = None
        return pack(output, d2h_stream=d2h_stream)

    pack_diffusion_output_shm.digenrl_cpu_output_thread = True
    return pack_diffusion_output_shm


def _serialized_enqueue(enqueue: Any) -> Any:
    """`MessageQueue.enqueue` that one thread at a time runs for a given queue (a lock per queue, made under one)."""
    made = threading.Lock()

    def serialized(self: Any, *args: Any, **kwargs: Any) -> Any:
        lock = self.__dict__.get("_digenrl_enqueue_lock")
        if lock is None:
            with made:
                lock = self.__dict__.setdefault("_digenrl_enqueue_lock", threading.Lock())
        with lock:
            return enqueue(self, *args, **kwargs)

    serialized.digenrl_serialized = True
    return serialized


def cpu_worker_plugin() -> None:
    """vLLM-Omni general plugin (every process; idempotent): on CPU, a diffusion worker's output thread, its result
    queue's writes from two threads, and float32 attention run."""
    import sys

    worker = sys.modules.get("vllm_omni.diffusion.worker.diffusion_worker")
    if worker is None or not cpu_platform_active():  # only a diffusion worker process has its module loaded
        return
    import torch

    if not getattr(torch.accelerator.current_accelerator, "digenrl_cpu_output_thread", False):
        torch.accelerator.current_accelerator = _cpu_for_output_thread(torch.accelerator.current_accelerator)
    if not getattr(worker.pack_diffusion_output_shm, "digenrl_cpu_output_thread", False):
        worker.pack_diffusion_output_shm = _no_cpu_stream(worker.pack_diffusion_output_shm)
    if not getattr(worker.MessageQueue.enqueue, "digenrl_serialized", False):
        worker.MessageQueue.enqueue = _serialized_enqueue(worker.MessageQueue.enqueue)
    from digenrl_verl.platform.omni_cpu_attention import patch_sdpa_forward
    from digenrl_verl.platform.torchvision_stub import stub_torchvision

    patch_sdpa_forward()
    stub_torchvision()  # where torchvision is not installed (Wan's package imports it)
