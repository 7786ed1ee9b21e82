"""Custom reward functions loaded from a file, as verl-omni's `reward.custom_reward_function.{path,name}`.

The function is called once per sample with keyword arguments

    compute_score(data_source=str | None, solution_image=uint8 tensor [3, H, W] (video: [T, 3, H, W]),
                  ground_truth=Any, extra_info=dict)

and returns a number, or a dict with a numeric ``score`` (other keys are ignored). An async function (a
coroutine) is run to completion with `asyncio.run`. Only the file the config names is ever loaded.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import os
from typing import Any, Callable, Mapping, Sequence

import torch

from digenrl_verl.rewards.base import Reward, as_frames, ground_truth

KEY_CUSTOM_PATH = "reward.custom_reward_function.path"
KEY_CUSTOM_NAME = "reward.custom_reward_function.name"


def load_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import the file `path` as a private module and return its callable `name`."""
    if not path or not os.path.isfile(path):
        raise ValueError(f"{KEY_CUSTOM_PATH}={path!r} is not a file")
    full = os.path.abspath(path)
    mod_name = "digenrl_custom_reward_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(mod_name, full)
    if spec is None or spec.loader is None:
        raise ValueError(f"{KEY_CUSTOM_PATH}={path!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == mod_name)
        raise ValueError(f"{KEY_CUSTOM_NAME}={name!r} is not a function of {path}; functions defined there: {found}")
    return fn


class CustomReward(Reward):
    """Wraps a per-sample `compute_score` into the batch API."""

    def __init__(self, fn: Callable[..., Any], name: str = "custom") -> None:
        self.fn = fn
        self.name = name

    @classmethod
    def from_file(cls, path: str, function_name: str = "compute_score") -> "CustomReward":
        return cls(load_function(path, function_name))

    def _one(self, image: torch.Tensor, extra: Mapping[str, Any]) -> float:
        out = self.fn(data_source=extra.get("data_source"), solution_image=image, ground_truth=ground_truth(extra),
                      extra_info=extra.get("extra_info") or {})
        if inspect.isawaitable(out):
            out = asyncio.run(_await(out))
        if isinstance(out, Mapping):
            if "score" not in out:
                raise ValueError(f"custom reward {self.name!r} returned a dict without 'score': {sorted(out)}")
            out = out["score"]
        return float(out)

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              extra: Sequence[Mapping[str, Any]] | None = None) -> torch.Tensor:
        frames, extra = as_frames(images, prompts, extra)
        video = images.ndim == 5
        return torch.tensor([self._one(clip if video else clip[0], e) for clip, e in zip(frames, extra)],
                            dtype=torch.float32)


async def _await(x: Any) -> Any:
    return await x
