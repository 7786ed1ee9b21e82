"""LoRA (through peft) or full fine-tuning of a denoiser, and the trainable state used for weight sync.

The trainable state is a flat `{parameter name: tensor}` dict of exactly the parameters with
`requires_grad` (LoRA A/B matrices, or every transformer weight for full fine-tuning). Workers built from
the same model directory and `LoraConfig` have identical names, so a trainer can ship its state to
generators (`load_trainable_state`) and both sides can compare `state_checksum`s.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from digenrl_verl.models.config import MODEL_KEY, LoraConfig

ADAPTER_KEY = f"{MODEL_KEY}.lora_adapter_path"
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
DIFFUSERS_PREFIX = "transformer."  # diffusers' load_lora_adapter keeps the keys under its prefix="transformer"

# Attention projections, shared by the architectures' default LoRA targets (`ModelSpec.lora_targets`): of one
# stream, and of the joint (MM-DiT) blocks, as Flow-GRPO / verl-omni recipes target them.
ATTENTION: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
JOINT_ATTENTION: tuple[str, ...] = ATTENTION + ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")

@dataclass(frozen=True)
class AdapterLoraConfig(LoraConfig):
    """LoRA that starts from a pre-trained adapter (`model.lora_adapter_path`): rank, alpha and targets are the
    adapter's (`read_lora_adapter`), its weights replace the seeded init on every worker that builds the model."""

    adapter_path: str | None = None


@dataclass(frozen=True)
class LoraAdapter:
    """A pre-trained LoRA adapter: its peft LoraConfig kwargs and weights keyed `<module>.lora_A.weight` (the names
    peft's `set_peft_model_state_dict` takes, under `base_model.model.`)."""

    path: str
    kind: str  # "peft" (adapter_config.json + adapter_model.safetensors) or "diffusers" (a LoRA .safetensors file)
    config: dict[str, Any]
    state: dict[str, torch.Tensor]

    @property
    def summary(self) -> str:
        c = self.config
        extra = " (per-module ranks: rank_pattern)" if c.get("rank_pattern") else ""
        return f"r={c['r']}, lora_alpha={c['lora_alpha']}, target_modules={sorted(c['target_modules'])}{extra}"


_PEFT_FIELDS = ("r", "lora_alpha", "target_modules", "rank_pattern", "alpha_pattern", "use_rslora", "use_dora",
                "bias", "exclude_modules")


def _diffusers_file(path: str) -> str:
    if os.path.isfile(path):
        return path
    found = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if "pytorch_lora_weights.safetensors" in found:
        return os.path.join(path, "pytorch_lora_weights.safetensors")
    if len(found) != 1:
        raise ValueError(f"{ADAPTER_KEY}={path!r} holds no {PEFT_CONFIG} and {len(found)} .safetensors files "
                         f"({found}): give a peft adapter directory ({PEFT_CONFIG} + {PEFT_WEIGHTS}) or one diffusers "
                         "LoRA file (pytorch_lora_weights.safetensors, keys under 'transformer.')")
    return os.path.join(path, found[0])


