"""verl's platform for the host CPU, registered as ``cpu`` in verl's `PlatformRegistry` when this module is imported.

verl resolves its platform once per process (`verl.plugin.platform.get_platform`): ``VERL_PLATFORM`` names it, else
the first registered platform that detects its hardware, else ``nvidia`` with a warning, so a process without an
accelerator gets CUDA's answers (`get_device_name()` = ``cuda``, Ray resource ``GPU``). This platform is never
auto-detected (`is_platform_available` is False, so GPU hosts and their CPU-only actors keep their platform); a process
selects it with ``VERL_PLATFORM=cpu`` and this module on ``VERL_USE_EXTERNAL_MODULES``, which `import verl` imports
before anything resolves the platform (`digenrl_verl.platform.process_env` builds both for CPU worker processes;
`select_cpu_platform` does it in the driver). Same hook in verl 0.9.1 and in verl 8a69493 (verl-omni's)."""

from __future__ import annotations

import os

from contextlib import contextmanager
from types import ModuleType
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from digenrl_verl.platform import cpu_device
from digenrl_verl.platform.filters import drop_message
from digenrl_verl.platform.after_import import after_import
from digenrl_verl.platform.verl_fixes import (
    PROCESS_GROUP_MODULE, RECEIVER_MODULE, fix_cpu_process_group_backend, fix_cpu_shm_receive)

PLATFORM_NAME = "cpu"
#: set to 1 where verl's replicas run on this CPU: Ray's logical GPUs (``ray.init(num_gpus=N)``) are the devices
LOGICAL_GPUS_VAR = "DIGENRL_CPU_RAY_GPUS"


def logical_gpus() -> bool:
    """Whether this process's devices are Ray's logical GPUs (``DIGENRL_CPU_RAY_GPUS=1``): verl's rollout replicas
    ask for ``GPU`` in four places (`ResourcePoolManager`'s check, `RayResourcePool`'s bundles, the worker group's
    ``use_gpu``, `launch_servers`' accelerator ids) and count the slots a replica holds by them; a Ray cluster started
    with ``num_gpus`` gives CPU processes those slots, and torch still sees no accelerator in them."""
    return os.environ.get(LOGICAL_GPUS_VAR, "0") == "1"

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
        return "GPU" if logical_gpus() else "CPU"

    def get_device_uuid(self, device_id: Any = 0) -> str:
        """The process's one device (verl's `get_device_id()` is torch's ``cpu`` device here, not an index): the
        Ray slot it holds (``CUDA_VISIBLE_DEVICES``, set by Ray for a logical GPU) or 0. verl's rollout server adapter
        and verl-omni's worker extension name their weight-transfer socket by it."""
        visible = [d for d in os.environ.get(self.visible_devices_envvar(), "").split(",") if d.strip()]
        index = device_id if isinstance(device_id, int) else 0
        return f"{self.ray_resource_name()}-{visible[index] if index < len(visible) else index}"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        if logical_gpus():
            return {"num_gpus": num_gpus}  # one of Ray's logical GPUs: the replica's device slot
        return {}  # a CPU worker asks for no accelerator; its CPU comes from its placement-group bundle

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# verl's stock TrainingWorker builds its process group with `cpu:gloo,<device>:<backend>`: `cpu:gloo,cpu:gloo` here
after_import(PROCESS_GROUP_MODULE, fix_cpu_process_group_backend)
# verl's weight receiver keeps views of the shared memory on the CPU (verl_fixes): copies, once verl's module loads
after_import(RECEIVER_MODULE, fix_cpu_shm_receive)
