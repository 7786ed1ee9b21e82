"""Prompts as verl-omni's training data gives them (issue 21, part 3): a chat prompt's user text (what its recipes'
chat templates render, `chat_text`), each epoch in verl's sampler order for data.seed with the last partial batch
dropped (`PromptStream`), and the data sources of the files (`data_sources`). The comparison with verl-omni's own code
on the real verl-omni: tests/verl_omni/test_verl_omni_prompts.py."""

from __future__ import annotations

import pandas as pd
import pytest

from digenrl_verl.trainer.data import PromptStream, chat_text, data_sources, epoch_order, load_prompts

SYSTEM = "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of " \
         "the objects and background:"


def test_a_chat_prompt_is_its_user_text_without_the_system_turn(tmp_path):
    """verl-omni's Qwen-Image OCR data carries the system turn, which the pipeline's own template supplies; SD3.5's and
    Wan's recipe templates keep the user turns only, concatenated (mutation: joining every turn with a space fails)."""
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": 'A sign that reads "OPEN"'}]
    assert chat_text(chat) == 'A sign that reads "OPEN"'
    two = [{"role": "user", "content": "a cat "}, {"role": "assistant", "content": "x"},
           {"role": "user", "content": [{"type": "text", "text": "on a mat"}, {"type": "image"}]}]
    assert chat_text(two) == "a cat on a mat"
    pd.DataFrame({"prompt": [chat]}).to_parquet(tmp_path / "p.parquet")  # through parquet: numpy arrays of dicts
    assert load_prompts(str(tmp_path / "p.parquet"))[0] == ['A sign that reads "OPEN"']


def _verl_batches(n: int, batch: int, seed: int, shuffle: bool, epochs: int) -> list[list[int]]:
    """verl's own training dataloader over n items: its sampler (verl.trainer.ppo.utils.create_rl_sampler, which
    verl-omni's create_rl_sampler calls without a custom sampler) in a StatefulDataLoader with drop_last=True, as
    verl-omni's trainers build it."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler

    items = list(range(n))
    sampler = create_rl_sampler(OmegaConf.create({"shuffle": shuffle, "seed": seed}), items)
    loader = StatefulDataLoader(dataset=items, batch_size=batch, num_workers=0, drop_last=True,
                                collate_fn=lambda rows: rows, sampler=sampler)
    return [b for _ in range(epochs) for b in loader]


@pytest.mark.parametrize("n,batch,seed,shuffle", [(11, 3, 7, True), (8, 4, 0, True), (10, 4, 42, False)])
def test_each_step_gets_the_prompts_of_verls_dataloader(n, batch, seed, shuffle):
    """Step s takes verl's batch s: torchdata's RandomSampler order for data.seed, each epoch's partial batch dropped
    (mutations: wrapping the partial batch into the next epoch, or Python's random order, fail)."""
    theirs = _verl_batches(n, batch, seed, shuffle, epochs=4)
    stream = PromptStream([str(i) for i in range(n)], ["s"] * n, batch, seed=seed, shuffle=shuffle)
    assert stream.steps_per_epoch == n // batch
    assert [[int(p) for p in stream.next_batch()[0]] for _ in theirs] == theirs
    # a stream restarted at a step's cursor (the runner's, and a resume's) gives the same batches
    again = PromptStream([str(i) for i in range(n)], ["s"] * n, batch, seed=seed, shuffle=shuffle, cursor=5 * batch)
    assert [int(p) for p in again.next_batch()[0]] == theirs[5]
    assert epoch_order(n, seed, 1, shuffle) == epoch_order(n, seed, 1, shuffle)


def test_a_batch_larger_than_the_prompts_names_the_key():
    with pytest.raises(ValueError, match="data.train_batch_size=5 is larger than the 4 prompts"):
        PromptStream(["a", "b", "c", "d"], ["s"] * 4, batch_size=5)


def test_data_sources_counts_the_column_and_the_prompts_without_one(tmp_path):
    pd.DataFrame({"prompt": ["a", "b", "c"], "data_source": ["ocr", "jpeg_compressibility", "ocr"],
                  "kind": ["x", "x", "y"]}).to_parquet(tmp_path / "p.parquet")
    pd.DataFrame({"prompt": ["d"]}).to_parquet(tmp_path / "q.parquet")
    (tmp_path / "t.txt").write_text("e\n\nf\n")
    files = [str(tmp_path / f) for f in ("p.parquet", "q.parquet", "t.txt")]
    assert data_sources(files) == ({"ocr": 2, "jpeg_compressibility": 1}, 3)
    assert data_sources(str(tmp_path / "p.parquet"), "kind") == ({"x": 2, "y": 1}, 0)
    assert data_sources(None) == ({}, 8)  # the built-in prompts


def test_without_verl_omni_the_packages_rules_read_the_prompts_and_the_plan_says_so(tmp_path, monkeypatch):
    """The fall-back where verl-omni is not installed (or the files are not parquet): our rules read the prompts
    (`reader` "digenrl"), and the plan's decision line says why; with verl-omni installed, its dataset code reads a
    parquet file instead (tests/verl_omni/test_verl_omni_dataset_runtime.py)."""
    import importlib.util

    from omegaconf import OmegaConf

    from digenrl_verl.config.verl_omni import RecipeKeys, build_data
    from digenrl_verl.trainer.data import verl_omni_dataset_reason

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # as where verl-omni is not installed
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a red fox"}]
    pd.DataFrame({"prompt": [chat] * 4, "data_source": ["ocr"] * 4}).to_parquet(tmp_path / "p.parquet")
    (tmp_path / "t.txt").write_text("a\nb\n")
    path = str(tmp_path / "p.parquet")
    assert verl_omni_dataset_reason(path) == "verl_omni is not installed"
    assert verl_omni_dataset_reason([path, str(tmp_path / "t.txt")]).endswith("t.txt is not parquet, which "
                                                                             "verl-omni's dataset reads")
    assert verl_omni_dataset_reason(None) == "the built-in prompts"
    prompts, sources = load_prompts(path)
    assert (prompts, sources) == (["a red fox"] * 4, ["ocr"] * 4)
    assert PromptStream(prompts, sources, 2).reader == "digenrl"
    keys = RecipeKeys(OmegaConf.create({"data": {"train_files": path, "prompt_key": "prompt", "seed": 1,
                                                 "shuffle": True, "val_files": None, "val_max_samples": -1,
                                                 "reward_fn_key": "data_source"}}))
    build_data(keys)
    [line] = [d for d in keys.decisions if d.startswith("data.train_files: ")]
    assert "this package's rules (verl_omni is not installed)" in line


def test_multimodal_columns_keep_the_packages_rules(tmp_path, monkeypatch):
    """verl's dataset hands an `images` column to the model's processor (none is built here): such files keep our
    rules, which read the prompt text only, even where verl-omni is installed."""
    import importlib.util

    from digenrl_verl.trainer.data import verl_omni_dataset_reason

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # as where verl-omni is installed
    pd.DataFrame({"prompt": ["a"], "images": [[b"x"]]}).to_parquet(tmp_path / "p.parquet")
    pd.DataFrame({"prompt": ["a"]}).to_parquet(tmp_path / "q.parquet")
    assert "has ['images'] columns" in verl_omni_dataset_reason(str(tmp_path / "p.parquet"))
    assert verl_omni_dataset_reason(str(tmp_path / "q.parquet")) is None
