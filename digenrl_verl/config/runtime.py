"""The runner's own inputs from verl-omni's `data.*` and `trainer.*` keys: prompts, logging, checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from digenrl_verl.diffusion.rollout import RolloutConfig
from digenrl_verl.errors import ConfigError

RESUME_MODES = ("auto", "disable", "resume_path")


@dataclass(frozen=True)
class DataSpec:
    """Prompts: `train_files` (.txt or verl-style .parquet; None = the built-in prompts), the prompt column, the
    shuffling seed; validation prompts: `val_files` (None = the training prompts), at most `val_max_samples` of
    them (-1 = all, as verl-omni's data.val_max_samples)."""

    train_files: Optional[str] = None
    prompt_key: str = "prompt"
    seed: int = 0
    shuffle: bool = True
    val_files: Optional[str] = None
    val_max_samples: int = -1
    source_key: str = "data_source"  # the parquet column of a prompt's data source (data.reward_fn_key)
    negative_prompt_key: str = "negative_prompt"  # the parquet column of a row's negative prompt (verl-omni's key)
    #: verl-omni's data.dataloader_num_workers: prompts are read once by the driver, but a checkpoint carries the state
    #: of verl-omni's training dataloader with that many workers (`data.pt`), so that its own trainer resumes it
    loader_workers: int = 0

    def __post_init__(self) -> None:
        n = self.val_max_samples
        if isinstance(n, bool) or not isinstance(n, int) or (n < 1 and n != -1):
            raise ConfigError("val_max_samples", n, "use -1 (every validation prompt) or an integer >= 1")


@dataclass(frozen=True)
class ValidationSpec:
    """Validation runs (verl-omni's `trainer.test_freq` / `trainer.val_before_train`): `n` samples of each
    validation prompt, scored, after every global step s with (s + 1) % test_freq == 0 and after the last step
    (test_freq <= 0: never), and before the first step when `before_train`.

    `rollout`: how they are sampled (verl-omni's `rollout.val_kwargs`: steps, noise level and SDE kind, seed, on top
    of the training rollout's settings); None: deterministic (ODE) samples with the training rollout's settings."""

    test_freq: int = -1
    before_train: bool = False
    n: int = 1
    rollout: Optional[RolloutConfig] = None

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ConfigError("n", self.n, "use an integer >= 1: samples per validation prompt")
        if isinstance(self.test_freq, bool) or not isinstance(self.test_freq, int):
            raise ConfigError("test_freq", self.test_freq, "use an integer: the steps between validations "
                              "(-1 = no periodic validation)")
        if not isinstance(self.before_train, bool):
            raise ConfigError("val_before_train", self.before_train, "use true or false")

    @property
    def every(self) -> int:
        """The schedule's validation barrier period (0 = none)."""
        return max(self.test_freq, 0)

    @property
    def enabled(self) -> bool:
        return self.every > 0 or self.before_train


@dataclass(frozen=True)
class LoggingSpec:
    """verl's Tracking: project, experiment, backends (console, tensorboard, wandb, ...)."""

    project_name: str = "digenrl"
    experiment_name: str = "run"
    loggers: tuple[str, ...] = ("console",)


@dataclass(frozen=True)
class CheckpointSpec:
    """Checkpoints: every `save_freq` global steps (<= 0: none) into `root`, keeping the last `max_to_keep` (None or
    <= 0: all, as verl-omni's ``trainer.max_actor_ckpt_to_keep``); resume per `resume_mode`."""

    root: str = "outputs/run/checkpoints"
    save_freq: int = -1
    max_to_keep: Optional[int] = None
    resume_mode: str = "auto"
    resume_from_path: Optional[str] = None

    def __post_init__(self) -> None:
        if self.resume_mode not in RESUME_MODES:
            raise ConfigError("resume_mode", self.resume_mode, f"valid choices: {list(RESUME_MODES)}")

    @property
    def every(self) -> int:
        """The schedule's checkpoint barrier period (0 = none)."""
        return max(int(self.save_freq or 0), 0)
