"""vLLM-Omni's diffusion worker on the host CPU, the class `CpuOmniPlatform.get_diffusion_worker_cls` names:
vLLM-Omni's `DiffusionWorker` whose sleep / wake-up have no CuMem pool to release or map back (the weights stay
where they are, in process memory), so they are the protocol's calls with nothing to move. The rest (device and gloo
world, model loading, execution, LoRA, the worker extension) is vLLM-Omni's."""

from __future__ import annotations

import contextlib

from vllm_omni.diffusion.worker.diffusion_worker import DiffusionWorker


class CpuDiffusionWorker(DiffusionWorker):
    """`DiffusionWorker` on CPU: sleep and wake-up without a CuMem allocator."""

    def sleep(self, level: int = 1) -> int:
        return 0  # bytes released: the weights are process memory, nothing is offloaded

    def wake_up(self, tags: list[str] | None = None) -> bool:
        return True

    def _maybe_get_memory_pool_context(self, tag: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()
