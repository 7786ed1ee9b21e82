"""Rule-based image rewards that need no weights: JPEG size, brightness, prompt colour match."""

from __future__ import annotations

import io
import math
import re
from typing import Any, Mapping

import torch
from PIL import Image

from digenrl_verl.rewards.base import PerImageReward, register_reward


def jpeg_kilobytes(image: torch.Tensor, quality: int = 95) -> float:
    """Size in kB (1000 bytes) of a uint8 [3, H, W] image saved as JPEG at `quality`."""
    buf = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).contiguous().numpy(), "RGB").save(buf, format="JPEG", quality=quality)
    return buf.tell() / 1000.0


@register_reward("jpeg_incompressibility")
class JpegIncompressibility(PerImageReward):
    """DDPO's incompressibility: JPEG size in kB at quality 95 (noisy images score high)."""

    def score_image(self, image, prompt, extra):
        return jpeg_kilobytes(image)


@register_reward("jpeg_compressibility")
class JpegCompressibility(PerImageReward):
    """Flow-GRPO's compressibility: −kB/500 at quality 95 (smooth images score high)."""

    def score_image(self, image, prompt, extra):
        return -jpeg_kilobytes(image) / 500.0


@register_reward("brightness")
class Brightness(PerImageReward):
    """Mean pixel value / 255, in [0, 1]."""

    def score_image(self, image, prompt, extra):
        return float(image.float().mean()) / 255.0


#: Colour words recognised in prompts → RGB in [0, 1].
COLORS: dict[str, tuple[float, float, float]] = {
    "red": (1.0, 0.0, 0.0),
    "orange": (1.0, 0.5, 0.0),
    "yellow": (1.0, 1.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "cyan": (0.0, 1.0, 1.0),
    "blue": (0.0, 0.0, 1.0),
    "purple": (0.5, 0.0, 0.5),
    "magenta": (1.0, 0.0, 1.0),
    "pink": (1.0, 0.75, 0.8),
    "brown": (0.6, 0.3, 0.1),
    "white": (1.0, 1.0, 1.0),
    "black": (0.0, 0.0, 0.0),
    "gray": (0.5, 0.5, 0.5),
    "grey": (0.5, 0.5, 0.5),
}


def prompt_color(prompt: str) -> str:
    """The first colour word of `prompt` (ValueError listing the known colours if there is none)."""
    for word in re.findall(r"[a-z]+", prompt.lower()):
        if word in COLORS:
            return word
    raise ValueError(f"color_match needs a colour word in each prompt; {prompt!r} has none. "
                     f"Known colours: {sorted(COLORS)}")


@register_reward("color_match")
class ColorMatch(PerImageReward):
    """1 − ‖mean RGB − colour named in the prompt‖₂ / √3, in [0, 1] (1 = exactly that colour on average)."""

    def score_image(self, image: torch.Tensor, prompt: str, extra: Mapping[str, Any]) -> float:
        target = torch.tensor(COLORS[prompt_color(prompt)])
        mean_rgb = image.float().mean(dim=(1, 2)) / 255.0
        return 1.0 - float(torch.linalg.vector_norm(mean_rgb - target)) / math.sqrt(3.0)
