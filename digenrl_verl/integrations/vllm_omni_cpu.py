"""vLLM-Omni's in-process diffusion pipelines on CPU: the few shims its own loader and forward need.

vLLM-Omni builds a diffusion pipeline inside a worker process (`DiffusionWorker.init_device`, then
`DiffusionModelRunner.load_model` → `DiffusersPipelineLoader.load_model`) and drives it with
`pipeline.forward(DiffusionRequestBatch(...))` (`DiffusionModelRunner._execute_request_list`). Everything in that
chain is plain torch except three device assumptions, which this module replaces for a CPU process:

1. **The platform** (`install_cpu_platform`): the package's CPU platforms for vLLM and vLLM-Omni, which both resolve
   from the package's entry points (`digenrl_verl.platform.vllm_plugins`) in every process without an accelerator,
   the spawned diffusion workers of a real `AsyncOmni` included; this harness only checks that vLLM-Omni's platform in
   this process is that one (`CpuOmniPlatform`) and applies the float32 attention patch a worker's plugin applies
   there (`omni_cpu_attention.patch_sdpa_forward`). It no longer brings a platform of its own.
2. (Retired: the SDPA dispatch, now the platform's attention backend plus that patch; pinned LoRA memory, now off
   through the vLLM platform's `is_pin_memory_available`.)
3. **The world** (`cpu_omni_world`): a single-rank gloo process group plus vLLM-Omni's model-parallel groups, set up
   as `init_device` does; once per process.

`load_omni_pipeline` then builds any registered pipeline class (e.g. verl-omni's rollout adapters) with vLLM-Omni's
own loader (`load_format="custom_pipeline"`, the call `re_init_pipeline` makes), and `OmniPipelineHandle.forward`
runs a request batch the way the model runner does (`torch.inference_mode()`, the forward context, CPU generators
from request seeds). New weights go in as verl-omni's rollout worker extension puts them: `load_weights` (full
weights) and `add_lora` (vLLM-Omni's `DiffusionLoRAManager`).

Usage (fp32; the loader's default dtype is bf16)::

    from digenrl_verl.integrations import vllm_omni_cpu as oc
    oc.install_cpu_platform()
    oc.stub_torchvision()          # only for Wan pipelines, see its docstring
    handle = oc.load_omni_pipeline(model_dir, "verl_omni.pipelines....QwenImagePipelineWithLogProb")
    outputs = handle.forward([OmniDiffusionRequest(...), ...])   # one DiffusionOutput per request
    handle.load_weights([("transformer." + name, tensor) for name, tensor in diffusers_transformer_state.items()])

Every vllm / vllm_omni import is inside a function: this module imports where vLLM-Omni is not installed. A real
`AsyncOmni` with its spawned diffusion workers runs on CPU too, on the same platforms (the replica path); what this
harness adds is the pipeline in the calling process. What cannot run on CPU: non-SDPA attention backends, the
runner's CUDA generators, CUDA-IPC / NCCL weight sync.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from digenrl_verl.platform.torchvision_stub import stub_torchvision  # noqa: F401  (re-exported: the tests' entry)
from digenrl_verl.weights.sync import free_port

logger = logging.getLogger(__name__)

_state: dict[str, Any] = {"world": None}


def install_cpu_platform() -> None:
    """Check that vLLM-Omni's `current_omni_platform` here is the package's `CpuOmniPlatform` (resolved from its entry
    point) and apply the float32 SDPA patch its diffusion workers apply (idempotent).

    Raises:
        RuntimeError: CUDA is available (a CPU-only harness), or the platform is another one: the package's
            ``vllm_omni.platform_plugins`` entry point is not installed here, or ``DIGENRL_CPU_PLATFORM=0``.
    """
    import torch

    if torch.cuda.is_available():
        raise RuntimeError("vllm_omni_cpu.install_cpu_platform: CUDA is available; this harness is for CPU-only "
                           "processes (vLLM-Omni's own platform and workers run there)")
    import vllm_omni.platforms as platforms

    from digenrl_verl.platform.omni_cpu import CpuOmniPlatform
    from digenrl_verl.platform.omni_cpu_attention import patch_sdpa_forward

    current = platforms.current_omni_platform
    if not isinstance(current, CpuOmniPlatform):
        raise RuntimeError(f"vllm_omni_cpu.install_cpu_platform: vLLM-Omni's platform here is "
                           f"{type(current).__name__}, not digenrl_verl's CpuOmniPlatform: install the package (its "
                           "vllm_omni.platform_plugins entry point) and leave DIGENRL_CPU_PLATFORM unset")
    patch_sdpa_forward()


def worker_vllm_config(od_config: Any) -> Any:
    """The `VllmConfig` `DiffusionWorker.init_device` builds for `od_config` on the CPU device (world size 1)."""
    import torch
    from vllm_omni.diffusion.worker.diffusion_worker import (_create_diffusion_worker_vllm_config,
                                                             _make_diffusion_vllm_model_config)

    vllm_config = _create_diffusion_worker_vllm_config(torch.device("cpu"), od_config)
    vllm_config.model_config = _make_diffusion_vllm_model_config(od_config)
    vllm_config.quant_config = od_config.quantization_config
    return vllm_config


@contextlib.contextmanager
def omni_model_context(od_config: Any, vllm_config: Any = None) -> Iterator[Any]:
    """vLLM-Omni's forward context and current vLLM config for `od_config`, as the worker enters them around a
    model's load and the runner around its forward. Yields the `VllmConfig` (built by `worker_vllm_config` if
    not given)."""
    from vllm.config import set_current_vllm_config
    from vllm_omni.diffusion.forward_context import set_forward_context

    vllm_config = worker_vllm_config(od_config) if vllm_config is None else vllm_config
    with set_forward_context(vllm_config=vllm_config, omni_diffusion_config=od_config), \
            set_current_vllm_config(vllm_config):
        yield vllm_config


def cpu_omni_world() -> None:
    """A process-wide single-rank gloo world with vLLM-Omni's model-parallel groups (all of size 1), as
    `DiffusionWorker.init_device` sets it up. Idempotent; installs the CPU platform first.

    Raises:
        RuntimeError: torch.distributed is already initialized with a world size other than 1.
    """
    if _state["world"] is not None:
        return
    install_cpu_platform()
    import torch
    from vllm_omni.diffusion.data import OmniDiffusionConfig
    from vllm_omni.diffusion.distributed.parallel_state import (init_distributed_environment,
                                                                initialize_model_parallel)

    dist = torch.distributed
    if dist.is_initialized() and dist.get_world_size() != 1:
        raise RuntimeError(f"vllm_omni_cpu.cpu_omni_world: torch.distributed already has world size "
                           f"{dist.get_world_size()}; vLLM-Omni on CPU runs a single rank")
    owned = not dist.is_initialized()
    od_config = OmniDiffusionConfig()
    with omni_model_context(od_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
        initialize_model_parallel(backend="gloo")
    _state["world"] = {"owns_process_group": owned}


def close_cpu_omni_world() -> None:
    """Tear down what `cpu_omni_world` set up: vLLM-Omni's groups, and the process group if it created it."""
    world = _state["world"]
    if world is None:
        return
    import torch
    from vllm_omni.diffusion.distributed.parallel_state import destroy_distributed_env

    destroy_distributed_env()
    if world["owns_process_group"] and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _state["world"] = None


