"""Model adapters over diffusers classes, one `ModelSpec` per architecture, and tiny builders.

Public API (see each module): `ModelSpec`, `register_model`, `get_model_spec`, `list_architectures` (spec);
`load_adapter`, `get_adapter_class`, `read_model_index` (registry); `PipelineConfig`, `LoraConfig` (config);
`state_checksum` (lora); `build_tiny_model_dir`, `tiny_architectures` (tiny); `Conditioning`,
`DiffusionAdapter` (base). Importing this package registers the five built-in architectures and does not
import diffusers.
"""

from digenrl_verl.models.base import Conditioning, DiffusionAdapter
from digenrl_verl.models.config import LoraConfig, PipelineConfig
from digenrl_verl.models.lora import state_checksum
from digenrl_verl.models.registry import get_adapter_class, load_adapter, read_model_index
from digenrl_verl.models.spec import ModelSpec, get_model_spec, list_architectures, register_model

__all__ = [
    "Conditioning",
    "DiffusionAdapter",
    "LoraConfig",
    "PipelineConfig",
    "state_checksum",
    "ModelSpec",
    "register_model",
    "get_model_spec",
    "list_architectures",
    "get_adapter_class",
    "load_adapter",
    "read_model_index",
    "tiny_architectures",
    "build_tiny_model_dir",
]


def __getattr__(name: str):
    """`build_tiny_model_dir` / `tiny_architectures`, imported on first use: `python -m digenrl_verl.models.tiny` then
    runs a module this package has not imported yet (runpy warns otherwise)."""
    if name in ("build_tiny_model_dir", "tiny_architectures"):
        from digenrl_verl.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
