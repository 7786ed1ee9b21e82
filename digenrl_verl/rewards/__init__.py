"""Rewards for decoded samples: a registry of batch rewards, custom functions from a file, weighted sums.

    reward = build_reward(RewardConfig(reward_functions={"brightness": 1.0}))
    scores = reward.score(images_uint8, prompts, extra)      # fp32 [B]

Registered: jpeg_compressibility, jpeg_incompressibility, brightness, color_match, ocr (needs the `ocr` extra).
With a judge model (`RewardConfig.reward_model`, verl-omni's `reward.reward_model.*`): genrm_ocr, verl-omni's OCR
reward scored by a generative VLM judge (`vlm_judge.VLMJudgeReward`), with transformers or vLLM (`judge_vllm`),
in-process or in its own Ray pool (`workers.judge`); tiny judges: `tiny_judge`.
"""

from digenrl_verl.rewards import image as _image  # noqa: F401  (registers the rule-based rewards)
from digenrl_verl.rewards import judge_vllm as _judge_vllm  # noqa: F401  (binds the `vllm` judge; vllm imported lazily)
from digenrl_verl.rewards import ocr as _ocr  # noqa: F401  (registers `ocr`; rapidocr is imported lazily)
from digenrl_verl.rewards.base import PerImageReward, Reward, as_frames, get_reward, register_reward, reward_names
from digenrl_verl.rewards.compose import RewardConfig, WeightedReward, build_reward
from digenrl_verl.rewards.custom import CustomReward, load_function
from digenrl_verl.rewards.vlm_judge import JUDGE_REWARD, JudgeConfig, VLMJudgeReward

__all__ = [
    "CustomReward",
    "JUDGE_REWARD",
    "JudgeConfig",
    "PerImageReward",
    "Reward",
    "RewardConfig",
    "VLMJudgeReward",
    "WeightedReward",
    "as_frames",
    "build_reward",
    "get_reward",
    "load_function",
    "register_reward",
    "reward_names",
]