def build_od_config(model_dir: str, pipeline_class: str, *, dtype: str = "float32", **kwargs: Any) -> Any:
    """vLLM-Omni's `OmniDiffusionConfig` for a custom pipeline, as its stage process builds it: `from_kwargs`,
    then `enrich_config` (model class from model_index.json, transformer config). `kwargs` are further
    `OmniDiffusionConfig` fields."""
    from vllm_omni.diffusion.data import OmniDiffusionConfig

    args = {"model": str(model_dir), "dtype": dtype, "custom_pipeline_args": {"pipeline_class": pipeline_class},
            "master_port": free_port(), **kwargs}
    od_config = OmniDiffusionConfig.from_kwargs(**args)
    od_config.enrich_config()
    return od_config


@dataclass
class OmniPipelineHandle:
    """A vLLM-Omni pipeline loaded in this process, with what its forward needs.

    Attributes:
        pipe: the pipeline module (e.g. verl-omni's `QwenImagePipelineWithLogProb`).
        od_config: its `OmniDiffusionConfig`.
        vllm_config: the worker `VllmConfig` its load ran under (and its forwards run under).
        lora_manager: vLLM-Omni's `DiffusionLoRAManager` for `pipe`, created by the first `add_lora` (None before).

    Weight updates go in as verl-omni's rollout worker extension puts them (`vLLMOmniColocateWorkerExtension.
    update_weights_from_ipc`): full weights through `load_weights`, LoRA adapters through `add_lora` (and each
    request's `sampling_params.lora_request` selects the adapter, as in `DiffusionWorker.execute_model`).
    """

    pipe: Any
    od_config: Any
    vllm_config: Any = field(repr=False, default=None)
    lora_manager: Any = field(repr=False, default=None)

    def context(self) -> contextlib.AbstractContextManager:
        """The model context (`omni_model_context`) of this pipeline."""
        return omni_model_context(self.od_config, self.vllm_config)

    def forward(self, requests: Sequence[Any] | Any, **kwargs: Any) -> list[Any]:
        """Run one request batch as `DiffusionModelRunner._execute_request_list` does.

        Args:
            requests: `OmniDiffusionRequest`s (or a `DiffusionRequestBatch`). A request with a `seed` and no
                `generator` gets a CPU generator seeded with it (the runner's `_initialize_generator` on CPU).
            kwargs: extra keyword arguments of the pipeline's `forward` (e.g. Wan's `output_type="latent"`; the
                engine itself passes none).
        Returns:
            one `DiffusionOutput` per request, in request order.
        """
        import torch
        from vllm_omni.diffusion.data import DiffusionOutput
        from vllm_omni.diffusion.worker.request_batch import DiffusionRequestBatch

        batch = requests if isinstance(requests, DiffusionRequestBatch) else DiffusionRequestBatch(list(requests))
        if not batch.requests:
            return []
        if batch.num_reqs > 1 and not getattr(self.pipe, "supports_request_batch", False):
            raise ValueError(f"{type(self.pipe).__name__} does not support request batches (supports_request_batch "
                             f"is False); send one request per forward, got {batch.num_reqs}")
        if self.lora_manager is not None:  # the worker activates the first request's adapter (None: base weights)
            params = batch.requests[0].sampling_params
            self.lora_manager.set_active_adapter(params.lora_request, params.lora_scale)
        for req in batch.requests:
            if req.prompt is None:
                raise ValueError(f"request {req.request_id!r} has no prompt")
            params = req.sampling_params
            if params.generator is None and params.seed is not None:
                params.generator = torch.Generator(device=params.generator_device or "cpu").manual_seed(params.seed)
        with torch.inference_mode(), self.context():
            outputs = self.pipe.forward(batch, **kwargs)
        outputs = [outputs] if isinstance(outputs, DiffusionOutput) else list(outputs)
        if len(outputs) != batch.num_reqs:
            raise RuntimeError(f"{type(self.pipe).__name__}.forward returned {len(outputs)} outputs for "
                               f"{batch.num_reqs} requests")
        return outputs

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        """Load full weights into the pipeline: `pipe.load_weights`, verl-omni's full-weight path.

        Args:
            weights: `(name, tensor)` pairs named as verl-omni's trainer sends them: `"transformer." + the diffusers
                transformer's state-dict name` (vLLM-Omni's loader maps those onto its fused layers, e.g. q/k/v
                onto `to_qkv`).
        Returns:
            the pipeline parameter names that were loaded.
        """
        import torch

        with torch.no_grad(), self.context():
            return set(self.pipe.load_weights(weights))

    def add_lora(self, lora_request: Any) -> bool:
        """Register a LoRA adapter (`DiffusionWorker.add_lora`); the manager is created on first use as
        `DiffusionWorker.init_lora_manager` does (PEFT backend).

        verl-omni sends in-memory adapters as its `OmniTensorLoRARequest` (`peft_config`, `lora_tensors` named
        `"transformer." + peft name` without `base_model.model.`), which needs its `VLLMOmniHijack.hijack()`
        first. Caveat (vLLM-Omni 0.27): a LoRA module whose diffusers name the vLLM-Omni transformer does not
        have is silently skipped (Qwen-Image `attn.to_out.0`; Wan `to_out.0`, `ffn.net.0.proj`, `ffn.net.2`).
        """
        if self.lora_manager is None:
            self.lora_manager = self._make_lora_manager()
        with self.context():
            return self.lora_manager.add_adapter(lora_request)

    def remove_lora(self, adapter_id: int) -> bool:
        """Drop a registered LoRA adapter (`DiffusionWorker.remove_lora`); False when there is none."""
        return False if self.lora_manager is None else self.lora_manager.remove_adapter(adapter_id)

    def _make_lora_manager(self) -> Any:
        import torch
        from vllm_omni.diffusion.lora.manager import DiffusionLoRAManager

        lora_path = self.od_config.lora_path
        if isinstance(lora_path, list) and len(lora_path) == 1:
            lora_path = lora_path[0]
        return DiffusionLoRAManager(pipeline=self.pipe, device=torch.device("cpu"), dtype=self.od_config.dtype,
                                    max_cached_adapters=self.od_config.max_cpu_loras, lora_path=lora_path,
                                    lora_scale=self.od_config.lora_scale)


