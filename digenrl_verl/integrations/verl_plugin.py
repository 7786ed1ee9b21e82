"""verl's plugin hook (entry-point group `verl.plugins`, loaded by `import verl`): puts DigenRL in verl-omni's v1
trainer registry as `trainer.v1.trainer_mode=digenrl`, in every process, with no verl-omni file patched; and
registers the package's CPU platform (`digenrl_verl.platform.cpu`), which a process selects with
``VERL_PLATFORM=cpu`` (never auto-detected: on a machine without an accelerator verl falls back to ``nvidia``, and
verl-omni's `auto_set_device` then turns ``trainer.device=cpu`` into ``cuda``).

verl imports its plugins in every process that imports verl (the driver, Ray's task runner, every worker), and
most of them never build a verl-omni trainer; importing verl-omni's trainer modules here would cost each of them
seconds. So this module only watches for the module that defines verl-omni's registry
(`verl_omni.trainer.diffusion.v1.trainer_base`, TRAINER_BASE): when a process imports it (verl-omni's
`DiffusionTaskRunnerV1.run` does, to look the trainer mode up), `register_diffusion_trainer("digenrl")` runs on it
right after its code (the same post-import idiom verl-omni uses for vLLM's fused-MoE alias). Where verl-omni is not
installed this does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TRAINER_BASE = "verl_omni.trainer.diffusion.v1.trainer_base"


def register_in(trainer_base) -> None:
    """Register DigenRL's trainer in `trainer_base`'s registry (the module object, complete or just executed)."""
    from digenrl_verl.integrations.verl_omni import TRAINER_MODE, DigenRLDiffusionTrainer

    if trainer_base.DIFFUSION_TRAINER_REGISTRY.get(TRAINER_MODE) is None:
        trainer_base.register_diffusion_trainer(TRAINER_MODE)(DigenRLDiffusionTrainer)


class _RegisterAfterExec(importlib.abc.Loader):
    """The real loader of TRAINER_BASE, then `register_in` on the module it filled."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        register_in(module)

    def __getattr__(self, name: str):  # get_source, get_filename, ...: the real loader's
        return getattr(self.loader, name)


class _TrainerBaseFinder(importlib.abc.MetaPathFinder):
    """Finds TRAINER_BASE with the other finders and wraps its loader (once; then leaves sys.meta_path)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TRAINER_BASE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterAfterExec(spec.loader)
        return spec


def install() -> None:
    """Register the CPU platform; the trainer mode now if the registry is already imported, else when it is
    (idempotent)."""
    import digenrl_verl.platform.cpu  # noqa: F401  (registers "cpu" in verl's PlatformRegistry)

    if TRAINER_BASE in sys.modules:
        register_in(sys.modules[TRAINER_BASE])
    elif not any(isinstance(f, _TrainerBaseFinder) for f in sys.meta_path) \
            and importlib.util.find_spec("verl_omni") is not None:
        sys.meta_path.insert(0, _TrainerBaseFinder())


install()
