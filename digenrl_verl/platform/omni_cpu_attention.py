"""vLLM-Omni's torch SDPA attention on CPU.

- `CpuSDPABackend`, the backend `CpuOmniPlatform.get_diffusion_attn_backend_cls` names (the hook a platform has).
- `patch_sdpa_forward`: vLLM-Omni's attention layer runs float32 through its stock `SDPAImpl` whatever the platform
  chose (`Attention._run_local_attention`, the ``sdpa_fallback``), and `AttentionImpl.forward` dispatches on the
  platform and raises for one it does not list (out-of-tree platforms included). No hook reaches that instance, so
  on CPU `SDPAImpl.forward` runs the body of its CUDA path (plain torch SDPA, mask broadcast over keys): the smallest
  patch, applied by `digenrl_verl.platform.vllm_plugins.cpu_worker_plugin` in each diffusion worker and by the
  in-process harness; patches/vllm-omni-0.27.0rc1/README.md writes it up as the upstream fix.
"""

from __future__ import annotations

from vllm_omni.diffusion.attention.backends.sdpa import SDPABackend, SDPAImpl


def _forward_on_cpu(self, query, key, value, attn_metadata=None):
    return self.forward_cuda(query, key, value, attn_metadata)


_forward_on_cpu.digenrl_cpu = True


class CpuSDPAImpl(SDPAImpl):
    """vLLM-Omni's SDPA implementation on CPU: the body of its CUDA path (plain torch SDPA)."""

    forward = _forward_on_cpu


class CpuSDPABackend(SDPABackend):
    @staticmethod
    def get_impl_cls() -> type[CpuSDPAImpl]:
        return CpuSDPAImpl


def patch_sdpa_forward() -> None:
    """On CPU: vLLM-Omni's stock `SDPAImpl.forward` runs its CUDA path's body (idempotent)."""
    if not getattr(SDPAImpl.forward, "digenrl_cpu", False):
        SDPAImpl.forward = _forward_on_cpu
