"""The host CPU as a vLLM platform, resolved by vLLM from the entry point in `digenrl_verl.platform.vllm_plugins`
(active only without an accelerator; ``DIGENRL_CPU_PLATFORM=0`` turns it off): vLLM's own `CpuPlatform` (gloo, no
pinned memory, CPU communicator), which vLLM activates only for a CPU build of vLLM; added: memory statistics from
the process's resident memory (vLLM's memory profiler asks for them when a diffusion worker loads a model) and the
peak-memory calls a diffusion runner makes. vLLM resolves its platform while `import vllm` runs: this module imports
nothing of vLLM but its CPU platform (vLLM-Omni's platform is `digenrl_verl.platform.omni_cpu`)."""

from __future__ import annotations

import os
import resource

import torch
from vllm.platforms.cpu import CpuPlatform



def _resident_bytes() -> float:
    """The process's resident memory now (Linux /proc), else its peak (getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


class CpuVllmPlatform(CpuPlatform):
    """vLLM's `CpuPlatform` for a vLLM wheel that is not a CPU build (the kernels of `vllm._C` are never asked for
    by a diffusion worker)."""

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return _resident_bytes()

    @classmethod
    def reset_peak_memory_stats(cls, device: torch.types.Device | None = None) -> None:
        return None

    @classmethod
    def max_memory_allocated(cls, device: torch.types.Device | None = None) -> int:
        return int(_resident_bytes())

    @classmethod
    def max_memory_reserved(cls, device: torch.types.Device | None = None) -> int:
        return int(_resident_bytes())

    @classmethod
    def memory_allocated(cls, device: torch.types.Device | None = None) -> int:
        return int(_resident_bytes())

    @classmethod
    def empty_cache(cls) -> None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def import_kernels(cls) -> None:  # the CUDA wheel's vllm._C does not load on CPU; nothing here needs it
        return None


