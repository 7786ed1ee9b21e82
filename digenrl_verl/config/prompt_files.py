"""Which prompt files a run reads and who reads them: what the config needs of `data.train_files` / `data.val_files`
before anything is loaded (the plan's reader decision, the data sources the reward config checks), below the
trainer, which loads the prompts (`trainer.data`). Only file names, parquet schemas and one column are read here;
verl-omni is found, never imported."""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path
from typing import Sequence


def builtin_prompts() -> list[str]:
    text = resources.files("digenrl_verl.data").joinpath("prompts.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


def prompt_paths(files) -> list[str] | None:
    """The files of `data.train_files` / `data.val_files` as a list; None for the built-in prompts."""
    if files is None or (not isinstance(files, str) and len(files) == 0):
        return None
    return [files] if isinstance(files, str) else [str(f) for f in files]


# columns verl's RLHFDataset hands to the model's processor (its default image_key / video_key / audio_key)
MULTIMODAL_COLUMNS = ("images", "videos", "audios")


def verl_omni_dataset_reason(files) -> str | None:
    """Why `files` are not read by verl-omni's own dataset code; None when they are: verl-omni is installed (found,
    not imported) and every file is parquet, without the image / video / audio columns verl's dataset can only hand
    to a processor (prompts are text here).

    What verl-omni's `create_rl_dataset` needs besides the files: its TaskRunner passes a tokenizer and a processor
    built from the model path (verl's `hf_tokenizer` / `hf_processor`), but the dataset reads the tokenizer only to
    filter overlong prompts (`data.filter_overlong_prompts`, refused here) and the processor only for rows with
    those columns, so none is built and the rows are the same."""
    paths = prompt_paths(files)
    if paths is None:
        return "the built-in prompts"
    other = [f for f in paths if Path(f).suffix != ".parquet"]
    if other:
        return f"{other[0]} is not parquet, which verl-omni's dataset reads"
    try:
        if importlib.util.find_spec("verl_omni") is None:
            return "verl_omni is not installed"
    except (ImportError, ValueError) as e:
        return f"verl_omni is not importable ({e})"
    import pyarrow.parquet as pq

    for f in paths:
        if not Path(f).exists():
            return f"{f} does not exist"
        media = [c for c in MULTIMODAL_COLUMNS if c in pq.read_schema(f).names]
        if media:
            return f"{f} has {media} columns, which verl-omni's dataset hands to the model's processor"
    return None


def prompt_reader_decision(files, key: str = "data.train_files") -> str:
    """The plan's line on who reads the prompts of `files` (`verl_omni_dataset_reason`)."""
    why = verl_omni_dataset_reason(files)
    if why is None:
        return (f"{key}: read by verl-omni's own dataset code (create_rl_dataset: each row's raw_prompt chat becomes "
                "its user text, data.reward_fn_key its data_source; the epoch order from its create_rl_sampler for "
                "data.seed / data.shuffle)")
    return (f"{key}: read by this package's rules ({why}): the prompts, data sources and order verl-omni's dataset "
            "code gives a parquet file")


def data_sources(files: str | Sequence[str] | None, source_key: str = "data_source") -> tuple[dict[str, int], int]:
    """({data_source: prompts} of the files' `source_key` column (verl-omni's `data.reward_fn_key`), prompts without
    one): only the column is read; text files, the built-in prompts and parquet files without the column have none
    (`load_prompts` names those by their file). Missing files are left to `load_prompts`' error."""
    counts: dict[str, int] = {}
    without = 0
    paths = prompt_paths(files)
    if paths is None:
        return counts, len(builtin_prompts())
    for f in paths:
        path = Path(f)
        if not path.exists():
            continue
        if path.suffix != ".parquet":
            without += sum(1 for line in path.read_text().splitlines() if line.strip())
            continue
        import pyarrow.parquet as pq

        if source_key not in pq.read_schema(path).names:
            without += pq.read_metadata(path).num_rows
            continue
        for value in pq.read_table(path, columns=[source_key]).column(source_key).to_pylist():
            counts[str(value)] = counts.get(str(value), 0) + 1
    return counts, without
