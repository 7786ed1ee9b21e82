"""OCR reward with rapidocr-onnxruntime (ships PP-OCRv4 ONNX weights; optional extra `ocr`).

score = 1 − min(Levenshtein(read, target), len(target)) / len(target), on lower-cased text without spaces
(Flow-GRPO's OCR reward). The target is the sample's ground truth (`ground_truth` or
`reward_model.ground_truth`), else the first double-quoted span of the prompt (Flow-GRPO's OCR prompts read
`... "TEXT" ...`).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from digenrl_verl.rewards.base import PerImageReward, ground_truth, register_reward

INSTALL_HINT = "the 'ocr' reward needs rapidocr-onnxruntime: pip install digenrl-verl[ocr]"


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of one character each)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _norm(text: str) -> str:
    return text.replace(" ", "").lower()


def ocr_text_score(read: str, target: str) -> float:
    """1 − normalised edit distance between the text read and the target, in [0, 1]."""
    t = _norm(target)
    if not t:
        raise ValueError("the OCR target text is empty")
    dist = min(levenshtein(_norm(read), t), len(t))
    return 1.0 - dist / len(t)


def ocr_target(prompt: str, extra: Mapping[str, Any]) -> str:
    gt = ground_truth(extra)
    if gt:
        return str(gt)
    m = re.search(r'"([^"]+)"', prompt)
    if not m:
        raise ValueError(f"no OCR target for prompt {prompt!r}: give extra['ground_truth'] or quote the text "
                         'in the prompt (… "TEXT" …)')
    return m.group(1)


@register_reward("ocr")
class OCRReward(PerImageReward):
    def __init__(self) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as err:
            raise ImportError(INSTALL_HINT) from err
        self.engine = RapidOCR()

    def read(self, image: torch.Tensor) -> str:
        """The text rapidocr reads in a uint8 [3, H, W] RGB image (lines joined), '' if none."""
        bgr = image.permute(1, 2, 0).flip(-1).contiguous().numpy()
        result, _ = self.engine(bgr)
        return " ".join(str(line[1]) for line in result) if result else ""

    def score_image(self, image, prompt, extra):
        return ocr_text_score(self.read(image), ocr_target(prompt, extra))
