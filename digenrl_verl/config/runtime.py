"""The runner's own inputs from verl-omni's `data.*` and `trainer.*` keys: prompts, logging, checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from digenrl_verl.errors import ConfigError

RESUME_MODES = ("auto", "disable", "resume_path")


@dataclass(frozen=True)
class DataSpec:
    """Prompts: `train_files` (.txt or verl-style .parquet; None = the built-in prompts), the prompt column, the
    shuffling seed."""

    train_files: Optional[str] = None
    prompt_key: str = "prompt"
    seed: int = 0
    shuffle: bool = True


@dataclass(frozen=True)
class LoggingSpec:
    """verl's Tracking: project, experiment, backends (console, tensorboard, wandb, ...)."""

    project_name: str = "digenrl"
    experiment_name: str = "run"
    loggers: tuple[str, ...] = ("console",)


@dataclass(frozen=True)
class CheckpointSpec:
    """Checkpoints: every `save_freq` global steps (<= 0: none) into `root`, keeping the last `max_to_keep`; resume
    per `resume_mode`."""

    root: str = "outputs/run/checkpoints"
    save_freq: int = -1
    max_to_keep: Optional[int] = 2
    resume_mode: str = "auto"
    resume_from_path: Optional[str] = None

    def __post_init__(self) -> None:
        if self.resume_mode not in RESUME_MODES:
            raise ConfigError("resume_mode", self.resume_mode, f"valid choices: {list(RESUME_MODES)}")

    @property
    def every(self) -> int:
        """The schedule's checkpoint barrier period (0 = none)."""
        return max(int(self.save_freq or 0), 0)
