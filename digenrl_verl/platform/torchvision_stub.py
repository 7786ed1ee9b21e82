"""Empty `torchvision` modules for a CPU process where torchvision is not installed (its PyPI wheels are CUDA builds
that do not load beside the CPU torch; the project's CPU venvs uninstall them).

`vllm_omni.diffusion.models.wan2_2/__init__` imports its image- and speech-to-video pipelines, which import
torchvision at module level; text-to-video never calls into it. `digenrl_verl.platform.vllm_plugins.cpu_worker_plugin`
puts the stand-ins into each diffusion worker process on CPU (before it loads a pipeline), the in-process harness and
the tests into theirs, and `omni_platform_plugin` into every process that resolves vLLM-Omni's platform on CPU
(verl-omni's rollout server imports torchvision at module level: `import verl_omni` resolves the platform first). Any
use of a stubbed attribute raises AttributeError, but for `transforms.PILToTensor`, which verl-omni's server builds.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

# torchaudio too: vLLM-Omni's OpenAI server (which verl-omni's rollout server imports) imports it at module level,
# names from it included (`from torchaudio.functional import melscale_fbanks`): its stubs hand out names that raise
# when called
_AUDIO_STUBS = ("torchaudio", "torchaudio.functional", "torchaudio.functional.functional", "torchaudio.transforms",
                "torchaudio.compliance", "torchaudio.compliance.kaldi")
_TORCHVISION_STUBS = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional", *_AUDIO_STUBS)


def stub_torchvision() -> tuple[str, ...]:
    """Empty `torchvision`, `torchvision.transforms` and `.functional` modules (and `torchaudio`), for those of the
    two packages that are not installed.

    The stubs go in only after diffusers and transformers are imported (this function imports them first): both
    probe `importlib.util.find_spec("torchvision")` at import and would take a stub for the real package. Each
    stub has a ModuleSpec, because `find_spec` raises on a module without one. Any use of a stubbed attribute
    raises AttributeError. Idempotent.

    Returns:
        the names this call put into `sys.modules` (a test may pop them again at teardown); () when torchvision
        is installed or the stubs are already there.
    """
    missing = {top for top in ("torchvision", "torchaudio")
               if top in sys.modules or importlib.util.find_spec(top) is None}
    if not missing:
        return ()  # the real packages
    import diffusers  # noqa: F401  (their torchvision probes run before the stub exists)
    import transformers  # noqa: F401

    added = tuple(name for name in _TORCHVISION_STUBS
                  if name.partition(".")[0] in missing and name not in sys.modules)
    for name in added:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        mod.__path__ = []
        if name in _AUDIO_STUBS:
            mod.__getattr__ = _not_installed(name)
        sys.modules[name] = mod
    if "torchvision.transforms" in added:
        sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
        sys.modules["torchvision.transforms"].functional = sys.modules["torchvision.transforms.functional"]
        sys.modules["torchvision.transforms"].PILToTensor = PILToTensor
    return added


def _not_installed(module: str):
    """A stub module's `__getattr__`: each name is a function that raises, naming the missing package, when called."""
    def getattr_(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def missing(*args, **kwargs):
            raise RuntimeError(f"{module}.{name}: torchaudio is not installed in this CPU environment")
        return missing
    return getattr_


class PILToTensor:
    """torchvision's `transforms.PILToTensor` as torchvision documents it (a PIL image to a uint8 tensor [C, H, W],
    values unchanged): the one torchvision call verl-omni's rollout server makes (`vLLMOmniHttpServer._post_init`
    builds it; `_process_output` applies it to a PIL image output)."""

    def __call__(self, pic):
        import numpy as np
        import torch

        array = np.array(pic, copy=True)
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array).permute(2, 0, 1).contiguous()
