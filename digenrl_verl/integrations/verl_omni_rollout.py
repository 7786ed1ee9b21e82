"""Generators on verl-omni's rollout: the RL pipeline verl-omni registers for the model's architecture and algorithm
(`VllmOmniPipelineBase`, `verl_omni/pipelines/*/vllm_omni_rollout_adapter.py`), built by vLLM-Omni's own loader, as
a DigenRL `RolloutEngine` (rollout engine ``verl_omni``).

What runs is the code verl-omni's replicas run: vLLM-Omni's `DiffusersPipelineLoader` builds verl-omni's adapter
class (the call `re_init_pipeline` makes in the vLLM-Omni worker), real `OmniDiffusionRequest`s in a
`DiffusionRequestBatch` go through its `forward`, its `trajectory_*` outputs are the samples (verl-omni's window
SDE: per row one window of ``sde_window_size`` consecutive steps whose start is drawn in ``sde_window_range``), and
weights reach it through the pipeline's `load_weights`, which verl-omni's worker extension calls on every update
(`vLLMOmniColocateWorkerExtension.update_weights_from_ipc`, full weights). The trainers' weights arrive in a shadow
of their transformer (`shadow_transformer`: same LoRA wrapping, names, order and initial values); LoRA is merged
into the base weights for the pipeline (`pipeline_weights`, PEFT's own delta). On CPU the pipeline lives in the
generator's process (`integrations.vllm_omni_cpu`: vLLM-Omni has no CPU platform); the request / sampling split is
the server's (`vLLMOmniHttpServer._preprocess_input`: fields of `OmniDiffusionSamplingParams` first-class, the rest
in ``extra_args``). Each row's seed is the one verl-omni's trainer and agent loop give it (`rollout_row_seed`: the
step's base ``rollout.seed + global_steps - 1``, the row's position in the step batch), and ``global_steps`` is
verl-omni's count (from 1), so a row draws what verl-omni's replica draws for it, whichever worker samples it. Not
used here: the replica and server processes, the agent loop (prompts are tokenized with the pipeline's own
tokenizers, `PROMPT_FIELDS`), vLLM-Omni's LoRA manager (see `pipeline_weights`).

Limits, each refused by name when the `PolicySpec` is built (`engines.spec.check_verl_omni_policy`): a timestep
selection other than ``window`` (verl-omni samples SDE windows), an architecture outside `PROMPT_FIELDS`, a GPU
placement (there verl-omni's replicas are the path; not started by this version).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.engines.base import ENGINES, InPlaceWeights, Rollout, RolloutRows
from digenrl_verl.engines.spec import VERL_OMNI_ARCHITECTURES, VERL_OMNI_SDE_KINDS, PolicySpec
from digenrl_verl.integrations.verl_omni_names import pipeline_name
from digenrl_verl.models.registry import read_model_index
from digenrl_verl.models.pipeline_adapter import to_uint8

ENGINE_NAME = "verl_omni"
SIGMA_TOLERANCE = 1e-5


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
    the resolved policy; None values are left out (the pipeline's defaults). No ``sigmas``: verl-omni's rollout
    pipelines build their own schedule (with the resolution's shift), as on its GPUs; the trainer holds it to its
    training scheduler's (`verl_omni_batch.scheduler_timesteps`)."""
    p, r = spec.pipeline, spec.rollout
    window = r.sde_window_size or None  # verl-omni: None = the whole schedule
    values = {"height": p.height, "width": p.width, "num_frames": p.num_frames,
              "num_inference_steps": r.num_inference_steps, "guidance_scale": p.guidance_scale,
              "true_cfg_scale": p.true_cfg_scale, "max_sequence_length": p.max_sequence_length,
              "noise_level": float(r.noise_level), "sde_type": sde_type, "sde_window_size": window,
              "sde_window_range": list(r.sde_window_range) if r.sde_window_range is not None else None,
              "logprobs": True}
    return {k: v for k, v in values.items() if v is not None}


