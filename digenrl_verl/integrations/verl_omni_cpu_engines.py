"""verl-omni's own training engines on the host CPU: each engine verl-omni registers for ``cuda`` in verl's
`EngineRegistry` (its FSDP diffusion engines: PPO, DPO, NFT) is registered for the device ``cpu`` too.

verl-omni registers them for ``device=["cuda", "npu"]`` only, so on verl's CPU platform (``VERL_PLATFORM=cpu``,
`digenrl_verl.platform.cpu`) its stock `TrainingWorker` finds no engine (``No engine registered for device='cpu'``).
The engines themselves are device-neutral (they place tensors by verl's `get_device_name()`, which the CPU platform
answers ``cpu``); our TSP subclasses already run there (`integrations.verl_omni_tsp`). This reads verl's own table
(no copy of it): a key verl-omni registers later, or a ``cpu`` key somebody else took, is left alone. Runs where
verl-omni's engine package is imported (`integrations.verl_plugin.AFTER_IMPORT`), before any worker builds one."""

from __future__ import annotations

from verl.workers.engine.base import EngineRegistry

HOST_PACKAGE = "verl_omni."
SOURCE_DEVICE = "cuda"
DEVICE = "cpu"


def register_on_cpu() -> list[tuple[str, str, str]]:
    """Register every verl-omni engine of the ``cuda`` device (vendor-less key) for ``cpu`` where that key is free.
    Returns the (model_type, backend, class name) it registered."""
    added = []
    for model_type, backends in EngineRegistry._engines.items():
        for backend, keys in backends.items():
            engine_cls = keys.get(SOURCE_DEVICE)
            if engine_cls is None or DEVICE in keys or not engine_cls.__module__.startswith(HOST_PACKAGE):
                continue
            EngineRegistry.register(model_type=model_type, backend=backend, device=DEVICE)(engine_cls)
            added.append((model_type, backend, engine_cls.__name__))
    return added
