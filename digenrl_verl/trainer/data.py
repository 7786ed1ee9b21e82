"""Prompts for training: `data.train_files` (text or parquet) or the small built-in set, as step batches.

The step batch is the DataProto every worker sees rows of: prompts repeated `rollout.n` times, row
i = prompt i // n, sample i % n.

DataProto keys made here (B = prompts_per_step × n rows):
- non_tensor_batch["raw_prompt"]: object [B], the prompt text (a chat prompt's user text, `chat_text`).
- non_tensor_batch["uid"]: object [B], one id per prompt group (the same for the n samples of a prompt).
- non_tensor_batch["sample_index"]: int64 [B], index of the sample inside its group (0 … n−1).
- non_tensor_batch["data_source"]: object [B], the prompt's `data.reward_fn_key` column (verl's `data_source`) of a
  parquet file that has it, as verl-omni's dataset gives it; else the file (or "builtin") the prompt came from.
- non_tensor_batch["reward_model"], ["extra_info"]: object [B] of dicts, only when the prompt file has those
  columns (verl-style parquet: `reward_model.ground_truth` reaches the reward functions).
- meta_info["global_step"]: the global step the batch belongs to.

The prompts of each step are those verl-omni's training dataloader gives (`PromptStream`): an epoch is the prompts in
torchdata's RandomSampler order for `data.seed` (`epoch_order`), cut into full batches, the last partial batch
dropped (`drop_last=True`), so step s of a run gets the prompts verl-omni's step s gets for the same file and seed.

Where verl-omni is installed and the files are parquet, its own dataset code reads them (`verl_omni.utils.dataset.
rl_dataset.create_rl_dataset`: each row's `raw_prompt` chat and `data_source`) and its `create_rl_sampler` orders the
epochs (`VerlOmniPrompts`); elsewhere the same rules of this module do (`verl_omni_dataset_reason` says which).
A row's negative prompt chat (verl-omni's `data.negative_prompt_key` column) becomes its user text the same way
(`load_negative_prompts`); the run's config takes its one value (`config.verl_omni.build_negative_prompt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from verl import DataProto

from digenrl_verl.config.prompt_files import (  # noqa: F401  (data_sources: part of this module's API too)
    builtin_prompts, data_sources, prompt_paths, verl_omni_dataset_reason)
from digenrl_verl.workers.batch import EXTRA_COLUMNS


def load_prompts(files: str | Sequence[str] | None, prompt_key: str = "prompt", *, with_extras: bool = False,
                 key: str = "data.train_files", source_key: str = "data_source"):
    """(prompts, data_source per prompt) from text files (one prompt per line) or parquet files; errors name `key`
    (the setting the files came from). A parquet file's data source is its `source_key` column (verl-omni's
    `data.reward_fn_key`), where it has one; otherwise the file's name. Where `verl_omni_dataset_reason` allows,
    verl-omni's own dataset code reads the files (`_verl_omni_rows`; the prompts are then `VerlOmniPrompts`).

    With `with_extras`, also a dict per prompt holding its `reward_model` / `extra_info` columns (empty for
    text files and files without them)."""
    paths = prompt_paths(files)
    if paths is None:
        p = builtin_prompts()
        return (p, ["builtin"] * len(p), [{} for _ in p]) if with_extras else (p, ["builtin"] * len(p))
    for f in paths:
        if not Path(f).exists():
            raise ValueError(f"{key}: {f!r} does not exist; give a .txt (one prompt per line) or .parquet "
                             "file")
    read = _verl_omni_rows if verl_omni_dataset_reason(paths) is None else _our_rows
    prompts, sources, extras = read(paths, prompt_key, source_key)
    if not prompts:
        raise ValueError(f"{key}={files!r} holds no prompts")
    return (prompts, sources, extras) if with_extras else (prompts, sources)


def _prompt_text(value) -> str:
    """A prompt cell: a chat (list of messages) → its user text (`chat_text`); anything else → str."""
    return chat_text(value) if isinstance(value, (list, tuple, np.ndarray)) else str(value)


def _our_rows(paths: list[str], prompt_key: str, source_key: str):
    """(prompts, sources, extras) of the files by this module's rules."""
    prompts: list[str] = []
    sources: list[str] = []
    extras: list[dict] = []
    for f in paths:
        path = Path(f)
        if path.suffix == ".parquet":
            import pandas as pd

            df = pd.read_parquet(path)
            if prompt_key not in df.columns:
                raise ValueError(f"data.prompt_key={prompt_key!r} is not a column of {f}; columns: {list(df.columns)}")
            col = [_prompt_text(x) for x in df[prompt_key]]
            extras += [{c: _plain(row[c]) for c in EXTRA_COLUMNS if c in df.columns} for _, row in df.iterrows()]
            sources += [str(x) for x in df[source_key]] if source_key in df.columns else [path.name] * len(col)
        else:
            col = [line.strip() for line in path.read_text().splitlines() if line.strip()]
            extras += [{} for _ in col]
            sources += [path.name] * len(col)
        prompts += col
    return prompts, sources, extras