def rollout_row_seed(base_seed: int, step: int, sample_id: int) -> int:
    """The seed verl-omni's replica samples a training row with: its trainer sets the step's base seed
    ``rollout.seed + global_steps - 1`` (`RayFlowGRPOTrainer.fit`; global_steps counts from 1, so ``base_seed +
    step`` for the 0-based `step` here) and the row's global index (``_rollout_seed_global_idx``: its position in the
    step batch after the interleaved repeat, `sample_id` here); its agent loop derives the row's seed from both
    (`verl_omni.agent_loop.utils._derive_rollout_seed`, the same formula; the verl-omni tier holds them equal)."""
    return ((int(base_seed) + int(step)) * 1_000_003 + int(sample_id)) % ((1 << 63) - 1)


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
    # verl-omni's agent loop (`_tokenize_per_encoder`): per-encoder ids, unpadded, with special tokens, truncated at
    # the encoder's length (CLIP: the tokenizer's, T5: max_sequence_length); the pipeline pads each with its
    # tokenizer's pad token (`SD3TokenIdPromptMixin`), as its text path pads. The keys are verl-omni's
    # (`sd3_flow_grpo.common`: its script's `model.extra_tokenizers`, clip = `tokenizer`, t5 = `tokenizer_3`);
    # `prompt_token_ids`: the CLIP ids.
    def ids(t: str) -> dict[str, list[int]]:
        kw = {"add_special_tokens": True, "truncation": True}
        return {"clip": pipe.tokenizer(t, max_length=pipe.tokenizer.model_max_length, **kw)["input_ids"],
                "t5": pipe.tokenizer_3(t, max_length=max_len or 256, **kw)["input_ids"]}

    extra = ids(text)
    out = {"prompt_token_ids": extra["clip"], "extra_prompt_ids": extra}
    if negative is not None:
        out["negative_extra_prompt_ids"] = ids(negative)
    return out


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


def server_requests(pipe: Any, architecture: str, spec: PolicySpec, sampling: Mapping[str, Any],
                    rows: RolloutRows) -> list[dict[str, Any]]:
    """One request per row as verl-omni's rollout server takes it (`vLLMOmniHttpServer.generate`'s keyword
    arguments: ``request_id``, the prompt fields of `PROMPT_FIELDS[architecture]` tokenized with `pipe`'s
    tokenizer(s), ``sampling_params``: `sampling` (`sampling_dict`) with the row's seed, `rollout_row_seed`, and
    verl-omni's ``global_steps``, counted from 1)."""
    # guided: a scale above 1, or no guidance_scale (the pipeline's default: verl-omni's Wan2.2 adapter's is 5.0, and
    # it fails on the negative prompt's missing ids; an adapter whose default does not guide, SD3.5's 0.0, skips them)
    guided = any((sampling.get(k) or 0) > 1 for k in _GUIDED) or sampling.get("guidance_scale") is None
    negative = spec.pipeline.negative_prompt if guided else None
    out = []
    for prompt, uid, idx, sample_id in zip(rows.prompts, rows.uids, rows.sample_indices, rows.sample_ids):
        key = SampleKey(rows.step, str(uid), int(idx))
        fields = PROMPT_FIELDS[architecture](pipe, str(prompt), negative, spec.pipeline.max_sequence_length)
        params = {**sampling, "seed": rollout_row_seed(spec.rollout.seed, rows.step, sample_id),
                  "global_steps": rows.step + 1, "num_outputs_per_prompt": 1}
        out.append({"request_id": f"{key.step}-{key.uid}-{key.index}", "prompt": fields, "sampling_params": params})
    return out


def window_rows(output: Any, schedule: torch.Tensor) -> dict[str, torch.Tensor]:
    """One `DiffusionOutput`'s trajectory (``trajectory_latents`` [1, W+1, *L], ``trajectory_log_probs`` [1, W],
    ``trajectory_timesteps`` [1, W] = σ·1000) as the package's `Rollout` rows (`trajectory_rows`)."""
    first = [torch.as_tensor(v)[0] for v in (output.trajectory_latents, output.trajectory_log_probs,
                                             output.trajectory_timesteps)]
    return trajectory_rows(*first, schedule)


