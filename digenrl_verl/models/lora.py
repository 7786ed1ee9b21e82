"""LoRA (through peft) or full fine-tuning of a denoiser, and the trainable state used for weight sync.

The trainable state is a flat `{parameter name: tensor}` dict of exactly the parameters with
`requires_grad` (LoRA A/B matrices, or every transformer weight for full fine-tuning). Workers built from
the same model directory and `LoraConfig` have identical names, so a trainer can ship its state to
generators (`load_trainable_state`) and both sides can compare `state_checksum`s.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import torch
from torch import nn

from digenrl_verl.models.config import MODEL_KEY, LoraConfig

# Attention projections, shared by the architectures' default LoRA targets (`ModelSpec.lora_targets`): of one
# stream, and of the joint (MM-DiT) blocks, as Flow-GRPO / verl-omni recipes target them.
ATTENTION: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
JOINT_ATTENTION: tuple[str, ...] = ATTENTION + ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")

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
    so all workers start from the same weights. Call this before moving the model to an accelerator.
    """
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