class VerlOmniPrompts(list):
    """Prompt texts read by verl-omni's dataset code, carrying that dataset: `PromptStream` orders their epochs with
    verl-omni's `create_rl_sampler` over it (`epoch_order`)."""

    def __init__(self, texts, dataset) -> None:
        super().__init__(texts)
        self.dataset = dataset
        self._orders: dict[tuple[int, bool], tuple[object, list]] = {}  # (seed, shuffle) -> (sampler, epochs)

    def epoch_order(self, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
        """The prompts' order in `epoch`: each epoch one pass of verl-omni's sampler for data.seed / data.shuffle
        (a new iterator per epoch, as the dataloader takes one)."""
        key = (int(seed), bool(shuffle))
        if key not in self._orders:
            self._orders[key] = (verl_omni_sampler(self.dataset, seed, shuffle), [])
        sampler, orders = self._orders[key]
        while len(orders) <= epoch:
            orders.append([int(i) for i in sampler])
        return orders[epoch]


#: the file verl's trainer writes its training dataloader's state to, in each `global_step_<k>/` (and reads back)
LOADER_STATE_FILE = "data.pt"


def verl_loader_state(prompts, batch_size: int, seed: int, shuffle: bool, workers: int, steps: int) -> dict | None:
    """What verl-omni's trainer saves as `global_step_<steps>/data.pt` (`train_dataloader.state_dict()`: verl's
    `StatefulDataLoader` over `create_rl_sampler`, `drop_last=True`, `data.dataloader_num_workers` = `workers`) after
    `steps` steps, so that its trainer resumes a checkpoint of this run at the next step's prompts; None where
    verl-omni's dataset did not read `prompts` (`VerlOmniPrompts`) or no step was taken.

    The same loader, sampler and epochs (a new iterator per epoch, as verl's `for batch in dataloader` loop takes one)
    over a stand-in dataset of the same length: the sampler's state depends on the length, the seed and the batches
    taken, not on the rows, so no row is read. Worker processes (the state is per worker when `workers` > 0) are
    forked as verl-omni's trainer forks its dataloader's, from the same process kind (its trainer's driver); they
    only index the stand-in (a forkserver re-imports the Ray worker's modules: 19-176 s for 8 workers here, against
    about 1.5 s forked)."""
    if not isinstance(prompts, VerlOmniPrompts) or steps <= 0 or len(prompts) < batch_size:
        return None
    from torchdata.stateful_dataloader import StatefulDataLoader

    rows = list(range(len(prompts)))
    loader = StatefulDataLoader(rows, batch_size=batch_size, drop_last=True, num_workers=workers, collate_fn=list,
                                sampler=verl_omni_sampler(rows, seed, shuffle))
    taken = 0
    while True:  # verl's epochs: `for batch in dataloader`, saved after the step's batch
        for _ in loader:
            taken += 1
            if taken == steps:
                return loader.state_dict()


def verl_omni_sampler(dataset, seed: int, shuffle: bool):
    """verl-omni's training sampler over `dataset` for data.seed / data.shuffle (`create_rl_sampler`)."""
    from omegaconf import OmegaConf
    from verl_omni.utils.dataset.rl_dataset import create_rl_sampler

    return create_rl_sampler(OmegaConf.create({"shuffle": bool(shuffle), "seed": int(seed)}), dataset)


def _verl_omni_rows(paths: list[str], prompt_key: str, source_key: str):
    """(prompts, sources, extras) of parquet files as verl-omni's `create_rl_dataset` gives the rows (no tokenizer
    or processor: `verl_omni_dataset_reason`); a file without the `source_key` column names its rows' source, as in
    `_our_rows`."""
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from verl_omni.utils.dataset.rl_dataset import create_rl_dataset

    schemas = {f: pq.read_schema(f).names for f in paths}
    for f, columns in schemas.items():
        if prompt_key not in columns:
            raise ValueError(f"data.prompt_key={prompt_key!r} is not a column of {f}; columns: {columns}")
    config = OmegaConf.create({"prompt_key": prompt_key, "filter_overlong_prompts": False})
    dataset = create_rl_dataset(list(paths), config, tokenizer=None, processor=None, is_train=True)
    # per row: its file's name where that file has no `source_key` column (concatenated, its rows hold None)
    names = [None if source_key in schemas[f] else Path(f).name
             for f in paths for _ in range(pq.read_metadata(f).num_rows)]
    columns = set(dataset.dataframe.column_names)
    prompts: list[str] = []
    sources: list[str] = []
    extras: list[dict] = []
    for i in range(len(dataset)):
        row = dataset[i]
        prompts.append(_prompt_text(row["raw_prompt"]))
        sources.append(str(row[source_key]) if names[i] is None else names[i])
        extras.append({c: _plain(row[c]) for c in EXTRA_COLUMNS if c in columns})
    return VerlOmniPrompts(prompts, dataset), sources, extras


def load_negative_prompts(files: str | Sequence[str] | None, negative_key: str = "negative_prompt",
                          prompt_key: str = "prompt", *, key: str = "data.train_files") -> dict[str, list[str] | None]:
    """{file: the negative prompt text of each of its rows, or None where the file has no `negative_key` column}
    (verl-omni's `data.negative_prompt_key`; {} for the built-in prompts, None for text files).

    verl-omni's dataset hands a row's `negative_key` chat to its agent loop as `raw_negative_prompt`, which renders
    it as it renders the prompt (`AgentLoopBase.apply_chat_template`) for the pipeline's true CFG. A chat becomes its
    user text here (`chat_text`), as a prompt does, so the pipeline's own template renders what verl-omni's agent
    loop renders (Qwen-Image: the OCR data's system turn + user `" "`). Where `verl_omni_dataset_reason` allows,
    verl-omni's dataset code reads the rows (`RLHFDataset.__getitem__`'s `raw_negative_prompt`). A null cell fails
    by name (verl-omni's dataset fails on it too)."""
    paths = prompt_paths(files)
    if paths is None:
        return {}
    import pyarrow.parquet as pq

    out: dict[str, list[str] | None] = {}
    for f in paths:
        if not Path(f).exists():
            raise ValueError(f"{key}: {f!r} does not exist; give a .txt (one prompt per line) or .parquet file")
        if Path(f).suffix != ".parquet" or negative_key not in pq.read_schema(f).names:
            out[f] = None
            continue
        column = pq.read_table(f, columns=[negative_key]).column(negative_key)
        if column.null_count:
            row = column.to_pylist().index(None)
            raise ValueError(f"{key}: row {row} of {f} has a null in the negative prompt column {negative_key!r} "
                             "(data.negative_prompt_key), which verl-omni's dataset fails on too; give every row a "
                             "negative prompt chat or drop the column")
        cells = _verl_omni_negatives(f, negative_key, prompt_key) if verl_omni_dataset_reason([f]) is None \
            else column.to_pylist()
        out[f] = [_prompt_text(c) for c in cells]
    return out


def _verl_omni_negatives(path: str, negative_key: str, prompt_key: str) -> list:
    """Each row's `raw_negative_prompt` as verl-omni's dataset gives it (`create_rl_dataset`, as `_verl_omni_rows`)."""
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from verl_omni.utils.dataset.rl_dataset import create_rl_dataset

    if prompt_key not in pq.read_schema(path).names:
        raise ValueError(f"data.prompt_key={prompt_key!r} is not a column of {path}")
    config = OmegaConf.create({"prompt_key": prompt_key, "negative_prompt_key": negative_key,
                               "filter_overlong_prompts": False})
    dataset = create_rl_dataset([path], config, tokenizer=None, processor=None, is_train=True)
    return [dataset[i]["raw_negative_prompt"] for i in range(len(dataset))]


def _plain(value):
    """parquet structs come back as dicts of numpy values; make them plain Python."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def chat_text(messages) -> str:
    """A verl-style chat prompt ([{role, content}, ...]) → the text our diffusers pipelines encode: the text of its
    user turns, concatenated as they are (no separator); system and assistant turns are left out.

    verl-omni renders the chat in its agent loop (`AgentLoopBase.apply_chat_template`, with
    `actor_rollout_ref.model.custom_chat_template` or the model tokenizer's template) and its rollout adapter encodes
    those ids. Its recipes' templates give the same ids as a diffusers pipeline given this text: SD3.5's template is
    the user turns' text (tokenized by the CLIP / T5 tokenizers of `model.extra_tokenizers`, as diffusers tokenizes
    the prompt); Wan2.2's is that text + `</s>` (diffusers' Wan appends the same end token); Qwen-Image's is the
    tokenizer's chat template around the recipe data's system turn (Qwen-Image's own "Describe the image ..."
    prompt) and the user turn, the very string `QwenImagePipeline.encode_prompt` builds around the user text, with the
    same 34 leading tokens dropped. `tests/verl_omni/test_verl_omni_prompts.py` checks these on the real verl-omni.
    A content given as parts ([{type: text, text}, ...]) contributes its text parts."""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, (list, tuple, np.ndarray)):
            parts += [str(c.get("text") or "") for c in content if isinstance(c, dict) and c.get("type") == "text"]
        elif content is not None:
            parts.append(str(content))
    return "".join(parts)


_PERMS: dict[tuple[int, int], tuple[object, list]] = {}  # (prompts, seed) -> (generator, the epochs' orders so far)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order of `n` prompts in `epoch` as verl's training sampler gives it (`verl.trainer.ppo.utils.
    create_rl_sampler`, called by verl-omni's `create_rl_sampler`): with `data.shuffle`, torchdata's RandomSampler
    over one torch.Generator seeded with `data.seed`, each epoch the next `torch.randperm(n)` of it; else in file
    order (SequentialSampler)."""
    if not shuffle:
        return list(range(n))
    import torch

    key = (n, int(seed))
    if key not in _PERMS:
        _PERMS.clear()  # one stream at a time: the orders of the run's prompts and seed
        _PERMS[key] = (torch.Generator().manual_seed(int(seed)), [])
    generator, perms = _PERMS[key]
    while len(perms) <= epoch:
        perms.append(torch.randperm(n, generator=generator).numpy())
    return perms[epoch].tolist()


