"""Model adapters over diffusers classes, tiny builders, and the architecture registry.

Public API (see each module): `load_adapter`, `register_adapter`, `get_adapter_class`, `list_architectures`,
`read_model_index` (registry); `PipelineConfig`, `LoraConfig` (config); `state_checksum`,
`DEFAULT_TARGET_MODULES` (lora); `build_tiny_model_dir`, `TINY_ARCHITECTURES` (tiny);
`Conditioning`, `DiffusionAdapter` (base). Importing this package does not import diffusers.
"""

from digenrl_verl.models.base import Conditioning, DiffusionAdapter
from digenrl_verl.models.config import LoraConfig, PipelineConfig
from digenrl_verl.models.lora import DEFAULT_TARGET_MODULES, state_checksum
from digenrl_verl.models.registry import (
    get_adapter_class,
    list_architectures,
    load_adapter,
    read_model_index,
    register_adapter,
)
from digenrl_verl.models.tiny import TINY_ARCHITECTURES, build_tiny_model_dir

__all__ = [
    "Conditioning",
    "DiffusionAdapter",
    "LoraConfig",
    "PipelineConfig",
    "DEFAULT_TARGET_MODULES",
    "state_checksum",
    "get_adapter_class",
    "list_architectures",
    "load_adapter",
    "read_model_index",
    "register_adapter",
    "TINY_ARCHITECTURES",
    "build_tiny_model_dir",
]
