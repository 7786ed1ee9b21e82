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


def test_a_parquet_data_source_column_is_the_data_source_as_in_verl_omni(tmp_path):
    """verl-omni's dataset gives each row its `data_source` column (`data.reward_fn_key`), which routes the reward;
    a file without the column (or a text file) is named by its file."""
    pd.DataFrame({"prompt": ["a", "b"], "data_source": ["ocr", "jpeg_compressibility"],
                  "kind": ["x", "y"]}).to_parquet(tmp_path / "p.parquet")
    pd.DataFrame({"prompt": ["c"]}).to_parquet(tmp_path / "q.parquet")
    assert load_prompts([str(tmp_path / "p.parquet"), str(tmp_path / "q.parquet")])[1] == \
        ["ocr", "jpeg_compressibility", "q.parquet"]
    assert load_prompts(str(tmp_path / "p.parquet"), source_key="kind")[1] == ["x", "y"]


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
    # an epoch is 8 // 3 = 2 full batches of distinct prompts; the partial one is dropped
    for epoch in (first[0:2], first[2:4]):
        assert len(set(sum(epoch, []))) == 6


def test_parquet_reward_model_and_extra_info_reach_the_step_batch(tmp_path):
    from digenrl_verl.trainer.data import make_step_batch

    pd.DataFrame({"prompt": [[{"role": "user", "content": "a cat"}], [{"role": "user", "content": "a dog"}]],
                  "reward_model": [{"ground_truth": "CAT"}, {"ground_truth": "DOG"}],
                  "extra_info": [{"index": 0}, {"index": 1}]}).to_parquet(tmp_path / "p.parquet")
    prompts, sources, extras = load_prompts(str(tmp_path / "p.parquet"), with_extras=True)
    assert prompts == ["a cat", "a dog"]
    assert extras == [{"reward_model": {"ground_truth": "CAT"}, "extra_info": {"index": 0}},
                      {"reward_model": {"ground_truth": "DOG"}, "extra_info": {"index": 1}}]
    b = make_step_batch(prompts, sources, [0, 1], n=2, step=0, extras=extras)
    assert [r["ground_truth"] for r in b.non_tensor_batch["reward_model"]] == ["CAT", "CAT", "DOG", "DOG"]
    text = tmp_path / "p.txt"
    text.write_text("x\n")
    assert load_prompts(str(text), with_extras=True)[2] == [{}]
