"""Generators on verl-omni's rollout: the RL pipeline verl-omni registers for the model's architecture and algorithm
(`VllmOmniPipelineBase`, `verl_omni/pipelines/*/vllm_omni_rollout_adapter.py`), built by vLLM-Omni's own loader, as
a DigenRL `RolloutEngine` (rollout engine ``verl_omni``).

What runs is the code verl-omni's replicas run: vLLM-Omni's `DiffusersPipelineLoader` builds verl-omni's adapter
class (the call `re_init_pipeline` makes in the vLLM-Omni worker), real `OmniDiffusionRequest`s in a
`DiffusionRequestBatch` go through its `forward`, its `trajectory_*` outputs are the samples (verl-omni's window
SDE: per row one window of ``sde_window_size`` consecutive steps whose start is drawn in ``sde_window_range``), and
weights reach it through the pipeline's `load_weights`, which verl-omni's worker extension calls on every update
(`vLLMOmniColocateWorkerExtension.update_weights_from_ipc`, full weights). On CPU the pipeline lives in the
generator's process (`integrations.vllm_omni_cpu`: vLLM-Omni has no CPU platform); the request / sampling split is
the server's (`vLLMOmniHttpServer._preprocess_input`: fields of `OmniDiffusionSamplingParams` first-class, the rest
in ``extra_args``). Not used here: the replica and server processes, the agent loop (prompts are tokenized with
the pipeline's own tokenizers, `prompt_fields`), verl-omni's per-row seeds (each row's seed derives from its
`SampleKey`, as every DigenRL engine's draws do).

Limits, each refused by name when built: LoRA (verl-omni sends LoRA as an `OmniTensorLoRARequest` through
vLLM-Omni's LoRA manager; not wired here), a timestep selection other than ``window`` (verl-omni samples SDE
windows), an architecture verl-omni registers no pipeline for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from digenrl_verl.diffusion.noise import SampleKey, sample_seed
from digenrl_verl.engines.base import ENGINES, Rollout, RolloutRows
from digenrl_verl.engines.spec import VERL_OMNI_ARCHITECTURES, PolicySpec, check_verl_omni_policy
from digenrl_verl.models.pipeline_adapter import to_uint8
from digenrl_verl.weights.state import load_trainer_state
from digenrl_verl.weights.sync import CollectiveSpec, Collectives, state_checksum

ENGINE_NAME = "verl_omni"
SIGMA_TOLERANCE = 1e-5
#: the transformer's place in the pipeline's weight names (`load_weights` maps pipeline-level names)
PIPELINE_PREFIX = "transformer."


def architecture_of(model_path: str) -> str:
    """The diffusers `_class_name` of a model directory (what verl-omni's registry is keyed by)."""
    return str(json.loads((Path(model_path) / "model_index.json").read_text())["_class_name"])


def pipeline_class(architecture: str, algorithm: str) -> str:
    """verl-omni's registered rollout pipeline for (architecture, algorithm), as vLLM-Omni loads it (dotted path);
    ValueError naming the key when verl-omni registers none."""
    import verl_omni.pipelines  # noqa: F401  (registers every pipeline verl-omni ships)
    from verl_omni.pipelines.model_base import VllmOmniPipelineBase

    path = VllmOmniPipelineBase.get_pipeline_path(architecture=architecture, algorithm=algorithm)
    if path is None:
        _import_rollout_adapters()
        path = VllmOmniPipelineBase.get_pipeline_path(architecture=architecture, algorithm=algorithm)
    if path is None:
        known = sorted(f"{a}/{g}" for a, g in VllmOmniPipelineBase._registry)
        raise ValueError(f"actor_rollout_ref.rollout.name={ENGINE_NAME}: verl-omni registers no rollout pipeline for "
                         f"{architecture} with {algorithm}; registered: {known}. Fix: "
                         "actor_rollout_ref.rollout.name=diffusers")
    return path


def _import_rollout_adapters() -> None:
    """Import each `verl_omni.pipelines.<family>.vllm_omni_rollout_adapter` again, after `stub_torchvision`:
    verl-omni's package imports them under try/except and leaves a family unregistered when its vLLM-Omni pipeline
    does not import (Wan2.2's package imports torchvision, which a CPU venv lacks; Wan text-to-video never uses it).
    A family that still fails stays unregistered, as in verl-omni."""
    import importlib
    import pkgutil

    import verl_omni.pipelines as pipelines

    from digenrl_verl.integrations.vllm_omni_cpu import stub_torchvision

    stub_torchvision()
    for info in pkgutil.iter_modules(pipelines.__path__):
        if info.ispkg:
            try:
                importlib.import_module(f"{pipelines.__name__}.{info.name}.vllm_omni_rollout_adapter")
            except (ImportError, RuntimeError, AttributeError):  # the exceptions verl-omni's own imports allow
                pass


def sampling_dict(spec: PolicySpec, sde_type: str) -> dict[str, Any]:
    """verl-omni's sampling dict (`rollout.pipeline` + `rollout.algo` + logprobs, as its agent loop builds it) for
    the resolved policy; None values are left out (the pipeline's defaults)."""
    p, r = spec.pipeline, spec.rollout
    window = r.sde_window_size or None  # verl-omni: None = the whole schedule
    values = {"height": p.height, "width": p.width, "num_frames": p.num_frames,
              "num_inference_steps": r.num_inference_steps, "guidance_scale": p.guidance_scale,
              "true_cfg_scale": p.true_cfg_scale, "max_sequence_length": p.max_sequence_length,
              "noise_level": float(r.noise_level), "sde_type": sde_type, "sde_window_size": window,
              "sde_window_range": list(r.sde_window_range) if r.sde_window_range is not None else None,
              "logprobs": True}
    if p.host_sigmas:
        values["sigmas"] = next((list(s[:-1]) for n, s in p.host_sigmas if n == r.num_inference_steps), None)
    return {k: v for k, v in values.items() if v is not None}


def split_sampling(sampling: Mapping[str, Any], params_cls: type) -> dict[str, Any]:
    """The server's split: fields of `OmniDiffusionSamplingParams` first-class, the rest in ``extra_args``."""
    first = {k: v for k, v in sampling.items() if hasattr(params_cls, k)}
    first["extra_args"] = {k: v for k, v in sampling.items() if not hasattr(params_cls, k)}
    return first


def _ids(tokens: Any) -> list[int]:
    ids, mask = tokens
    return [int(i) for i, m in zip(ids[0].tolist(), mask[0].tolist()) if m]


def _qwen_fields(pipe: Any, text: str, negative: str | None, max_len: int | None) -> dict[str, Any]:
    # the adapter's own text tokenization (its template; 34 leading tokens dropped in its encoder)
    out = {"prompt_token_ids": _ids(pipe._tokenize_text_prompt(text))}
    if negative is not None:
        out["negative_prompt_ids"] = _ids(pipe._tokenize_text_prompt(negative))
    return out


def _sd3_fields(pipe: Any, text: str, negative: str | None, max_len: int | None) -> dict[str, Any]:
    # the text path of vLLM-Omni's SD3 pipeline (CLIP and T5 tokenized by the pipeline itself)
    return {"prompt": text, **({"negative_prompt": negative} if negative is not None else {})}


def _wan_fields(pipe: Any, text: str, negative: str | None, max_len: int | None) -> dict[str, Any]:
    # T5 ids with its end token, as verl-omni's Wan recipe renders them (`custom_chat_template` + `</s>`)
    def ids(t: str) -> list[int]:
        return pipe.tokenizer(t, add_special_tokens=True, truncation=True, max_length=max_len or 512)["input_ids"]

    out = {"prompt_token_ids": ids(text)}
    if negative is not None:
        out["negative_prompt_ids"] = ids(negative)
    return out


#: architecture -> how a prompt text becomes the request's prompt fields (the families verl-omni has pipelines for)
PROMPT_FIELDS: dict[str, Callable[[Any, str, str | None, int | None], dict[str, Any]]] = {
    "QwenImagePipeline": _qwen_fields, "StableDiffusion3Pipeline": _sd3_fields, "WanPipeline": _wan_fields}
assert tuple(sorted(PROMPT_FIELDS)) == VERL_OMNI_ARCHITECTURES, "engines.spec lists the mapped architectures"
#: sampling keys that turn guidance on (> 1): the request then carries the negative prompt
_GUIDED = ("guidance_scale", "true_cfg_scale")


@dataclass(frozen=True)
class WindowRows:
    """What one output row of verl-omni's adapter holds, in the package's `Rollout` layout."""

    latents: torch.Tensor
    next_latents: torch.Tensor
    sigmas: torch.Tensor
    next_sigmas: torch.Tensor
    log_probs: torch.Tensor
    step_index: torch.Tensor


def window_rows(output: Any, schedule: torch.Tensor) -> WindowRows:
    """One `DiffusionOutput`'s trajectory (``trajectory_latents`` [1, W+1, *L], ``trajectory_log_probs`` [1, W],
    ``trajectory_timesteps`` [1, W] = σ·1000) as the package's per-step rows; `schedule`: the pipeline scheduler's
    σ_0..σ_N. The window's steps are found in the schedule (RuntimeError when they are not consecutive steps)."""
    lat = torch.as_tensor(output.trajectory_latents)[0].float()
    sig = torch.as_tensor(output.trajectory_timesteps)[0].float() / 1000.0
    gap = (schedule[:-1, None] - sig[None, :]).abs()
    idx = gap.argmin(dim=0)
    if float(gap.min(dim=0).values.max()) > SIGMA_TOLERANCE or (idx.numel() > 1 and not bool((idx.diff() == 1).all())):
        raise RuntimeError(f"verl-omni's rollout returned σ {sig.tolist()} that are not consecutive steps of its "
                           f"schedule {schedule.tolist()}")
    return WindowRows(lat[:-1], lat[1:], schedule[idx], schedule[idx + 1],
                      torch.as_tensor(output.trajectory_log_probs)[0].float(), idx.to(torch.int64))


def media_of(output: Any) -> torch.Tensor:
    """The decoded sample of one output (the pipeline's pixels in [-1, 1]) as uint8 [3, H, W] / [T, 3, H, W]."""
    payload = output.output
    media = payload.get("payload", payload) if isinstance(payload, dict) else payload
    if isinstance(media, dict):
        media = next(media[k] for k in ("video", "image", "output") if media.get(k) is not None)
    media = torch.as_tensor(media)[0]
    if media.dim() == 4:  # video [C, T, H, W] -> [T, C, H, W]
        media = media.permute(1, 0, 2, 3)
    return to_uint8(media)


def transformer_layout(model_path: str) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """The trainable parameters of a full fine-tune (name -> shape, dtype), in `named_parameters` order: the names
    and order in which trainers send them (the package's adapter holds the diffusers transformer, its
    `unused_modules` frozen). Built on the meta device, no memory."""
    import diffusers

    from digenrl_verl.models.registry import get_adapter_class

    folder = Path(model_path) / "transformer"
    config = json.loads((folder / "config.json").read_text())
    cls = getattr(diffusers, config["_class_name"])
    with torch.device("meta"):
        model = cls.from_config(cls.load_config(str(folder)))
    frozen = tuple(f"{m}." for m in get_adapter_class(architecture_of(model_path)).unused_modules(model))
    return {n: (p.shape, p.dtype) for n, p in model.named_parameters() if not n.startswith(frozen)}


def transformer_state(model_path: str, layout: Mapping[str, tuple[torch.Size, torch.dtype]],
                      dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model directory's transformer weights (diffusers names) in `layout`'s order, as `dtype`."""
    from safetensors.torch import load_file

    found: dict[str, torch.Tensor] = {}
    for f in sorted((Path(model_path) / "transformer").glob("*.safetensors")):
        found.update(load_file(str(f)))
    missing = [n for n in layout if n not in found]
    if missing:
        raise ValueError(f"actor_rollout_ref.model.path={model_path}: transformer weights missing {missing[:5]}")
    return {n: found[n].to(dtype) for n in layout}


@ENGINES.register(ENGINE_NAME)
class VerlOmniRolloutEngine:
    """Samples with verl-omni's registered rollout pipeline, loaded in this process by vLLM-Omni's loader.

    Args:
        handle: the loaded pipeline (`integrations.vllm_omni_cpu.OmniPipelineHandle`).
        spec: the policy (model, pipeline and rollout settings, the engine's dtype).
        state: the transformer's weights the pipeline holds, diffusers names in send order (what `trainable_state`
            reports and what arriving weights are received into before `load_weights`).
        version: the policy version of those weights.
    """

    def __init__(self, handle: Any, spec: PolicySpec, state: dict[str, torch.Tensor], version: int = 0) -> None:
        self.handle = handle
        self.spec = spec
        self.state = state
        self.version = int(version)
        self.collectives: Collectives | None = None
        _, sde_type = check_verl_omni_policy(spec)  # the architecture is one of PROMPT_FIELDS
        self.architecture = architecture_of(spec.model_path)
        self.sampling = sampling_dict(spec, sde_type)

    @classmethod
    def from_policy(cls, spec: PolicySpec) -> "VerlOmniRolloutEngine":
        """verl-omni's pipeline for the policy's model and algorithm, at `spec.start_version`, in the rollout's
        dtype. CPU only for now (`check_verl_omni_policy`: on CUDA verl-omni's rollout replicas are the path, not
        started by this engine)."""
        from digenrl_verl.integrations.vllm_omni_cpu import load_omni_pipeline

        algorithm, _ = check_verl_omni_policy(spec)
        dtype = getattr(torch, spec.engine.dtype)
        handle = load_omni_pipeline(spec.model_path, pipeline_class(architecture_of(spec.model_path), algorithm),
                                    dtype=spec.engine.dtype)
        state = transformer_state(spec.model_path, transformer_layout(spec.model_path), dtype)
        engine = cls(handle, spec, state, spec.start_version)
        if spec.start_version:  # a resumed run's weights come from its checkpoint (`load_weights`), not the model
            engine.load_pipeline_weights()
        return engine

    # -- sampling -------------------------------------------------------------------------------------------------
    def requests(self, rows: RolloutRows) -> list[Any]:
        """One verl-omni request per row (prompt fields, the server's sampling split, the row's seed)."""
        from vllm_omni.diffusion.request import OmniDiffusionRequest
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        pipe, cfg = self.handle.pipe, self.spec
        guided = any((self.sampling.get(k) or 0) > 1 for k in _GUIDED)
        negative = cfg.pipeline.negative_prompt if guided else None
        out = []
        for prompt, uid, idx in zip(rows.prompts, rows.uids, rows.sample_indices):
            key = SampleKey(rows.step, str(uid), int(idx))
            fields = PROMPT_FIELDS[self.architecture](pipe, str(prompt), negative, cfg.pipeline.max_sequence_length)
            params = split_sampling({**self.sampling, "seed": sample_seed(cfg.rollout.seed, key, "sde"),
                                     "global_steps": rows.step, "num_outputs_per_prompt": 1},
                                    OmniDiffusionSamplingParams)
            out.append(OmniDiffusionRequest(prompt=fields, sampling_params=OmniDiffusionSamplingParams(**params),
                                            request_id=f"{key.step}-{key.uid}-{key.index}"))
        return out

    def _forward(self, requests: list[Any]) -> list[Any]:
        if getattr(type(self.handle.pipe), "supports_request_batch", False):
            return list(self.handle.forward(requests))
        return [o for r in requests for o in self.handle.forward([r])]

    def generate(self, rows: RolloutRows) -> Rollout:
        outputs = self._forward(self.requests(rows))
        schedule = torch.as_tensor(self.handle.pipe.scheduler.sigmas).detach().cpu().float()
        parts = [window_rows(o, schedule) for o in outputs]
        tensors = {k: torch.stack([getattr(p, k) for p in parts]) for k in WindowRows.__dataclass_fields__}
        tensors["rollout_log_probs"] = tensors.pop("log_probs")
        tensors["policy_version"] = torch.full((len(parts),), self.version, dtype=torch.int64)
        return Rollout(tensors, torch.stack([media_of(o) for o in outputs]))

    # -- weights --------------------------------------------------------------------------------------------------
    def load_pipeline_weights(self) -> None:
        """Hand `state` to the pipeline, as verl-omni's worker extension does on a full-weight update."""
        with torch.no_grad(), self.handle.context():
            self.handle.pipe.load_weights((f"{PIPELINE_PREFIX}{k}", v) for k, v in self.state.items())

    def join(self, spec: CollectiveSpec, generator_rank: int, epoch: int = 0) -> int:
        self.collectives = Collectives(spec, "generator", generator_rank, epoch)
        return self.collectives.global_rank

    def receive_weights(self, version: int) -> int:
        if self.collectives is None:
            raise RuntimeError("the verl_omni engine received weights before joining the process group")
        self.collectives.receive_weights(self.state)  # in the trainer's names and order, cast into the buffers
        self.load_pipeline_weights()
        self.version = version
        return version

    def load_weights(self, path: str, version: int) -> int:
        load_trainer_state(path, self.state, None)
        self.load_pipeline_weights()
        self.version = version
        return version

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.state.items()}

    def checksum(self) -> str:
        return state_checksum(self.state)
