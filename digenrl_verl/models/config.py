"""Small validated configs for the model adapters.

`PipelineConfig` mirrors verl-omni's `actor_rollout_ref.rollout.pipeline.*` and `LoraConfig` its
`actor_rollout_ref.model.lora_*` / `target_modules` keys, so a Hydra config section maps onto them 1:1
(`from_dict`). `None` always means "what the diffusers pipeline of that architecture uses by default".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

PIPELINE_KEY = "actor_rollout_ref.rollout.pipeline"
MODEL_KEY = "actor_rollout_ref.model"
ARCHITECTURE_KEY = f"{MODEL_KEY}.architecture"
PATH_KEY = f"{MODEL_KEY}.path"


def _check_keys(cls: type, data: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    valid = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in valid:
            raise ValueError(f"unknown key {prefix}.{key}={value!r}; valid keys: {sorted(valid)}")
    return dict(data)


@dataclass(frozen=True)
class PipelineConfig:
    """Sampling settings of one architecture's pipeline (verl-omni `rollout.pipeline.*`).

    Args:
        height, width: image/video size in pixels; None = the pipeline's default size.
        num_frames: video frames (Wan/HunyuanVideo; must be 1 + k·temporal_compression); images accept None or 1.
        num_inference_steps: default number of sampling steps (None = pipeline default).
        guidance_scale: CFG scale (SD3, Wan: batched uncond+cond when > 1) or embedded guidance
            (FLUX, HunyuanVideo). None = pipeline default.
        true_cfg_scale: true CFG with two forwards (Qwen-Image; optional for FLUX/HunyuanVideo) when > 1.
            None = pipeline default.
        max_sequence_length: text tokens the denoiser sees (prompt padded/truncated to this); None = default.
        negative_prompt: the unconditional prompt for CFG / true CFG.
        host_sigmas: the sampling schedules σ_0..σ_N the host's trainer uses, as (N, schedule) pairs: set by the
            verl-omni path (its training adapter's scheduler, `integrations.verl_omni.host_sigma_schedules`), not a
            `rollout.pipeline` key; a step count not listed takes the model's own scheduler.
    """

    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    true_cfg_scale: float | None = None
    max_sequence_length: int | None = None
    negative_prompt: str = ""
    host_sigmas: tuple[tuple[int, tuple[float, ...]], ...] = ()

    def __post_init__(self) -> None:
        for name in ("height", "width", "num_frames", "num_inference_steps", "max_sequence_length"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{PIPELINE_KEY}.{name} must be a positive integer or null, got {value!r}")
        for name in ("guidance_scale", "true_cfg_scale"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"{PIPELINE_KEY}.{name} must be a number >= 0 or null, got {value!r}")
        if not isinstance(self.negative_prompt, str):
            raise ValueError(f"{PIPELINE_KEY}.negative_prompt must be a string, got {self.negative_prompt!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PipelineConfig":
        """Build from a `rollout.pipeline` mapping; unknown keys raise ValueError naming the valid ones."""
        values = _check_keys(cls, data, PIPELINE_KEY)
        if "host_sigmas" in values:  # a copy's fields (asdict) come back as tuples of lists
            values["host_sigmas"] = tuple((int(n), tuple(float(x) for x in s)) for n, s in values["host_sigmas"])
        return cls(**values)


LORA_INITS = ("gaussian", "default")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA on the denoiser, or full fine-tuning (verl-omni `model.lora_rank=0`).

    Args:
        rank: LoRA rank; 0 = full fine-tune (every transformer parameter trainable).
        alpha: LoRA alpha (scale alpha / rank).
        init_weights: "gaussian" (A ~ N(0, 1/r), B = 0) or "default" (Kaiming-uniform A, B = 0);
            both leave the model's output unchanged at init.
        target_modules: module-name suffixes to adapt (e.g. "to_q", "to_out.0"), "all-linear", or None
            for the architecture's default list.
        exclude_modules: module-name suffixes never adapted.
        seed: LoRA A matrices are drawn under this seed, so every worker starts from the same adapter.
    """

    rank: int = 0
    alpha: float = 64.0
    init_weights: str = "gaussian"
    target_modules: tuple[str, ...] | str | None = None
    exclude_modules: tuple[str, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"{MODEL_KEY}.lora_rank must be an integer >= 0 (0 = full fine-tune), got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha <= 0:
            raise ValueError(f"{MODEL_KEY}.lora_alpha must be a number > 0, got {self.alpha!r}")
        if self.init_weights not in LORA_INITS:
            raise ValueError(
                f"{MODEL_KEY}.lora_init_weights={self.init_weights!r} is not supported; valid: {list(LORA_INITS)}"
            )
        targets = self.target_modules
        if isinstance(targets, str):
            if targets != "all-linear":
                object.__setattr__(self, "target_modules", (targets,))
        elif targets is not None:
            targets = tuple(targets)
            if not targets or not all(isinstance(t, str) and t for t in targets):
                raise ValueError(
                    f"{MODEL_KEY}.target_modules must be null, 'all-linear' or a non-empty list of module names, "
                    f"got {self.target_modules!r}"
                )
            object.__setattr__(self, "target_modules", targets)
        if self.exclude_modules is not None:
            object.__setattr__(self, "exclude_modules", tuple(self.exclude_modules))

    @property
    def enabled(self) -> bool:
        """True for LoRA, False for full fine-tuning."""
        return self.rank > 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LoraConfig":
        """Build from verl-omni `actor_rollout_ref.model` keys (lora_rank, lora_alpha, lora_init_weights,
        target_modules, exclude_modules); other model keys are ignored."""
        renames = {"lora_rank": "rank", "lora_alpha": "alpha", "lora_init_weights": "init_weights",
                   "target_modules": "target_modules", "exclude_modules": "exclude_modules", "lora_seed": "seed"}
        picked = {k: v for k, v in data.items() if k in renames and v is not None}
        return cls(**{renames[k]: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in picked.items()})
