"""verl's platform for the host CPU, registered as ``cpu`` in verl's `PlatformRegistry` when this module is imported.

verl resolves its platform once per process (`verl.plugin.platform.get_platform`): ``VERL_PLATFORM`` names it, else
the first registered platform that detects its hardware, else ``nvidia`` with a warning, so a process without an
accelerator gets CUDA's answers (`get_device_name()` = ``cuda``, Ray resource ``GPU``). This platform is never
auto-detected (`is_platform_available` is False, so GPU hosts and their CPU-only actors keep their platform); a process
selects it with ``VERL_PLATFORM=cpu`` and this module on ``VERL_USE_EXTERNAL_MODULES``, which `import verl` imports
before anything resolves the platform (`digenrl_verl.platform.process_env` builds both for CPU worker processes;
`select_cpu_platform` does it in the driver). Same hook in verl 0.9.1 and in verl 8a69493 (verl-omni's)."""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from digenrl_verl.platform import cpu_device
from digenrl_verl.platform.filters import drop_message

PLATFORM_NAME = "cpu"

# verl logs the platform a process takes from VERL_PLATFORM, at INFO (its platform manager's level is INFO, the rest
# of verl's WARN), in every worker process; here that is our own choice, which the run's plan already states
drop_message("verl.plugin.platform.platform_manager", f"Platform override from VERL_PLATFORM: {PLATFORM_NAME}")


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """The host CPU as verl's device: one logical device, gloo collectives, Ray's ``CPU`` resource."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return cpu_device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # opt-in only (VERL_PLATFORM=cpu): never chosen by verl's auto-detection

    def current_device(self) -> torch.device:
        # verl's get_device_id() feeds FSDP2 (`module.to(device_id)`, `device_id=`): an int there means an
        # accelerator index ("Cannot access accelerator device" on a CPU host), the host's device is torch's "cpu"
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # CUDA allocator options (expandable_segments) mean nothing on the host

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return (None, None)

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # read by nothing on CPU; Ray leaves it unset for CPU-only actors

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {}  # a CPU worker asks for no accelerator; its CPU comes from its placement-group bundle

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
