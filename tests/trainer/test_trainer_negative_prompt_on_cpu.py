"""verl-omni's per-row negative prompt (issue 30): its dataset hands a row's `data.negative_prompt_key` chat
(default column `negative_prompt`; Qwen-Image's OCR data: system turn + user `" "`) to its agent loop, which renders it
for true CFG. The run's config reads the column, takes the chat's user text as the one negative prompt of the run
(the pipeline's template renders it as verl-omni renders the chat: tests/verl_omni/test_verl_omni_negative_prompt.py),
says so in the plan, and refuses, before any worker starts, files whose rows differ when CFG is on. Files without the
column keep `actor_rollout_ref.rollout.pipeline.negative_prompt`.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.data import load_negative_prompts

A = "actor_rollout_ref"
KEY = f"{A}.rollout.pipeline.negative_prompt"
SYSTEM = "Describe the image by detailing the color, shape, size:"
CFG = f"{A}.rollout.pipeline.true_cfg_scale=4.0"  # FLUX's true CFG: its negative prompt is encoded


def _chat(user: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _parquet(path, negatives=None, n: int = 8):
    """verl-omni's OCR layout (data_process/qwenimage_ocr.py; a data source the default reward scores): a chat prompt
    per row, and a `negative_prompt` chat per row when `negatives` (one user text per row, or one for all) is given."""
    frame = {"data_source": ["jpeg_compressibility"] * n,
             "prompt": [_chat(f'a sign that reads "{i}"') for i in range(n)]}
    if negatives is not None:
        texts = [negatives] * n if isinstance(negatives, str) else list(negatives)
        frame["negative_prompt"] = [_chat(t) for t in texts]
    pd.DataFrame(frame).to_parquet(path)
    return str(path)


def _build(model_dir, train, *overrides):
    return build_run(compose([TINY_CPU, f"{A}.model.path={model_dir}", f"data.train_files={train}", *overrides]))


def _line(spec) -> str:
    (line,) = [d for d in spec.decisions if d.startswith("negative prompt:")]
    return line


def test_the_column_gives_the_runs_negative_prompt_and_the_plan_says_so(tiny_flux_dir, tmp_path):
    spec = _build(tiny_flux_dir, _parquet(tmp_path / "train.parquet", " "), CFG)
    assert spec.policy.pipeline.negative_prompt == " "  # the user text of the row's chat, not the key's ""
    assert "'negative_prompt' chat" in _line(spec) and "train.parquet" in _line(spec)
    plan = json.loads(spec.write_plan(tmp_path / "plan.json").read_text())  # what the dry run writes
    assert plan["config"][KEY] == " " and plan["config"]["data.negative_prompt_key"] == "negative_prompt"
    assert _line(spec) in plan["decisions"]


def test_rows_that_differ_are_refused_by_column_with_the_fix(tiny_flux_dir, tmp_path):
    train = _parquet(tmp_path / "train.parquet", [" ", "blurry"] * 4)
    with pytest.raises(ValueError) as e:
        _build(tiny_flux_dir, train, CFG)
    msg = str(e.value)
    assert msg.startswith("data.negative_prompt_key='negative_prompt': the rows' negative prompts differ")
    assert "2 distinct" in msg and "the same 'negative_prompt' chat" in msg and "drop the column" in msg


def test_rows_that_differ_are_accepted_when_no_negative_prompt_is_encoded(tiny_flux_dir, tmp_path):
    train = _parquet(tmp_path / "train.parquet", [" ", "blurry"] * 4)
    spec = _build(tiny_flux_dir, train, f"{A}.rollout.pipeline.true_cfg_scale=1.0")
    assert spec.policy.pipeline.negative_prompt == "" and "is not used" in _line(spec)


def test_validation_files_without_the_column_are_refused_when_they_are_sampled(tiny_flux_dir, tmp_path):
    train = _parquet(tmp_path / "train.parquet", " ")
    val = _parquet(tmp_path / "val.parquet")
    with pytest.raises(ValueError, match=r"no such column in \['data.val_files: .*val.parquet'\]"):
        _build(tiny_flux_dir, train, CFG, f"data.val_files={val}", "trainer.test_freq=1")
    assert _build(tiny_flux_dir, train, CFG, f"data.val_files={val}").policy.pipeline.negative_prompt == " "


def test_the_key_and_the_column_must_agree(tiny_flux_dir, tmp_path):
    train = _parquet(tmp_path / "train.parquet", " ")
    with pytest.raises(ValueError, match=rf"{KEY}='blurry' and the prompt files' 'negative_prompt' column"):
        _build(tiny_flux_dir, train, CFG, f"{KEY}=blurry")
    assert _build(tiny_flux_dir, train, CFG, f"{KEY}=' '").policy.pipeline.negative_prompt == " "


def test_without_the_column_the_key_is_used_as_before(tiny_flux_dir, tmp_path):
    spec = _build(tiny_flux_dir, _parquet(tmp_path / "train.parquet"), CFG, f"{KEY}=blurry")
    assert spec.policy.pipeline.negative_prompt == "blurry"
    assert _line(spec) == f"negative prompt: {KEY}='blurry' (no prompt file has a 'negative_prompt' column, " \
                          "data.negative_prompt_key)"
    assert build_run(compose([TINY_CPU, f"{A}.model.path={tiny_flux_dir}"])).policy.pipeline.negative_prompt == ""


def test_another_column_by_verl_omnis_key(tiny_flux_dir, tmp_path):
    path = tmp_path / "train.parquet"
    frame = pd.read_parquet(_parquet(path, "low quality")).rename(columns={"negative_prompt": "neg"})
    frame.to_parquet(path)
    assert load_negative_prompts(str(path), "neg") == {str(path): ["low quality"] * 8}
    assert load_negative_prompts(str(path)) == {str(path): None}
    spec = _build(tiny_flux_dir, str(path), CFG, "+data.negative_prompt_key=neg")
    assert spec.policy.pipeline.negative_prompt == "low quality"


def test_a_null_cell_is_refused_by_row(tmp_path):
    path = tmp_path / "train.parquet"
    frame = pd.read_parquet(_parquet(path, " "))
    frame.loc[3, "negative_prompt"] = None
    frame.to_parquet(path)
    with pytest.raises(ValueError, match=r"row 3 of .*train.parquet has a null in the negative prompt column"):
        load_negative_prompts(str(path))
