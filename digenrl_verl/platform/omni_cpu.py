"""The host CPU as vLLM-Omni's platform, resolved by vLLM-Omni from the entry point in
`digenrl_verl.platform.vllm_plugins` (active only without an accelerator; ``DIGENRL_CPU_PLATFORM=0`` turns it off),
while `import vllm_omni` runs: this module imports nothing of vLLM-Omni but its platform interface, and names the
classes it hands out by path.

`CpuOmniPlatform` is vLLM-Omni's `OmniPlatform` on top of `CpuVllmPlatform` (as vLLM-Omni's `CudaOmniPlatform` sits on
vLLM's CUDA platform): ``DIGENRL_CPU_DEVICES`` logical devices (default 8: a diffusion worker's rank maps onto them as
onto GPUs), vLLM-Omni's stage configs (``vllm_omni/deploy``, what its CUDA platform names), torch SDPA through the
attention-backend hook (`omni_cpu_attention.CpuSDPABackend`: the CUDA path of vLLM-Omni's SDPA implementation,
plain torch; any other backend is refused by name), the diffusion worker through the worker hook
(`vllm_cpu_worker.CpuDiffusionWorker`: sleep and wake-up without CuMem).
"""

from __future__ import annotations

import os

import torch
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

from digenrl_verl.platform.vllm_cpu import CpuVllmPlatform

DEVICES_VAR = "DIGENRL_CPU_DEVICES"
SDPA_NAMES = (None, "TORCH_SDPA", "SDPA")
CPU_SDPA_BACKEND = "digenrl_verl.platform.omni_cpu_attention.CpuSDPABackend"


class CpuOmniPlatform(OmniPlatform, CpuVllmPlatform):
    _omni_enum = OmniPlatformEnum.OOT

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/deploy"

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        raise NotImplementedError("CpuOmniPlatform (digenrl_verl): autoregressive stages need an accelerator; "
                                  "diffusion stages run on CPU")

    get_omni_generation_worker_cls = get_omni_ar_worker_cls

    @classmethod
    def get_diffusion_attn_backend_cls(cls, selected_backend: str | None, head_size: int,
                                       allow_trtllm_default: bool = False) -> str:
        name = selected_backend.upper() if isinstance(selected_backend, str) else selected_backend
        if name not in SDPA_NAMES:
            raise ValueError(f"diffusion attention backend {selected_backend!r} needs an accelerator; on CPU "
                             "(digenrl_verl's CpuOmniPlatform) only TORCH_SDPA runs: set rollout_attn_backend / "
                             "diffusion_attention_config to TORCH_SDPA or leave it unset")
        return CPU_SDPA_BACKEND

    @classmethod
    def get_diffusion_worker_cls(cls) -> str:
        return "digenrl_verl.platform.vllm_cpu_worker.CpuDiffusionWorker"

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        return int(os.environ.get(DEVICES_VAR, "8"))

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        return None

    @classmethod
    def synchronize(cls) -> None:  # OmniPlatform's raises, and comes first in the MRO
        return None

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        return cls.get_device_memory(device)[0]

    @classmethod
    def get_device_memory(cls, device: torch.device | None = None) -> tuple[int, int]:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(free), int(total)
