"""A weighted sum of rewards, built from the `reward.*` config (verl-omni `reward_functions`, aggregation
`weighted_sum`, plus `custom_reward_function`, plus the VLM judge of `reward.reward_model`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from digenrl_verl.rewards.base import KEY_REWARD_FUNCTIONS, Reward, get_reward
from digenrl_verl.rewards.custom import KEY_CUSTOM_PATH, CustomReward
from digenrl_verl.rewards.vlm_judge import (
    JUDGE_REWARD, KEY_ENABLE, KEY_MODEL_PATH, JudgeBackend, JudgeConfig, VLMJudgeReward, is_judge_function,
)

KEY_AGGREGATION = "reward.aggregation"
CUSTOM = "custom"


@dataclass(frozen=True)
class RewardConfig:
    """Args:
        reward_functions: name → weight. Names are registered rewards, or "custom" for the custom function.
        aggregation: only "weighted_sum" (normalise-then-weight is an advantage-level choice:
            `diffusion.advantages.combine_rewards` on `WeightedReward.score_components`).
        reward_model: the VLM judge (`reward.reward_model.*`); the reward named `genrm_ocr` scores with it.
        function_files: name → (file, function) for the names of reward_functions that are functions in files
            (verl-omni's `reward.reward_functions.<name>.{path,name,weight}` entries); a file entry takes precedence
            over a registered reward of the same name, and verl-omni's judge function (`is_judge_function`) is
            scored by the judge instead of being loaded.
        custom_reward_function_path / _name: a file and a function in it; when a path is set and "custom" is not
            in reward_functions, the custom function is added with weight 1.
    """

    reward_functions: Mapping[str, float] = field(default_factory=dict)
    aggregation: str = "weighted_sum"
    custom_reward_function_path: str | None = None
    custom_reward_function_name: str = "compute_score"
    reward_model: JudgeConfig | None = None
    function_files: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.aggregation != "weighted_sum":
            raise ValueError(f"unknown {KEY_AGGREGATION}={self.aggregation!r}; valid choices: ['weighted_sum']")
        if CUSTOM in self.reward_functions and not self.custom_reward_function_path:
            raise ValueError(f"{KEY_REWARD_FUNCTIONS} names 'custom' but {KEY_CUSTOM_PATH} is not set")
        if not self.reward_functions and not self.custom_reward_function_path:
            raise ValueError(f"no reward: set {KEY_REWARD_FUNCTIONS} (name → weight) or {KEY_CUSTOM_PATH}")
        for name, w in self.reward_functions.items():
            if not isinstance(w, (int, float)):
                raise ValueError(f"{KEY_REWARD_FUNCTIONS}.{name}={w!r} must be a number (its weight)")
        if JUDGE_REWARD in self.reward_functions and self.reward_model is None:
            raise ValueError(f"{KEY_REWARD_FUNCTIONS} names {JUDGE_REWARD!r} (the VLM judge's OCR score) but no judge "
                             f"is configured: set {KEY_ENABLE}=true and {KEY_MODEL_PATH}")
        for name, (path, function) in self.function_files.items():
            if name not in self.reward_functions:
                raise ValueError(f"{KEY_REWARD_FUNCTIONS}.{name}: a function file without a weight")
            if is_judge_function(path, function) and self.reward_model is None:
                raise ValueError(f"{KEY_REWARD_FUNCTIONS}.{name} is verl-omni's judge-backed {function} ({path}), "
                                 f"which needs the judge: set {KEY_ENABLE}=true and {KEY_MODEL_PATH}")

    def weights(self) -> dict[str, float]:
        w = {k: float(v) for k, v in self.reward_functions.items()}
        if self.custom_reward_function_path and CUSTOM not in w:
            w[CUSTOM] = 1.0
        return w


class WeightedReward(Reward):
    """score = Σ_i w_i · reward_i(images, prompts, extra)."""

    def __init__(self, components: Mapping[str, tuple[Reward, float]]) -> None:
        if not components:
            raise ValueError("WeightedReward needs at least one component")
        self.components = dict(components)
        self.name = "+".join(self.components)

    def score_components(self, images: torch.Tensor, prompts: Sequence[str],
                         extra: Sequence[Mapping[str, Any]] | None = None) -> dict[str, torch.Tensor]:
        """Each component's unweighted fp32 [B] scores, by name."""
        return {name: r.score(images, prompts, extra) for name, (r, _) in self.components.items()}

    def combine(self, parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return sum(w * parts[name] for name, (_, w) in self.components.items())

    def score(self, images, prompts, extra=None):
        return self.combine(self.score_components(images, prompts, extra)).to(torch.float32)


def build_reward(cfg: RewardConfig, judge: JudgeBackend | None = None) -> WeightedReward:
    """Instantiate every reward the config names (the custom file is loaded here, and only it). `judge`: the judge
    backend the judge rewards ask (the judge pool's `workers.judge.RemoteJudge`); None builds it in-process."""
    components: dict[str, tuple[Reward, float]] = {}
    for name, w in cfg.weights().items():
        if name in cfg.function_files:
            reward = _file_reward(name, *cfg.function_files[name], cfg.reward_model, judge)
        elif name == CUSTOM:
            reward: Reward = CustomReward.from_file(cfg.custom_reward_function_path or "",
                                                    cfg.custom_reward_function_name)
        elif name == JUDGE_REWARD and cfg.reward_model is not None:
            reward = VLMJudgeReward(cfg.reward_model, judge)
        else:
            reward = get_reward(name)
        components[name] = (reward, w)
    return WeightedReward(components)


def _file_reward(name: str, path: str, function: str, cfg: JudgeConfig | None, judge: JudgeBackend | None) -> Reward:
    """A `reward_functions` entry loaded from its file, or the judge for verl-omni's judge function."""
    if is_judge_function(path, function) and cfg is not None:
        reward: Reward = VLMJudgeReward(cfg, judge)
    else:
        reward = CustomReward.from_file(path, function)
    reward.name = name
    return reward
