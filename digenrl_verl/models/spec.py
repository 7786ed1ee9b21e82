"""`ModelSpec`: everything about one diffusers architecture in one frozen record, registered once.

Each architecture module (`sd3`, `flux`, `qwen_image`, `wan`, `hunyuan_video`) defines its adapter and, next to
it, its spec: `SPEC = register_model(ModelSpec(adapter=FluxAdapter, lora_targets=..., tiny_builder=...,
tiny_sampling=...))`. The registry is keyed by the adapter's `architecture`, the `_class_name` of a diffusers
`model_index.json` ("FluxPipeline", ...), which is also what verl-omni's `actor_rollout_ref.model.architecture`
holds. Registering a name twice raises; a lookup miss lists the registered names. Another package adds a model
the same way: subclass `DiffusionAdapter` (or `PipelineAdapter`) and call `register_model` once.

Importing any module of `digenrl_verl.models` registers the built-in architectures (the package imports
`registry`, which imports the five architecture modules).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from digenrl_verl.models.base import DiffusionAdapter
from digenrl_verl.models.config import ARCHITECTURE_KEY, PipelineConfig

#: A tiny builder: size name → the pipeline's constructor arguments plus `pipeline_cls` (the diffusers class).
TinyBuilder = Callable[[str], dict[str, Any]]


@dataclass(frozen=True)
class ModelSpec:
    """One architecture: its adapter, default LoRA targets, and its tiny random model for tests.

    Args:
        adapter: the `DiffusionAdapter` subclass; its `architecture` (model_index.json `_class_name`) is the
            registry key and its `is_video` says whether samples are videos.
        lora_targets: module-name suffixes LoRA adapts when `actor_rollout_ref.model.target_modules` is null.
        tiny_builder: `builder(size)` → the pipeline components of a tiny random model (see `models.tiny`);
            None = no tiny model.
        tiny_sampling: `load_adapter(path, **tiny_sampling)` keywords (`PipelineConfig` fields) for a fast run
            of the tiny model; also valid keywords of the diffusers pipeline's `__call__`.
        tiny_sizes: the sizes `tiny_builder` accepts ("unit" is the smallest, used by the tests).
    """

    adapter: type[DiffusionAdapter]
    lora_targets: tuple[str, ...]
    tiny_builder: TinyBuilder | None = None
    tiny_sampling: Mapping[str, Any] = field(default_factory=dict)
    tiny_sizes: tuple[str, ...] = ("unit",)

    def __post_init__(self) -> None:
        if not (isinstance(self.adapter, type) and issubclass(self.adapter, DiffusionAdapter)):
            raise TypeError(f"ModelSpec.adapter must be a DiffusionAdapter subclass, got {self.adapter!r}")
        name = getattr(self.adapter, "architecture", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"ModelSpec.adapter {self.adapter.__qualname__} must set `architecture` to the "
                             "model_index.json `_class_name` it serves")
        targets = self.lora_targets
        if not isinstance(targets, tuple) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"ModelSpec({name}).lora_targets must be a non-empty tuple of module names, "
                             f"got {targets!r}")
        if self.tiny_builder is not None and not callable(self.tiny_builder):
            raise TypeError(f"ModelSpec({name}).tiny_builder must be callable or None, got {self.tiny_builder!r}")
        if self.tiny_builder is None and self.tiny_sampling:
            raise ValueError(f"ModelSpec({name}).tiny_sampling is set but there is no tiny_builder")
        PipelineConfig.from_dict(self.tiny_sampling)  # unknown keys and bad values raise, naming the key
        object.__setattr__(self, "tiny_sampling", types.MappingProxyType(dict(self.tiny_sampling)))
        sizes = self.tiny_sizes
        if not isinstance(sizes, tuple) or "unit" not in sizes or not all(isinstance(s, str) for s in sizes):
            raise ValueError(f"ModelSpec({name}).tiny_sizes must be a tuple of size names with 'unit', got {sizes!r}")

    @property
    def architecture(self) -> str:
        """The model_index.json `_class_name` (the adapter's `architecture`): the registry key."""
        return self.adapter.architecture

    @property
    def is_video(self) -> bool:
        return self.adapter.is_video


_SPECS: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> ModelSpec:
    """Register `spec` under its architecture and return it; a name that is already registered raises."""
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"register_model expects a ModelSpec, got {spec!r}")
    existing = _SPECS.get(spec.architecture)
    if existing is not None:
        raise ValueError(f"model architecture {spec.architecture!r} is already registered (adapter "
                         f"{existing.adapter.__module__}.{existing.adapter.__qualname__})")
    _SPECS[spec.architecture] = spec
    return spec


def list_architectures() -> list[str]:
    """The registered architectures (model_index.json `_class_name`s), sorted."""
    return sorted(_SPECS)


def get_model_spec(architecture: str) -> ModelSpec:
    """The spec registered under `architecture`; a miss raises ValueError listing the registered names."""
    try:
        return _SPECS[architecture]
    except KeyError:
        raise ValueError(
            f"{ARCHITECTURE_KEY} (model_index.json `_class_name`) = {architecture!r} has no adapter; "
            f"valid: {sorted(_SPECS)}"
        ) from None