def trajectory_rows(latents: Any, log_probs: Any, timesteps: Any, schedule: torch.Tensor) -> dict[str, torch.Tensor]:
    """One sample's window (latents [W+1, *L], log-probs [W], timesteps [W] = σ·1000: what verl-omni's pipeline
    returns, and its server unbatched in ``extra_fields``) as the package's `Rollout` rows (its tensor keys);
    `schedule`: the pipeline scheduler's σ_0..σ_N. The window's steps are found in the schedule (RuntimeError when
    they are not consecutive steps)."""
    lat = torch.as_tensor(latents).float()
    sig = torch.as_tensor(timesteps).float().reshape(-1) / 1000.0
    gap = (schedule[:-1, None] - sig[None, :]).abs()
    idx = gap.argmin(dim=0)
    if float(gap.min(dim=0).values.max()) > SIGMA_TOLERANCE or (idx.numel() > 1 and not bool((idx.diff() == 1).all())):
        raise RuntimeError(f"verl-omni's rollout returned σ {sig.tolist()} that are not consecutive steps of its "
                           f"schedule {schedule.tolist()}")
    return {"latents": lat[:-1], "next_latents": lat[1:], "sigmas": schedule[idx], "next_sigmas": schedule[idx + 1],
            "rollout_log_probs": torch.as_tensor(log_probs).float().reshape(-1), "step_index": idx.to(torch.int64)}


def stack_rollout(parts: list[dict[str, torch.Tensor]], media: list[torch.Tensor], version: int) -> Rollout:
    """The `Rollout` of per-sample rows (`trajectory_rows`) and decoded samples, all sampled at `version`."""
    tensors = {k: torch.stack([p[k] for p in parts]) for k in parts[0]}
    tensors["policy_version"] = torch.full((len(parts),), int(version), dtype=torch.int64)
    return Rollout(tensors, torch.stack(media))


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


def shadow_transformer(spec: PolicySpec) -> torch.nn.Module:
    """The diffusers transformer wrapped as the trainers wrap theirs (`models.lora.apply_lora`: LoRA, or every weight
    but the adapter's `unused_modules` trainable): its trainable parameters have the trainers' names, order and
    initial values, so trainer rank 0's weights are received straight into them. One copy of the transformer in the
    engine's dtype beside the pipeline's own."""
    import diffusers

    from digenrl_verl.models.lora import apply_lora
    from digenrl_verl.models.registry import get_adapter_class
    from digenrl_verl.models.spec import get_model_spec

    architecture = read_model_index(spec.model_path)["_class_name"]
    folder = Path(spec.model_path) / "transformer"
    cls = getattr(diffusers, json.loads((folder / "config.json").read_text())["_class_name"])
    model = cls.from_pretrained(str(folder), torch_dtype=getattr(torch, spec.engine.dtype)).requires_grad_(False)
    return apply_lora(model, spec.lora, architecture, get_model_spec(architecture).lora_targets,
                      get_adapter_class(architecture).unused_modules(model))


