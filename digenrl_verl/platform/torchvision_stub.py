"""Empty `torchvision` modules for a CPU process where torchvision is not installed (its PyPI wheels are CUDA builds
that do not load beside the CPU torch; the project's CPU venvs uninstall them).

`vllm_omni.diffusion.models.wan2_2/__init__` imports its image- and speech-to-video pipelines, which import
torchvision at module level; text-to-video never calls into it. `digenrl_verl.platform.vllm_plugins.cpu_worker_plugin`
puts the stand-ins into each diffusion worker process on CPU (before it loads a pipeline), the in-process harness and
the tests into theirs. Any use of a stubbed attribute raises AttributeError: nothing is faked but the import.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

_TORCHVISION_STUBS = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


def stub_torchvision() -> tuple[str, ...]:
    """Empty `torchvision`, `torchvision.transforms` and `.functional` modules, if torchvision is not installed.

    The stubs go in only after diffusers and transformers are imported (this function imports them first): both
    probe `importlib.util.find_spec("torchvision")` at import and would take a stub for the real package. Each
    stub has a ModuleSpec, because `find_spec` raises on a module without one. Any use of a stubbed attribute
    raises AttributeError. Idempotent.

    Returns:
        the names this call put into `sys.modules` (a test may pop them again at teardown); () when torchvision
        is installed or the stubs are already there.
    """
    if "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is not None:
        return ()  # the real package
    import diffusers  # noqa: F401  (their torchvision probes run before the stub exists)
    import transformers  # noqa: F401

    added = tuple(name for name in _TORCHVISION_STUBS if name not in sys.modules)
    for name in added:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        mod.__path__ = []
        sys.modules[name] = mod
    if added:
        sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
        sys.modules["torchvision.transforms"].functional = sys.modules["torchvision.transforms.functional"]
    return added
