"""One training-engine interface (`digenrl_verl.workers.training`): every registered engine's worker classes have
the methods the runtime calls, with the interface's parameters; the registry names them, imports lazily, refuses
a second class under a name, and names the fix for an unknown engine."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

from digenrl_verl.workers.training import TRAINING_ENGINES, TrainerRole, TrainingEngineEntry, TrainingEngineRegistry

METHODS = [name for name, value in vars(TrainerRole).items() if inspect.isfunction(value) and not name.startswith("_")]


def interface_mismatches(cls: type) -> list[str]:
    """The interface's methods `cls` lacks or takes other parameters for (names and kinds, not annotations)."""
    out = []
    for name in METHODS:
        want = [(p.name, p.kind) for p in inspect.signature(getattr(TrainerRole, name)).parameters.values()]
        have = getattr(cls, name, None)
        if have is None:
            out.append(f"{name}: missing")
            continue
        # Ray's tracing hook adds `_ray_trace_ctx` to the methods of a class once it went through ray.remote
        got = [(p.name, p.kind) for p in inspect.signature(inspect.unwrap(have)).parameters.values()
               if not p.name.startswith("_ray_")]
        if got != want:
            out.append(f"{name}: {got} != {want}")
    return out


def test_the_interface_lists_what_the_runtime_calls():
    assert {"join", "update", "opt_step", "send_weights", "save_checkpoint", "load_checkpoint", "generate",
            "checksum", "current_version"} <= set(METHODS)


@pytest.mark.parametrize("role", ["trainer", "colocated"])
def test_the_packages_trainer_implements_the_interface(role):
    cls = TRAINING_ENGINES.worker_class("digenrl", role)
    assert cls.__name__ == {"trainer": "TrainerWorker", "colocated": "ColocatedWorker"}[role]
    assert interface_mismatches(cls) == []


def test_the_verl_plugin_names_verl_omnis_actor_worker_without_importing_it():
    import verl  # noqa: F401  (loads the verl.plugins entry points: ours registers the engine)

    assert set(TRAINING_ENGINES.names()) == {"digenrl", "verl_omni"}
    if importlib.util.find_spec("verl_omni") is None:  # the main suite: the class's module cannot import here
        with pytest.raises(ModuleNotFoundError, match="verl_omni"):
            TRAINING_ENGINES.worker_class("verl_omni", "trainer")


def test_a_mismatch_is_seen():
    class Partial:
        def join(self, spec):
            return 0

        def update(self, sample_ids, advantages):  # too few parameters
            return {}

    found = interface_mismatches(Partial)
    assert any(m.startswith("update:") for m in found) and "opt_step: missing" in found


def test_the_registry_refuses_a_second_class_under_a_name_and_names_the_fix_for_an_unknown_one():
    registry = TrainingEngineRegistry()
    entry = TrainingEngineEntry("x", "digenrl_verl.workers.roles", "TrainerWorker", "ColocatedWorker")
    registry.add(entry)
    registry.add(entry)  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        registry.add(TrainingEngineEntry("x", "digenrl_verl.workers.roles", "GeneratorWorker", "ColocatedWorker"))
    with pytest.raises(ValueError, match="trainer.digenrl.trainer_engine='nope'.*pip install -e"):
        registry.worker_class("nope", "trainer")
