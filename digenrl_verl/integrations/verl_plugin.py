"""verl's plugin hook (entry-point group `verl.plugins`, loaded by `import verl`): puts DigenRL in verl-omni's v1
trainer registry as `trainer.v1.trainer_mode=digenrl`, and our TSP engine in verl's engine registry (vendor
`digenrl_tsp`), in every process, with no verl-omni file patched; and
names verl-omni's actor worker as the training engine ``verl_omni`` (`workers.training`), and registers the package's
CPU platform (`digenrl_verl.platform.cpu`), which a process selects with
``VERL_PLATFORM=cpu`` (never auto-detected: on a machine without an accelerator verl falls back to ``nvidia``, and
verl-omni's `auto_set_device` then turns ``trainer.device=cpu`` into ``cuda``).

verl imports its plugins in every process that imports verl (the driver, Ray's task runner, every worker), and
most of them never build a verl-omni trainer; importing verl-omni's trainer modules here would cost each of them
seconds. So this module only watches for the modules of AFTER_IMPORT: when a process imports verl-omni's trainer
registry (`verl_omni.trainer.diffusion.v1.trainer_base`; `DiffusionTaskRunnerV1.run` does, to look the trainer mode
up), `register_diffusion_trainer("digenrl")` runs on it right after its code; when it imports verl-omni's engine
package, our TSP subclasses register (the same post-import idiom verl-omni uses for vLLM's fused-MoE
alias). Where verl-omni is not installed this only registers the CPU platform.
"""

from __future__ import annotations

import importlib.util

from digenrl_verl.platform.after_import import after_import

TRAINER_BASE = "verl_omni.trainer.diffusion.v1.trainer_base"
#: verl-omni's engine package (its FSDP and VeOmni diffusion engines): once it is imported, our TSP engine
#: subclasses register in verl's engine registry (vendor `digenrl_tsp`, `integrations.verl_omni_tsp`). The package,
#: not the FSDP module: our module imports both engines, and the package is complete only after its __init__.
ENGINES = "verl_omni.workers.engine"


def register_trainer_mode(trainer_base) -> None:
    """`integrations.verl_omni.register_in` on verl-omni's trainer registry (the registration lives there, with the
    trainer it registers; this hook only calls it, so the bridge never imports the hook back)."""
    from digenrl_verl.integrations.verl_omni import register_in

    register_in(trainer_base)


def register_tsp_engine(_engine_module) -> None:
    """verl-omni's own engines for the CPU device too (`verl_omni_cpu_engines`), then our TSP subclasses."""
    from digenrl_verl.integrations.verl_omni_cpu_engines import register_on_cpu

    register_on_cpu()
    import digenrl_verl.integrations.verl_omni_tsp  # noqa: F401  (registers on import)


#: module → what runs on it right after its code (or at once, when it is already imported)
AFTER_IMPORT = {TRAINER_BASE: register_trainer_mode, ENGINES: register_tsp_engine}


def register_training_engine() -> None:
    """Name verl-omni's actor worker as the training engine ``verl_omni`` (`workers.training`); its module, which
    imports verl-omni, is imported only by runs that select it."""
    from digenrl_verl.workers.training import TRAINING_ENGINES, TrainingEngineEntry

    TRAINING_ENGINES.add(TrainingEngineEntry("verl_omni", "digenrl_verl.integrations.verl_omni_trainer",
                                             "VerlOmniTrainerWorker", "VerlOmniColocatedWorker",
                                             "verl-omni's actor worker"))


def install() -> None:
    """Register the CPU platform and the ``verl_omni`` training engine; run each AFTER_IMPORT callback now if its
    module is already imported, else when it is (`platform.after_import`; idempotent)."""
    import digenrl_verl.platform.cpu  # noqa: F401  (registers "cpu" in verl's PlatformRegistry)

    register_training_engine()
    if importlib.util.find_spec("verl_omni") is None:
        return
    for name, after in AFTER_IMPORT.items():
        after_import(name, after)


install()
