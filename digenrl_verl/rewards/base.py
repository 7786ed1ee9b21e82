"""Reward interface and registry.

A reward scores a batch of decoded samples:

    score(images, prompts, extra) -> fp32 [B]

* images: uint8 [B, 3, H, W] (images) or [B, T, 3, H, W] (videos);
* prompts: B strings;
* extra: None or B dicts of per-sample metadata (verl non-tensor fields). Keys read by the built-ins and by
  custom functions: ``data_source`` (str), ``ground_truth`` (or ``reward_model.ground_truth``), ``extra_info``
  (dict).

Image rewards defined on one frame average over the frames of a video.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Mapping, Sequence

import torch

KEY_REWARD_FUNCTIONS = "reward.reward_functions"


class Reward(abc.ABC):
    """A batch reward. Subclasses implement `score`, or `score_image` via `PerImageReward`."""

    name: str = ""

    @abc.abstractmethod
    def score(self, images: torch.Tensor, prompts: Sequence[str],
              extra: Sequence[Mapping[str, Any]] | None = None) -> torch.Tensor:
        """fp32 [B] rewards of the batch (see the module doc for the shapes)."""

    def __call__(self, images: torch.Tensor, prompts: Sequence[str],
                 extra: Sequence[Mapping[str, Any]] | None = None) -> torch.Tensor:
        return self.score(images, prompts, extra)


def as_frames(images: torch.Tensor, prompts: Sequence[str], extra: Sequence[Mapping[str, Any]] | None
              ) -> tuple[torch.Tensor, list[Mapping[str, Any]]]:
    """Validate a batch; return uint8 [B, T, 3, H, W] on CPU (T = 1 for images) and B extra dicts."""
    if images.dtype != torch.uint8:
        raise ValueError(f"rewards take uint8 images, got {images.dtype}")
    if images.ndim == 4:
        images = images[:, None]
    if images.ndim != 5 or images.shape[2] != 3:
        raise ValueError(f"rewards take [B, 3, H, W] or [B, T, 3, H, W] images, got {list(images.shape)}")
    b = images.shape[0]
    if len(prompts) != b:
        raise ValueError(f"got {len(prompts)} prompts for {b} images")
    if extra is None:
        extra = [{}] * b
    if len(extra) != b:
        raise ValueError(f"got {len(extra)} extra dicts for {b} images")
    return images.cpu(), list(extra)


def ground_truth(extra: Mapping[str, Any]) -> Any:
    """`ground_truth`, or verl's `reward_model.ground_truth`, or None."""
    if extra.get("ground_truth") is not None:
        return extra["ground_truth"]
    rm = extra.get("reward_model")
    return rm.get("ground_truth") if isinstance(rm, Mapping) else None


class PerImageReward(Reward):
    """A reward computed per frame (uint8 [3, H, W]) and averaged over a video's frames."""

    @abc.abstractmethod
    def score_image(self, image: torch.Tensor, prompt: str, extra: Mapping[str, Any]) -> float:
        """The reward of one uint8 [3, H, W] frame."""

    def score(self, images, prompts, extra=None):
        frames, extra = as_frames(images, prompts, extra)
        out = [sum(self.score_image(f, p, e) for f in clip) / clip.shape[0]
               for clip, p, e in zip(frames, prompts, extra)]
        return torch.tensor(out, dtype=torch.float32)


_REGISTRY: dict[str, Callable[[], Reward]] = {}


def register_reward(name: str) -> Callable[[Callable[[], Reward]], Callable[[], Reward]]:
    """Register a reward factory (a Reward subclass or a zero-argument callable) under `name`."""
    def deco(factory: Callable[[], Reward]) -> Callable[[], Reward]:
        if name in _REGISTRY:
            raise ValueError(f"reward {name!r} is already registered ({_REGISTRY[name]!r})")
        _REGISTRY[name] = factory
        return factory

    return deco


def reward_names() -> list[str]:
    return sorted(_REGISTRY)


def get_reward(name: str) -> Reward:
    """A new instance of the reward registered as `name` (ValueError listing the valid names on a miss)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward {name!r} in {KEY_REWARD_FUNCTIONS}; valid names: {reward_names()} "
                         "(or 'custom' with reward.custom_reward_function.path)")
    reward = _REGISTRY[name]()
    reward.name = name
    return reward
