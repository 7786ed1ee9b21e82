"""The rollout-engine interface, and the engines that exist (names, what they need) as a registry.

A `RolloutEngine` samples trajectories for a generator rank: it holds one policy version at a time, generates a
batch of rows with it, receives new weights after each optimizer step, and reports its trainable weights
(state, checksum). The generator worker (`workers.roles.GeneratorWorker`) holds one, chosen by
`actor_rollout_ref.rollout.name`; trainers sample their TAG micro-batches with the diffusers engine over their
own policy. Engines return plain tensors; the worker turns them into DataProtos, so the trainer cannot tell
the engines apart.

`ENGINES` knows every engine by name before any backend module is imported: what it needs (third-party
packages, found with `importlib.util.find_spec` and never imported here) is declared with the
name, so the config can validate `actor_rollout_ref.rollout.name` without importing a backend. Each backend
module binds its class to its name with `@ENGINES.register(name)`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import torch

from digenrl_verl.weights.state import load_trainer_state
from digenrl_verl.weights.sync import CollectiveSpec, Collectives, state_checksum

BACKEND_KEY = "actor_rollout_ref.rollout.name"


@dataclass(frozen=True)
class RolloutRows:
    """The rows of a step batch one `generate` call samples (one trajectory per row).

    Attributes:
        prompts / uids / sample_indices: `raw_prompt`, `uid`, `sample_index` of each row.
        sample_ids: the rows' positions in the step batch (`sample_id`).
        step: the global step (part of every sample's `SampleKey`).
    """

    prompts: Sequence[str]
    uids: Sequence[str]
    sample_indices: Sequence[int]
    sample_ids: Sequence[int]
    step: int

    def __post_init__(self) -> None:
        sizes = {len(self.prompts), len(self.uids), len(self.sample_indices), len(self.sample_ids)}
        if len(sizes) != 1:
            raise ValueError(f"RolloutRows: {len(self.prompts)} prompts, {len(self.uids)} uids, "
                             f"{len(self.sample_indices)} sample indices, {len(self.sample_ids)} sample ids")

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass(frozen=True)
class Rollout:
    """What an engine returns for `RolloutRows`, rows in the same order, on the CPU.

    Attributes:
        tensors: `latents`, `next_latents` fp32 [B, K, *L], `sigmas`, `next_sigmas`, `rollout_log_probs` fp32
            [B, K], `step_index` int64 [B, K], `policy_version` int64 [B] (the version each row was sampled
            with); other keys may be present and are ignored.
        images: the decoded samples, uint8 [B, 3, H, W] (video [B, T, 3, H, W]).
    """

    tensors: Mapping[str, torch.Tensor]
    images: torch.Tensor


@runtime_checkable
class RolloutEngine(Protocol):
    """What a generator rank needs from its sampler. `version` is the policy version of the weights held."""

    version: int

    @classmethod
    def from_policy(cls, spec: Any) -> "RolloutEngine":
        """A generator's engine for the policy `spec` (`engines.spec.PolicySpec`), at `spec.start_version`."""

    def generate(self, rows: RolloutRows) -> Rollout:
        """Sample one trajectory per row with the weights held (`version`)."""

    def join(self, spec: CollectiveSpec, generator_rank: int, epoch: int = 0) -> int:
        """Join the trainer → generator weight sync as `generator_rank` (its pair group is built on the first
        `receive_weights`); `epoch`: this actor's incarnation of the rank (`weights.sync`). The global rank."""

    def receive_weights(self, version: int) -> int:
        """Receive the trainable weights trainer rank 0 broadcasts; they are `version` from now on."""

    def load_weights(self, path: str, version: int) -> int:
        """Load the trainable weights of a checkpoint directory as `version` (resume)."""

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The whole trainable weights the next `generate` uses, on the CPU."""

    def checksum(self) -> str:
        """sha256 of `trainable_state()` (`weights.sync.state_checksum`)."""


class InPlaceWeights:
    """The weight methods of an engine whose trainable weights are tensors of this process (`trainable()`, name ->
    tensor, in the trainers' names and order): trainer rank 0's broadcast and a checkpoint land in them in place,
    then `weights_received` passes them on (nothing to do when the engine samples with those very tensors)."""

    collectives: Collectives | None = None
    version: int

    def trainable(self) -> Mapping[str, torch.Tensor]:
        raise NotImplementedError

    def weights_received(self) -> None:
        """Called after new weights landed in `trainable()`."""

    def join(self, spec: CollectiveSpec, generator_rank: int, epoch: int = 0) -> int:
        self.collectives = Collectives(spec, "generator", generator_rank, epoch)
        return self.collectives.global_rank

    def receive_weights(self, version: int) -> int:
        if self.collectives is None:
            raise RuntimeError(f"{type(self).__name__} received weights before joining the process group")
        self.collectives.receive_weights(self.trainable())  # sent in the trainer's dtypes, cast into place
        self.weights_received()
        self.version = version
        return version

    def load_weights(self, path: str, version: int) -> int:
        load_trainer_state(path, self.trainable(), None)
        self.weights_received()
        self.version = version
        return version

    def hand_over(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Weights of this process's trained model (a colocated trainer rank's, in the trainers' names) into
        `trainable()`, then on (`weights_received`): the hybrid engine's weight sync. ValueError when the names
        differ."""
        mine = self.trainable()
        if set(state) != set(mine):
            missing, extra = sorted(set(mine) - set(state)), sorted(set(state) - set(mine))
            raise ValueError(f"the trained weights do not match the rollout's: missing {missing[:3]}, "
                             f"extra {extra[:3]}")
        with torch.no_grad():
            for name, value in state.items():
                mine[name].copy_(value)
        self.weights_received()
        self.version = int(version)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.trainable().items()}

    def checksum(self) -> str:
        return state_checksum({k: v.detach() for k, v in self.trainable().items()})


@dataclass(frozen=True)
class EngineEntry:
    """An engine name and what it needs to run, known without importing its module.

    Args:
        name: the value of `actor_rollout_ref.rollout.name`.
        packages: third-party packages the engine imports when it is built.
        title: the engine's name in messages.
        install_hint: how to get the packages (shown when they are missing).
        module: the module that binds the class, imported on first use when no other import has (a backend that
            lives above this layer, e.g. in `integrations`); empty: bound by a module the workers import.
    """

    name: str
    packages: tuple[str, ...] = ()
    title: str = ""
    install_hint: str = ""
    module: str = ""

    def unavailable_reason(self) -> str | None:
        """Why the engine cannot run in this process, or None. Finds the packages, never imports them."""
        missing = [m for m in self.packages if importlib.util.find_spec(m) is None]
        if missing:
            return f"{' and '.join(missing)} not installed"
        return None

    def require(self) -> None:
        """ValueError naming `actor_rollout_ref.rollout.name` and the fix when the engine cannot run here."""
        why = self.unavailable_reason()
        if why is not None:
            hint = f", or install {self.install_hint}" if self.install_hint else ""
            raise ValueError(f"{BACKEND_KEY}={self.name} cannot be used here: {why}. Fix: set {BACKEND_KEY}=diffusers "
                             f"(the default; runs on CPU and GPU){hint}")


class EngineRegistry:
    """Engine names (declared with what they need) → engine classes (bound by the backend modules)."""

    def __init__(self) -> None:
        self._entries: dict[str, EngineEntry] = {}
        self._classes: dict[str, type] = {}

    def declare(self, entry: EngineEntry) -> EngineEntry:
        if entry.name in self._entries:
            raise ValueError(f"rollout engine {entry.name!r} is declared twice")
        self._entries[entry.name] = entry
        return entry

    def names(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: str) -> EngineEntry:
        """The declared engine `name`; ValueError naming the key and the valid names on a miss."""
        if name not in self._entries:
            raise ValueError(f"unknown {BACKEND_KEY}={name!r}; valid choices: {self.names()}")
        return self._entries[name]

    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator binding a declared name to its engine class (once)."""

        def bind(cls: type) -> type:
            self.entry(name)
            if name in self._classes:
                raise ValueError(f"rollout engine {name!r} is already bound to {self._classes[name].__name__}")
            self._classes[name] = cls
            return cls

        return bind

    def engine_class(self, name: str) -> type:
        """The class bound to `name`; ValueError listing the bound names when its module was not imported."""
        entry = self.entry(name)
        if name not in self._classes and entry.module:
            importlib.import_module(entry.module)  # binds the class (`register`)
        if name not in self._classes:
            raise ValueError(f"rollout engine {name!r} has no class bound (is its module imported?); bound: "
                             f"{sorted(self._classes)}")
        return self._classes[name]


#: vLLM for the `vllm` judge backend: the `[vllm]` extra's pin, held to the real package by tests/contract. One
#: vLLM-Omni: verl-omni's (vllm 0.27.0 + vllm-omni 0.27.0rc1, scripts/verl_omni_venv.sh), the rollout's only one.
VLLM_PIN = "0.28.0"
VERL_OMNI_VLLM_PIN = "0.27.0"
VERL_OMNI_VLLM_OMNI_PIN = "0.27.0rc1"

ENGINES = EngineRegistry()
DIFFUSERS = ENGINES.declare(EngineEntry("diffusers", module="digenrl_verl.engines.diffusers"))
#: what verl-omni's scripts set: verl-omni's own rollout, which the config resolves to one of the two engines below
#: (`config.verl_omni.generator_engine_name`, ``trainer.digenrl.generator_replicas``); no class is bound to it
VLLM_OMNI = ENGINES.declare(EngineEntry(
    "vllm_omni", packages=("verl_omni", "vllm_omni"), title="verl-omni's vLLM-Omni rollout",
    install_hint="verl-omni with its vLLM-Omni (docs/verl_omni.md)"))
VERL_OMNI = ENGINES.declare(EngineEntry(
    "verl_omni", packages=("verl_omni", "vllm_omni"), title="verl-omni's rollout pipeline",
    install_hint="verl-omni with its vLLM-Omni (docs/verl_omni.md)",
    module="digenrl_verl.integrations.verl_omni_rollout"))
VERL_OMNI_REPLICA = ENGINES.declare(EngineEntry(
    "verl_omni_replica", packages=("verl_omni", "vllm_omni", "ray"), title="verl-omni's rollout replica",
    install_hint="verl-omni with its vLLM-Omni (docs/verl_omni.md)",
    module="digenrl_verl.integrations.verl_omni_replica"))