def _diffusers_config(path: str, state: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> dict:
    """diffusers' `_create_lora_config`: the saved `lora_adapter_metadata` (its keys under the prefix), else the
    rank from the lora_B shapes, alpha = rank, and the adapted modules from the keys."""
    raw = json.loads(metadata.get("lora_adapter_metadata", "{}") or "{}")
    meta = {k[len(DIFFUSERS_PREFIX):]: v for k, v in raw.items() if k.startswith(DIFFUSERS_PREFIX)} or raw
    if meta.get("r"):
        return {k: meta[k] for k in _PEFT_FIELDS if k in meta}
    ranks = {k.rsplit(".lora_B", 1)[0]: v.shape[1] for k, v in state.items() if ".lora_B" in k and v.ndim > 1}
    if len(set(ranks.values())) != 1:
        raise ValueError(f"{ADAPTER_KEY}={path!r}: the LoRA ranks differ per module ({sorted(set(ranks.values()))}) "
                         "and the file has no lora_adapter_metadata; save it with diffusers' save_lora_weights")
    r = next(iter(ranks.values()))
    return {"r": r, "lora_alpha": r, "target_modules": sorted(ranks)}


def read_lora_adapter(path: str) -> LoraAdapter:
    """Read a pre-trained LoRA: a peft adapter directory (`adapter_config.json` + `adapter_model.safetensors`, as
    peft's `save_pretrained` writes it and verl-omni's non-diffusers models load it) or a diffusers LoRA file (keys
    `transformer.<module>.lora_A.weight`, as `save_lora_weights` writes it and verl-omni's diffusers engine loads it
    with `load_lora_adapter`). ValueError naming `model.lora_adapter_path` and the fix when it is neither."""
    from safetensors import safe_open

    if not os.path.exists(path):
        raise ValueError(f"{ADAPTER_KEY}={path!r} does not exist: give a local peft adapter directory ({PEFT_CONFIG} "
                         f"+ {PEFT_WEIGHTS}) or a diffusers LoRA .safetensors file, or set it to null (LoRA starts "
                         "from its seeded init)")
    peft_dir = os.path.isdir(path) and os.path.isfile(os.path.join(path, PEFT_CONFIG))
    file = os.path.join(path, PEFT_WEIGHTS) if peft_dir else _diffusers_file(path)
    if not os.path.isfile(file):
        raise ValueError(f"{ADAPTER_KEY}={path!r} has {PEFT_CONFIG} but no {PEFT_WEIGHTS}: save the adapter with "
                         "peft's save_pretrained (safe_serialization=True)")
    if peft_dir:  # peft's own readers, as a PeftModel.from_pretrained would read it
        from peft import PeftConfig
        from peft.utils import load_peft_weights

        cfg = PeftConfig.from_pretrained(path)
        if cfg.peft_type != "LORA":
            raise ValueError(f"{ADAPTER_KEY}={path!r} is a {cfg.peft_type} adapter; only LoRA is supported")
        state = {k.removeprefix("base_model.model."): v for k, v in load_peft_weights(path, device="cpu").items()}
        config = {k: getattr(cfg, k) for k in _PEFT_FIELDS if getattr(cfg, k, None) is not None}
        return LoraAdapter(path, "peft", config, state)
    with safe_open(file, "pt") as f:
        state, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    state = {k[len(DIFFUSERS_PREFIX):]: v for k, v in state.items() if k.startswith(DIFFUSERS_PREFIX)}
    if not any(".lora_A" in k for k in state):
        raise ValueError(f"{ADAPTER_KEY}={path!r}: {file} has no LoRA key under {DIFFUSERS_PREFIX!r} (verl-omni's "
                         "diffusers engine loads none without it); save the transformer's LoRA with the pipeline's "
                         "save_lora_weights, or give a peft adapter directory")
    return LoraAdapter(path, "diffusers", _diffusers_config(path, state, metadata), state)


def _load_adapter_weights(model: nn.Module, adapter: LoraAdapter, skipped: tuple[str, ...]) -> None:
    """Copy the adapter's weights into `model`'s "default" adapter; every trainable LoRA weight must be given."""
    from peft import set_peft_model_state_dict

    keep = {k: v for k, v in adapter.state.items() if not any(k.startswith(m + ".") for m in skipped)}
    result = set_peft_model_state_dict(model, {f"base_model.model.{k}": v for k, v in keep.items()})
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    given = {f"base_model.model.{k}".replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.")
             for k in keep}
    missing = sorted(n for n, _ in named_trainable_parameters(model) if n not in given)
    if unexpected or missing:
        raise ValueError(f"{ADAPTER_KEY}={adapter.path!r} does not fit this transformer: unexpected "
                         f"{unexpected[:3]}, missing {missing[:3]}")


def _adapter_model(transformer: nn.Module, lora: AdapterLoraConfig, architecture: str,
                   unused_modules: tuple[str, ...]) -> nn.Module:
    """The peft model of the adapter at `lora.adapter_path`, its config and weights (no seeded init)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    adapter = read_lora_adapter(lora.adapter_path)
    kwargs = dict(adapter.config)
    if unused_modules:  # never trainable (no gradient would reach them); they do not change the output
        kwargs["exclude_modules"] = [*(kwargs.get("exclude_modules") or ()), *unused_modules]
    try:
        model = get_peft_model(transformer, PeftLoraConfig(**kwargs, lora_dropout=0.0))
    except ValueError as err:
        raise ValueError(f"{ADAPTER_KEY}={lora.adapter_path!r} does not match the {architecture} transformer: "
                         f"{err}") from err
    _load_adapter_weights(model, adapter, unused_modules)
    return model


def apply_lora(
    transformer: nn.Module,
    lora: LoraConfig,
    architecture: str,
    default_targets: tuple[str, ...],
    unused_modules: tuple[str, ...] = (),
) -> nn.Module:
    """Wrap `transformer` in a peft LoRA model (only adapter weights trainable), or, for rank 0, make every
    transformer weight trainable and return it unchanged.

    `default_targets` (the architecture's `ModelSpec.lora_targets`) apply when `lora.target_modules` is None;
    `architecture` only names the model in errors.

    `unused_modules` (full module names) do not influence the denoiser's output (e.g. the text-stream output
    layers of Qwen-Image's last block); they are never made trainable, so that every trainable parameter
    receives a gradient (flat-buffer gradient all-reduce relies on it).

    The adapter is initialised under `torch.manual_seed(lora.seed)` with the global RNG restored afterwards,
    so all workers start from the same weights; an `AdapterLoraConfig` with an `adapter_path` takes the pre-trained
    adapter's config and weights instead (`read_lora_adapter`). Call this before moving the model to an accelerator.
    """
    if getattr(lora, "adapter_path", None):
        return _adapter_model(transformer, lora, architecture, unused_modules)
    if not lora.enabled:
        transformer.requires_grad_(True)
        for name in unused_modules:
            transformer.get_submodule(name).requires_grad_(False)
        return transformer
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = lora.target_modules if lora.target_modules is not None else default_targets
    peft_config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        init_lora_weights=True if lora.init_weights == "default" else "gaussian",
        target_modules=targets if isinstance(targets, str) else list(targets),
        exclude_modules=[*(lora.exclude_modules or ()), *unused_modules] or None,
        lora_dropout=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(lora.seed)
        try:
            model = get_peft_model(transformer, peft_config)
        except ValueError as err:  # peft: "Target modules {...} not found in the base model"
            raise ValueError(
                f"{MODEL_KEY}.target_modules={targets!r} does not match the {architecture} transformer: {err}"
            ) from err
    return model


def named_trainable_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def trainable_state(module: nn.Module, device: torch.device | str | None = "cpu") -> dict[str, torch.Tensor]:
    """Detached copies of the trainable parameters, `{name: tensor}` (on `device`; None keeps the device)."""
    out = {}
    for name, p in named_trainable_parameters(module):
        t = p.detach()
        out[name] = t.to(device, copy=True) if device is not None else t.clone()
    return out


@torch.no_grad()
def load_trainable_state(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` into the trainable parameters in place (names and shapes must match exactly)."""
    params = dict(named_trainable_parameters(module))
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if missing or unexpected:
        raise ValueError(
            "trainable state does not match this model (built with another LoRA config or architecture?): "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    for name, p in params.items():
        src = state[name]
        if src.shape != p.shape:
            raise ValueError(f"trainable state {name!r} has shape {tuple(src.shape)}, the model {tuple(p.shape)}")
        p.copy_(src.to(device=p.device, dtype=p.dtype))


def state_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over sorted names, dtypes, shapes and raw bytes: equal iff the states are bit-identical."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
