"""Architecture lookups and `load_adapter`: a diffusers model directory → a `DiffusionAdapter`.

The registry itself is `digenrl_verl.models.spec` (one `ModelSpec` per architecture, keyed by the
model_index.json `_class_name`); this module imports the five built-in architecture modules, whose specs register
on import, and keeps the lookups callers use (`get_adapter_class`, `read_model_index`, `load_adapter`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# Each architecture module registers its ModelSpec when imported.
from digenrl_verl.models import flux, hunyuan_video, qwen_image, sd3, wan  # noqa: F401
from digenrl_verl.models.base import DiffusionAdapter
from digenrl_verl.models.config import ARCHITECTURE_KEY, PATH_KEY, LoraConfig, PipelineConfig
from digenrl_verl.models.spec import ModelSpec, get_model_spec, list_architectures, register_model

__all__ = [
    "ARCHITECTURE_KEY",
    "PATH_KEY",
    "ModelSpec",
    "get_adapter_class",
    "get_model_spec",
    "list_architectures",
    "load_adapter",
    "read_model_index",
    "register_model",
]


def get_adapter_class(architecture: str) -> type[DiffusionAdapter]:
    """The adapter class of a registered architecture (a miss lists the valid names)."""
    return get_model_spec(architecture).adapter


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