@dataclass
class PromptStream:
    """Deterministic prompt batches, as verl-omni's training dataloader gives them (`StatefulDataLoader` with
    `drop_last=True` over verl's sampler): each epoch is `epoch_order` cut into full batches of `batch_size`, the
    last partial batch dropped (its prompts wait for a later epoch's order). The cursor counts the prompts consumed
    over all epochs (step s starts at s x batch_size) and is checkpointable."""

    prompts: list[str]
    sources: list[str]
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    cursor: int = 0  # prompts consumed so far (over all epochs)

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(f"data.train_batch_size must be positive, got {self.batch_size}")
        if self.steps_per_epoch < 1:
            raise ValueError(f"data.train_batch_size={self.batch_size} is larger than the {len(self.prompts)} "
                             "prompts: an epoch has no full batch (verl-omni's dataloader drops the partial one); "
                             "lower data.train_batch_size or give more prompts")

    @property
    def steps_per_epoch(self) -> int:
        """Full batches per epoch (verl's `len(train_dataloader)` with drop_last)."""
        return len(self.prompts) // self.batch_size

    @property
    def reader(self) -> str:
        """Whose code read the prompts and orders the epochs: "verl-omni" (its dataset and sampler) or "digenrl"."""
        return "verl-omni" if isinstance(self.prompts, VerlOmniPrompts) else "digenrl"

    def epoch_order(self, epoch: int) -> list[int]:
        """The prompts' order in `epoch`: verl-omni's sampler over its dataset, or the same rule (`epoch_order`)."""
        if isinstance(self.prompts, VerlOmniPrompts):
            return self.prompts.epoch_order(self.seed, epoch, self.shuffle)
        return epoch_order(len(self.prompts), self.seed, epoch, self.shuffle)

    def next_indices(self) -> list[tuple[int, int]]:
        """(stream position, index into `prompts`) of the next step's prompts; advances the cursor."""
        out = []
        orders: dict[int, list[int]] = {}
        for _ in range(self.batch_size):
            step, offset = divmod(self.cursor, self.batch_size)
            epoch, k = divmod(step, self.steps_per_epoch)
            if epoch not in orders:
                orders[epoch] = self.epoch_order(epoch)
            out.append((self.cursor, orders[epoch][k * self.batch_size + offset]))
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
