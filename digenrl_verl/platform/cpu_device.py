"""The device module of the CPU platform (`verl.utils.device.get_torch_device()` when the CPU platform is selected):
the calls verl makes on `torch.cuda`, answered for the host CPU. `current_device()` is `torch.device("cpu")` (a
value `.to()` takes), caches and memory statistics are no-ops or zeros, streams and events are `torch.cpu`'s."""

from __future__ import annotations

import psutil
import torch

Stream = torch.cpu.Stream
Event = torch.cpu.Event
StreamContext = torch.cpu.StreamContext
stream = torch.cpu.stream
current_stream = torch.cpu.current_stream


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def current_device() -> torch.device:
    return torch.device("cpu")


def device_count() -> int:
    return 1


def set_device(device=None) -> None:
    """One logical device: nothing to select."""


def get_device_name(device=None) -> str:
    return "cpu"


def synchronize(device=None) -> None:
    """CPU ops run eagerly: nothing is queued."""


def empty_cache() -> None:
    """The CPU allocator keeps no cache to release."""


def ipc_collect() -> None:
    """No inter-process device memory to collect."""


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(state)


def memory_allocated(device=None) -> int:
    return 0


def max_memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


def max_memory_reserved(device=None) -> int:
    return 0


def reset_peak_memory_stats(device=None) -> None:
    """No device memory statistics are kept."""


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Host memory is not partitioned per process."""


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of host memory."""
    mem = psutil.virtual_memory()
    return int(mem.available), int(mem.total)
