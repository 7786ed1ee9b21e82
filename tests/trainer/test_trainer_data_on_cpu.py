"""Prompt sources and the deterministic, resumable prompt stream."""

import pandas as pd
import pytest

from digenrl_verl.trainer.data import PromptStream, builtin_prompts, load_prompts


def test_text_and_parquet_files(tmp_path):
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    pd.DataFrame({"prompt": ["three", "four"]}).to_parquet(tmp_path / "p.parquet")
    prompts, sources = load_prompts([str(tmp_path / "p.txt"), str(tmp_path / "p.parquet")])
    assert prompts == ["one", "two", "three", "four"]
    assert sources == ["p.txt", "p.txt", "p.parquet", "p.parquet"]


def test_missing_file_and_bad_prompt_key_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="data.train_files"):
        load_prompts(str(tmp_path / "nope.txt"))
    pd.DataFrame({"text": ["x"]}).to_parquet(tmp_path / "p.parquet")
    with pytest.raises(ValueError, match="data.prompt_key"):
        load_prompts(str(tmp_path / "p.parquet"))


def test_stream_is_deterministic_and_resumes_from_its_cursor():
    prompts = builtin_prompts()
    a = PromptStream(prompts, ["b"] * len(prompts), batch_size=3, seed=5)
    first = [a.next_batch()[0] for _ in range(5)]  # crosses an epoch boundary
    b = PromptStream(prompts, ["b"] * len(prompts), batch_size=3, seed=5)
    b.next_batch(), b.next_batch()
    c = PromptStream(prompts, ["b"] * len(prompts), batch_size=3, seed=5, cursor=b.cursor)
    assert [c.next_batch()[0] for _ in range(3)] == first[2:]
    # every prompt appears once per epoch
    assert sorted(sum(first, [])[: len(prompts)]) == sorted(prompts)