def pipeline_weights(shadow: torch.nn.Module, lora: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """What the pipeline's `load_weights` gets after an update, diffusers names under `transformer.`: the trainable
    weights (full fine-tune), or each LoRA-wrapped layer's base weight with PEFT's own delta merged in (LoRA; as
    verl's rollout sync with merged LoRA: vLLM-Omni 0.27's LoRA manager skips layers it names differently, e.g.
    Qwen-Image's `attn.to_out.0`, so unmerged adapters would sample partly base weights)."""
    if not lora:
        for name, p in shadow.named_parameters():
            if p.requires_grad:
                yield pipeline_name(name), p.detach()
        return
    from peft.tuners.lora import LoraLayer

    for name, module in shadow.named_modules():
        if isinstance(module, LoraLayer) and module.active_adapters:
            weight = module.base_layer.weight.detach()
            for adapter in module.active_adapters:
                weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
            yield pipeline_name(f"{name}.weight"), weight


@ENGINES.register(ENGINE_NAME)
class VerlOmniRolloutEngine(InPlaceWeights):
    """Samples with verl-omni's registered rollout pipeline, loaded in this process by vLLM-Omni's loader.

    Args:
        handle: the loaded pipeline (`integrations.vllm_omni_cpu.OmniPipelineHandle`).
        spec: the policy (model, pipeline and rollout settings, the engine's dtype), checked when it was built
            (`engines.spec.check_verl_omni_policy`).
        shadow: the trainers' transformer as `shadow_transformer` builds it; its trainable parameters (`state`) are
            what `trainable_state` reports and what arriving weights land in before the pipeline's `load_weights`.
        version: the policy version of those weights.
    """

    def __init__(self, handle: Any, spec: PolicySpec, shadow: torch.nn.Module, version: int = 0) -> None:
        self.handle = handle
        self.spec = spec
        self.shadow = shadow
        self.state = {n: p for n, p in shadow.named_parameters() if p.requires_grad}  # live: received in place
        self.version = int(version)
        self.architecture = read_model_index(spec.model_path)["_class_name"]  # one of PROMPT_FIELDS (PolicySpec)
        self.sampling = sampling_dict(spec, VERL_OMNI_SDE_KINDS[spec.rollout.sde_type][1])
        self.load_pipeline_weights()  # the pipeline holds exactly the shadow's weights from the start

    @classmethod
    def from_policy(cls, spec: PolicySpec) -> "VerlOmniRolloutEngine":
        """verl-omni's pipeline for the policy's model and algorithm, at `spec.start_version`, in the rollout's
        dtype. CPU only for now (`check_verl_omni_policy`: on CUDA verl-omni's rollout replicas are the path, not
        started by this engine)."""
        from digenrl_verl.integrations.vllm_omni_cpu import load_omni_pipeline

        algorithm = VERL_OMNI_SDE_KINDS[spec.rollout.sde_type][0]  # the spec was checked when it was built
        architecture = read_model_index(spec.model_path)["_class_name"]
        handle = load_omni_pipeline(spec.model_path, pipeline_class(architecture, algorithm), dtype=spec.engine.dtype)
        return cls(handle, spec, shadow_transformer(spec), spec.start_version)

    # -- sampling -------------------------------------------------------------------------------------------------
    def server_requests(self, rows: RolloutRows) -> list[dict[str, Any]]:
        """One request per row as verl-omni's rollout server takes it (`server_requests`); what `requests` builds
        in-process and what a replica is sent."""
        return server_requests(self.handle.pipe, self.architecture, self.spec, self.sampling, rows)

    def requests(self, rows: RolloutRows) -> list[Any]:
        """One verl-omni request per row (prompt fields, the server's sampling split, the row's seed)."""
        from vllm_omni.diffusion.request import OmniDiffusionRequest
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        return [OmniDiffusionRequest(prompt=r["prompt"], request_id=r["request_id"], sampling_params=
                                     OmniDiffusionSamplingParams(**split_sampling(r["sampling_params"],
                                                                                  OmniDiffusionSamplingParams)))
                for r in self.server_requests(rows)]

    def _forward(self, requests: list[Any]) -> list[Any]:
        if getattr(type(self.handle.pipe), "supports_request_batch", False):
            return list(self.handle.forward(requests))
        return [o for r in requests for o in self.handle.forward([r])]

    def generate(self, rows: RolloutRows) -> Rollout:
        outputs = self._forward(self.requests(rows))
        schedule = torch.as_tensor(self.handle.pipe.scheduler.sigmas).detach().cpu().float()
        return stack_rollout([window_rows(o, schedule) for o in outputs], [media_of(o) for o in outputs],
                             self.version)

    # -- weights (`InPlaceWeights`: broadcast and checkpoints land in the shadow, then reach the pipeline) -------
    def trainable(self) -> dict[str, torch.Tensor]:
        return self.state

    def weights_received(self) -> None:
        self.load_pipeline_weights()

    def load_pipeline_weights(self) -> None:
        """Hand the shadow's weights to the pipeline, as verl-omni's worker extension does on a full-weight update."""
        with torch.no_grad(), self.handle.context():
            self.handle.pipe.load_weights(pipeline_weights(self.shadow, self.spec.lora.enabled))
