"""Prompts for training: `data.train_files` (text or parquet) or the small built-in set, as step batches.

The step batch is the DataProto every worker sees rows of: prompts repeated `rollout.n` times, row
i = prompt i // n, sample i % n.

DataProto keys made here (B = prompts_per_step × n rows):
- non_tensor_batch["raw_prompt"]: object [B], the prompt text.
- non_tensor_batch["uid"]: object [B], one id per prompt group (the same for the n samples of a prompt).
- non_tensor_batch["sample_index"]: int64 [B], index of the sample inside its group (0 … n−1).
- non_tensor_batch["data_source"]: object [B], the file (or "builtin") the prompt came from.
- meta_info["global_step"]: the global step the batch belongs to.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np


def builtin_prompts() -> list[str]:
    text = resources.files("digenrl_verl.data").joinpath("prompts.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


def load_prompts(files: str | Sequence[str] | None, prompt_key: str = "prompt") -> tuple[list[str], list[str]]:
    """(prompts, data_source per prompt) from text files (one prompt per line) or parquet files."""
    if files is None or (not isinstance(files, str) and len(files) == 0):
        p = builtin_prompts()
        return p, ["builtin"] * len(p)
    prompts: list[str] = []
    sources: list[str] = []
    for f in [files] if isinstance(files, str) else list(files):
        path = Path(f)
        if not path.exists():
            raise ValueError(f"data.train_files: {f!r} does not exist; give a .txt (one prompt per line) or .parquet file")
        if path.suffix == ".parquet":
            import pandas as pd

            df = pd.read_parquet(path)
            if prompt_key not in df.columns:
                raise ValueError(f"data.prompt_key={prompt_key!r} is not a column of {f}; columns: {list(df.columns)}")
            col = [str(x) if not isinstance(x, (list, np.ndarray)) else _chat_text(x) for x in df[prompt_key]]
        else:
            col = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        prompts += col
        sources += [path.name] * len(col)
    if not prompts:
        raise ValueError(f"data.train_files={files!r} holds no prompts")
    return prompts, sources


def _chat_text(messages) -> str:
    """verl-style chat prompts ([{role, content}, ...]) → the user text."""
    return " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


@dataclass
class PromptStream:
    """Deterministic prompt batches: epoch-wise shuffling from `seed`; the cursor is checkpointable."""

    prompts: list[str]
    sources: list[str]
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    cursor: int = 0  # prompts consumed so far (over all epochs)

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(f"data.train_batch_size must be positive, got {self.batch_size}")

    def _order(self, epoch: int) -> list[int]:
        idx = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
        return idx

    def next_batch(self) -> tuple[list[str], list[str], list[int]]:
        """(prompts, sources, prompt ids) of the next step; prompt ids are global positions in the stream."""
        out_p, out_s, out_i = [], [], []
        for _ in range(self.batch_size):
            epoch, pos = divmod(self.cursor, len(self.prompts))
            j = self._order(epoch)[pos]
            out_p.append(self.prompts[j])
            out_s.append(self.sources[j])
            out_i.append(self.cursor)
            self.cursor += 1
        return out_p, out_s, out_i


def make_step_batch(prompts: Sequence[str], sources: Sequence[str], prompt_ids: Sequence[int], n: int, step: int):
    """The step's DataProto: each prompt repeated n times (interleaved, as GRPO groups are laid out)."""
    from verl import DataProto

    rows = len(prompts) * n
    return DataProto.from_dict(
        tensors={},
        non_tensors={
            "raw_prompt": np.array([prompts[i // n] for i in range(rows)], dtype=object),
            "uid": np.array([f"p{prompt_ids[i // n]}" for i in range(rows)], dtype=object),
            "sample_index": np.array([i % n for i in range(rows)], dtype=np.int64),
            "data_source": np.array([sources[i // n] for i in range(rows)], dtype=object),
        },
        meta_info={"global_step": step},
    )
