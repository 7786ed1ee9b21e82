"""Architecture registry and `load_adapter`: a diffusers model directory → a `DiffusionAdapter`.

Adapters are keyed by the `_class_name` of a diffusers `model_index.json` ("FluxPipeline", ...), which is
also what verl-omni's `actor_rollout_ref.model.architecture` holds. Built-in adapters register on first use
of the registry; another package can add one with `@register_adapter("MyPipeline")`.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

from digenrl_verl.models.base import DiffusionAdapter
from digenrl_verl.models.config import MODEL_KEY, LoraConfig, PipelineConfig

ARCHITECTURE_KEY = f"{MODEL_KEY}.architecture"
PATH_KEY = f"{MODEL_KEY}.path"

_BUILTIN_MODULES = (
    "digenrl_verl.models.sd3",
    "digenrl_verl.models.flux",
    "digenrl_verl.models.qwen_image",
    "digenrl_verl.models.wan",
    "digenrl_verl.models.hunyuan_video",
)
_REGISTRY: dict[str, type[DiffusionAdapter]] = {}
_builtins_loaded = False

A = TypeVar("A", bound=type[DiffusionAdapter])


def register_adapter(architecture: str) -> Callable[[A], A]:
    """Class decorator: register an adapter under a model_index.json `_class_name`; duplicates are rejected."""

    def wrap(cls: A) -> A:
        existing = _REGISTRY.get(architecture)
        if existing is not None and existing is not cls:
            raise ValueError(
                f"adapter architecture {architecture!r} is already registered to "
                f"{existing.__module__}.{existing.__qualname__}"
            )
        cls.architecture = architecture
        _REGISTRY[architecture] = cls
        return cls

    return wrap


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)
        _builtins_loaded = True


def list_architectures() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_adapter_class(architecture: str) -> type[DiffusionAdapter]:
    _load_builtins()
    try:
        return _REGISTRY[architecture]
    except KeyError:
        raise ValueError(
            f"{ARCHITECTURE_KEY} (model_index.json `_class_name`) = {architecture!r} has no adapter; "
            f"valid: {sorted(_REGISTRY)}"
        ) from None


def read_model_index(path: str | Path) -> dict[str, Any]:
    """The parsed model_index.json of a local diffusers model directory (ValueError if it is not one)."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{PATH_KEY}={str(path)!r} is not a directory; expected a local diffusers model "
                         "directory with model_index.json (build a tiny one: python -m digenrl_verl.models.tiny)")
    index_file = root / "model_index.json"
    if not index_file.is_file():
        raise ValueError(f"{PATH_KEY}={str(path)!r} is not a diffusers model directory: model_index.json is missing")
    try:
        index = json.loads(index_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{PATH_KEY}={str(path)!r}: model_index.json is not valid JSON ({err})") from err
    if not isinstance(index, dict) or "_class_name" not in index:
        raise ValueError(f"{PATH_KEY}={str(path)!r}: model_index.json has no `_class_name`")
    missing = [
        name for name, spec in index.items()
        if not name.startswith("_") and isinstance(spec, list) and spec[0] is not None and not (root / name).is_dir()
    ]
    if missing:
        raise ValueError(f"{PATH_KEY}={str(path)!r}: model_index.json lists components without a folder: {missing}")
    return index


def load_adapter(
    path: str | Path,
    *,
    lora: LoraConfig | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    architecture: str | None = None,
    pipeline: PipelineConfig | None = None,
    keep_reference: bool = True,
    gradient_checkpointing: bool = False,
    **pipeline_kwargs: Any,
) -> DiffusionAdapter:
    """Load a local diffusers model directory through the pipeline's real `from_pretrained` and wrap it.

    Args:
        path: directory with model_index.json (`actor_rollout_ref.model.path`). Nothing is downloaded.
        lora: LoRA settings; None or rank 0 = full fine-tune of the transformer.
        dtype: dtype of every component (the SDE math stays fp32 regardless).
        device: where the components live.
        architecture: expected `_class_name` (`actor_rollout_ref.model.architecture`); None = read it.
        pipeline: sampling settings; alternatively pass its fields as keyword arguments
            (height=..., guidance_scale=..., see `PipelineConfig`).
        keep_reference: full fine-tune only: keep a frozen copy of the initial transformer for `reference()`.
            Generators that never compute a KL term can pass False to save memory.
        gradient_checkpointing: enable the diffusers transformer's gradient checkpointing.
    """
    index = read_model_index(path)
    class_name = index["_class_name"]
    if architecture is not None and architecture != class_name:
        raise ValueError(f"{ARCHITECTURE_KEY}={architecture!r} but {path}/model_index.json names {class_name!r}")
    adapter_cls = get_adapter_class(class_name)
    if pipeline is not None and pipeline_kwargs:
        raise ValueError("load_adapter: pass either pipeline=PipelineConfig(...) or its fields as keywords, not both")
    config = pipeline if pipeline is not None else PipelineConfig.from_dict(pipeline_kwargs)
    import diffusers

    pipeline_cls = getattr(diffusers, class_name)
    pipe = pipeline_cls.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    return adapter_cls(  # type: ignore[call-arg]
        pipe, config=config, lora=lora, keep_reference=keep_reference, device=device,
        gradient_checkpointing=gradient_checkpointing,
    )
