"""The training-engine interface of a trainer pool rank, and the engines that exist (names, where their worker
classes live) as a registry: the trainer-side twin of `engines.base` (`RolloutEngine`, `ENGINES`).

`TrainerRole` is what the executor, the driver and the runner call on a trainer (or colocated) rank; every training
engine is a verl `Worker` class with these methods, so the runtime cannot tell them apart:

| engine (`trainer.digenrl.trainer_engine`) | worker classes | what trains |
|---|---|---|
| ``digenrl`` | `workers.roles.TrainerWorker`, `ColocatedWorker` | the package's own trainer (FSDP2 or replicated, |
| | | LoRA, AdamW, loss, TSP): the standalone entry point |
| ``verl_omni`` | `integrations.verl_omni_trainer.VerlOmniTrainerWorker`, | verl-omni's actor worker and engine (TSP |
| | `VerlOmniColocatedWorker` | subclass), from verl-omni's composed config |

The ``verl_omni`` entry is added by the host plugin (`integrations.verl_plugin`, loaded by `import verl` in every
process), so this layer names no module above it; `worker_classes` imports an engine's module only when a run
selects it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from digenrl_verl.weights.sync import CollectiveSpec


@runtime_checkable
class TrainerRole(Protocol):
    """A trainer pool rank, as the runtime calls it (`.remote`, one actor at a time, calls in order)."""

    version: int

    def join(self, spec: CollectiveSpec) -> int:
        """Join the trainer world (and build what needs the process group: sharding, optimizer); the global rank."""

    def update(self, sample_ids: list[int], advantages: torch.Tensor, loss_denominator: float, tsp: bool,
               version: int, max_share: int, *traj_parts: Any) -> dict[str, float]:
        """Forward/backward over this rank's share of one micro-batch with weights `version`; gradients add up.
        The gradient is that of (sum over rows and trained steps of the loss) / `loss_denominator`. Returns
        `diffusion.loss.LossStats` sums."""

    def update_call(self, message: bytes, *traj_parts: Any) -> dict[str, float]:
        """The executor's UPDATE: `update`'s plain arguments in one message (`workers.calls`), then its `traj_parts`."""

    def opt_step(self, version: int, grad_scale: float = 1.0) -> dict[str, float]:
        """One optimizer step over what was accumulated, scaled by `grad_scale` first (the deferred global std's
        1/(σ + ε), on both trainer engines); the weights become `version`. ``grad_norm``,
        ``skipped``, ``version``, ``lr``."""

    def send_weights(self, version: int, generators: list[int]) -> int:
        """Rank 0 sends the trainable weights of `version` to the listed generator ranks."""

    def expect_generator(self, generator: int, epoch: int) -> None:
        """Generator rank `generator` was replaced by an actor of `epoch` (the next send builds a new pair)."""

    def save_checkpoint(self, path: str) -> int:
        """Write the trainer state into the directory `path` (every rank is called); the version saved."""

    def load_checkpoint(self, path: str, version: int) -> int:
        """Restore the trainer state of `path` as `version`."""

    def current_version(self) -> int:
        """The version of the weights held."""

    def checksum(self) -> dict[str, Any]:
        """Version and sha256 of the trainable weights (weight-sync checks), plus memory and busy time."""

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The whole trainable weights, on the CPU."""

    def accumulated_gradients(self) -> dict[str, torch.Tensor]:
        """This rank's gradients accumulated since the last optimizer step (inspection, equivalence tests)."""

    def generate(self, shard: Any, sample_ids: list[int], version: int) -> tuple[Any, Any, dict]:
        """TAG: sample `shard`'s rows with the current weights (`workers.roles.GenerationMixin.generate`)."""

    def generate_call(self, shard: Any, message: bytes) -> tuple[Any, Any, dict]:
        """The executor's TAG_GEN: `generate`'s shard, then its ids and version in one message (`workers.calls`)."""

    def score(self, sample_ids: list[int], *image_parts: Any) -> dict[str, Any]:
        """Score decoded samples (the fallback when no generator is left)."""

    def score_call(self, message: bytes, *image_parts: Any) -> dict[str, Any]:
        """The executor's SCORE: `score`'s sample ids in one message (`workers.calls`), then its `image_parts`."""


@dataclass(frozen=True)
class TrainingEngineEntry:
    """A training engine's name and where its worker classes live (imported only when a run selects it).

    Args:
        name: the value of `trainer.digenrl.trainer_engine`.
        module: the module holding the classes.
        trainer / colocated: the worker classes of a disaggregated trainer rank and of a colocated rank.
        title: the engine in messages.
    """

    name: str
    module: str
    trainer: str
    colocated: str
    title: str = ""


class TrainingEngineRegistry:
    """name -> `TrainingEngineEntry`."""

    def __init__(self) -> None:
        self._entries: dict[str, TrainingEngineEntry] = {}

    def add(self, entry: TrainingEngineEntry) -> TrainingEngineEntry:
        """Register `entry` (idempotent for an equal entry; another entry under the name is a ValueError)."""
        have = self._entries.get(entry.name)
        if have is not None and have != entry:
            raise ValueError(f"training engine {entry.name!r} is already registered as {have}")
        self._entries[entry.name] = entry
        return entry

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def worker_class(self, name: str, role: str) -> type:
        """The worker class of `role` ("trainer" or "colocated") of engine `name` (its module imported now)."""
        entry = self._entries.get(name)
        if entry is None:
            raise ValueError(f"trainer.digenrl.trainer_engine={name!r} is not registered here (known: "
                             f"{list(self._entries)}); the verl_omni engine is registered by the package's verl "
                             "plugin: reinstall the package (pip install -e .) so that verl finds its entry point")
        return getattr(importlib.import_module(entry.module), entry.trainer if role == "trainer" else entry.colocated)


TRAINING_ENGINES = TrainingEngineRegistry()
TRAINING_ENGINES.add(TrainingEngineEntry("digenrl", "digenrl_verl.workers.roles", "TrainerWorker", "ColocatedWorker",
                                         "the package's trainer"))
