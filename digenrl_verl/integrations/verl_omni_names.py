"""The one mapping between the names of the trainers' transformer parameters and the rollout pipeline's.

The same diffusers parameter is named differently by whoever holds it: the package's trainers wrap the transformer
with PEFT (``base_model.model.<module>.lora_A.default.weight``), verl-omni's actor worker adds FSDP's
``_fsdp_wrapped_module.`` and its export the pipeline's ``transformer.``, and vLLM-Omni's rollout pipeline loads
weights under ``transformer.<diffusers name>`` (`load_weights`, `OmniTensorLoRARequest` tensors). `canonical_name`
is the diffusers name all of them share; `pipeline_name` is what the pipeline loads.
"""

from __future__ import annotations

#: the transformer's place in the pipeline's weight names (`load_weights` maps pipeline-level names)
PIPELINE_PREFIX = "transformer."
#: wrappers' prefixes, removed wherever they appear (FSDP wraps nested modules)
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "base_model.model.", PIPELINE_PREFIX)
#: PEFT's adapter name inside a LoRA parameter's name
ADAPTER_INFIX = ".default."


def canonical_name(name: str) -> str:
    """A transformer parameter's (or module's) diffusers name, as every side can match it: without FSDP / PEFT /
    pipeline prefixes and the adapter name (``<module>.lora_A.weight`` or ``<module>.weight``)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name.replace(ADAPTER_INFIX, ".")


def pipeline_name(name: str) -> str:
    """The name the rollout pipeline loads the parameter `name` (any side's spelling) under."""
    return PIPELINE_PREFIX + canonical_name(name)
