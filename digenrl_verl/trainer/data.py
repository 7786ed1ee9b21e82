"""Prompts for training: `data.train_files` (text or parquet) or the small built-in set, as step batches.

The step batch is the DataProto every worker sees rows of: prompts repeated `rollout.n` times, row
i = prompt i // n, sample i % n.

DataProto keys made here (B = prompts_per_step × n rows):
- non_tensor_batch["raw_prompt"]: object [B], the prompt text.
- non_tensor_batch["uid"]: object [B], one id per prompt group (the same for the n samples of a prompt).
- non_tensor_batch["sample_index"]: int64 [B], index of the sample inside its group (0 … n−1).
- non_tensor_batch["data_source"]: object [B], the prompt's `data.reward_fn_key` column (verl's `data_source`) of a
  parquet file that has it, as verl-omni's dataset gives it; else the file (or "builtin") the prompt came from.
- non_tensor_batch["reward_model"], ["extra_info"]: object [B] of dicts, only when the prompt file has those
  columns (verl-style parquet: `reward_model.ground_truth` reaches the reward functions).
- meta_info["global_step"]: the global step the batch belongs to.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np
from verl import DataProto

from digenrl_verl.workers.batch import EXTRA_COLUMNS


def builtin_prompts() -> list[str]:
    text = resources.files("digenrl_verl.data").joinpath("prompts.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


def load_prompts(files: str | Sequence[str] | None, prompt_key: str = "prompt", *, with_extras: bool = False,
                 key: str = "data.train_files", source_key: str = "data_source"):
    """(prompts, data_source per prompt) from text files (one prompt per line) or parquet files; errors name `key`
    (the setting the files came from). A parquet file's data source is its `source_key` column (verl-omni's
    `data.reward_fn_key`), where it has one; otherwise the file's name.

    With `with_extras`, also a dict per prompt holding its `reward_model` / `extra_info` columns (empty for
    text files and files without them)."""
    if files is None or (not isinstance(files, str) and len(files) == 0):
        p = builtin_prompts()
        return (p, ["builtin"] * len(p), [{} for _ in p]) if with_extras else (p, ["builtin"] * len(p))
    prompts: list[str] = []
    sources: list[str] = []
    extras: list[dict] = []
    for f in [files] if isinstance(files, str) else list(files):
        path = Path(f)
        if not path.exists():
            raise ValueError(f"{key}: {f!r} does not exist; give a .txt (one prompt per line) or .parquet "
                             "file")
        if path.suffix == ".parquet":
            import pandas as pd

            df = pd.read_parquet(path)
            if prompt_key not in df.columns:
                raise ValueError(f"data.prompt_key={prompt_key!r} is not a column of {f}; columns: {list(df.columns)}")
            col = [str(x) if not isinstance(x, (list, np.ndarray)) else _chat_text(x) for x in df[prompt_key]]
            extras += [{c: _plain(row[c]) for c in EXTRA_COLUMNS if c in df.columns} for _, row in df.iterrows()]
            sources += [str(x) for x in df[source_key]] if source_key in df.columns else [path.name] * len(col)
        else:
            col = [line.strip() for line in path.read_text().splitlines() if line.strip()]
            extras += [{} for _ in col]
            sources += [path.name] * len(col)
        prompts += col
    if not prompts:
        raise ValueError(f"{key}={files!r} holds no prompts")
    return (prompts, sources, extras) if with_extras else (prompts, sources)


def _plain(value):
    """parquet structs come back as dicts of numpy values; make them plain Python."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


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

    def next_indices(self) -> list[tuple[int, int]]:
        """(stream position, index into `prompts`) of the next step's prompts; advances the cursor."""
        out = []
        for _ in range(self.batch_size):
            epoch, pos = divmod(self.cursor, len(self.prompts))
            out.append((self.cursor, self._order(epoch)[pos]))
            self.cursor += 1
        return out

    def next_batch(self) -> tuple[list[str], list[str], list[int]]:
        """(prompts, sources, prompt ids) of the next step; prompt ids are global positions in the stream."""
        picked = self.next_indices()
        return [self.prompts[j] for _, j in picked], [self.sources[j] for _, j in picked], [c for c, _ in picked]


def make_step_batch(prompts: Sequence[str], sources: Sequence[str], prompt_ids: Sequence[int], n: int, step: int,
                    extras: Sequence[dict] | None = None):
    """The step's DataProto: each prompt repeated n times (interleaved, as GRPO groups are laid out)."""
    rows = len(prompts) * n
    non_tensors = {
        "raw_prompt": np.array([prompts[i // n] for i in range(rows)], dtype=object),
        "uid": np.array([f"p{prompt_ids[i // n]}" for i in range(rows)], dtype=object),
        "sample_index": np.array([i % n for i in range(rows)], dtype=np.int64),
        "data_source": np.array([sources[i // n] for i in range(rows)], dtype=object),
    }
    for column in EXTRA_COLUMNS:
        if extras is not None and any(column in e for e in extras):
            values = np.empty(rows, dtype=object)
            for i in range(rows):
                values[i] = dict(extras[i // n].get(column) or {})
            non_tensors[column] = values
    return DataProto.from_dict(tensors={}, non_tensors=non_tensors, meta_info={"global_step": step})