def load_omni_pipeline(model_dir: str, pipeline_class: str, *, dtype: str = "float32",
                       **od_kwargs: Any) -> OmniPipelineHandle:
    """Build `pipeline_class` from a diffusers directory with vLLM-Omni's own loader, on CPU.

    This is the call `CustomPipelineWorkerExtension.re_init_pipeline` makes (`DiffusersPipelineLoader.load_model(
    load_format="custom_pipeline")`), under the worker's model context; the CPU platform and the world are set
    up first (`cpu_omni_world`). Wan pipelines need `stub_torchvision()` first.

    Args:
        model_dir: local diffusers model directory (model_index.json).
        pipeline_class: dotted path of the pipeline class (verl-omni: `VllmOmniPipelineBase.get_pipeline_path`).
        dtype: the pipeline dtype ("float32" for comparisons; vLLM-Omni's default is bf16).
        od_kwargs: further `OmniDiffusionConfig` fields.
    """
    import torch

    cpu_omni_world()
    from vllm.config import LoadConfig
    from vllm_omni.diffusion.model_loader.diffusers_loader import DiffusersPipelineLoader

    od_config = build_od_config(model_dir, pipeline_class, dtype=dtype, **od_kwargs)
    vllm_config = worker_vllm_config(od_config)
    with omni_model_context(od_config, vllm_config):
        pipe = DiffusersPipelineLoader(LoadConfig(), od_config=od_config).load_model(
            load_device="cpu", load_format="custom_pipeline", custom_pipeline_name=pipeline_class,
            device=torch.device("cpu"))
    return OmniPipelineHandle(pipe=pipe, od_config=od_config, vllm_config=vllm_config)
