"""The one place verl 8a69493 takes no hook on a CPU host, patched where verl's CPU platform is loaded.

`verl.utils.distributed.initialize_global_process_group_ray` builds its default backend as
``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``: with verl's platform on the host CPU that is
``cpu:gloo,cpu:gloo``, which torch refuses (``Duplicate device type cpu``), so verl's and verl-omni's stock
``TrainingWorker`` cannot start on CPU (our own trainer ranks build their process group first and never reach it).
The upstream fix (patches/README.md, "verl 8a69493"): one ``cpu:gloo`` when the device is the CPU. Until it
lands, `fix_cpu_process_group_backend` wraps the function in `verl.utils.distributed` before any worker module
imports it by name; the wrapper changes nothing unless the backend is left to verl and the device is the CPU (a CUDA
host keeps ``cpu:gloo,cuda:nccl``)."""

from __future__ import annotations

import functools

PATCHED = "_digenrl_cpu_backend"


def cpu_backend(backend: str | None, device_name: str) -> str | None:
    """The backend to hand verl's function: ``cpu:gloo`` where verl would build a duplicate for the CPU device."""
    return "cpu:gloo" if backend is None and device_name == "cpu" else backend


def fix_cpu_process_group_backend() -> None:
    """Wrap `verl.utils.distributed.initialize_global_process_group_ray` (once per process)."""
    from verl.utils import distributed
    from verl.utils.device import get_device_name

    original = distributed.initialize_global_process_group_ray
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=cpu_backend(backend, get_device_name()))

    setattr(initialize_global_process_group_ray, PATCHED, True)
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
