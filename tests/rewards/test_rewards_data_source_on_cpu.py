"""verl-omni's default reward routed by data_source (issue 21, part 3): with no reward function and no custom file,
a prompt's data_source picks its scorer as verl-omni's default_compute_score_image does; a source it cannot score
fails before any worker starts, naming the source and the fix. Checked against verl-omni's own dispatch in
tests/verl_omni/test_verl_omni_prompts.py."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.rewards.data_source import DEFAULT_SCORERS, default_reward
from digenrl_verl.trainer.config import build_run


def test_the_table_routes_jpeg_compressibility_and_nothing_else():
    assert DEFAULT_SCORERS == {"jpeg_compressibility": "jpeg_compressibility"}
    weights, line = default_reward({"jpeg_compressibility": 3}, 0)
    assert weights == {"jpeg_compressibility": 1.0} and "'jpeg_compressibility' (3) -> jpeg_compressibility" in line
    weights, line = default_reward({}, 8)  # the built-in prompts: no data_source
    assert weights == {"jpeg_compressibility": 1.0} and "8 prompt(s) without a 'data_source' column" in line
    with pytest.raises(ValueError, match=r"data_source 'flow_grpo/ocr' \(2 prompt\(s\)\).*reward.reward_functions"):
        default_reward({"flow_grpo/ocr": 2, "jpeg_compressibility": 1}, 0)


def _build(model_dir, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model_dir}", *overrides]))


@pytest.fixture(scope="module")
def tiny_flux_dir(tmp_path_factory):
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir("FluxPipeline", tmp_path_factory.mktemp("models") / "tiny_flux", seed=0)


def test_a_source_without_a_default_scorer_fails_the_run_before_any_worker(tiny_flux_dir, tmp_path):
    """verl-omni's Qwen-Image OCR data (data_source flow_grpo/ocr) with the default reward: verl-omni would raise
    NotImplementedError at its first scored sample; here build_run refuses it (mutation: the old fixed default,
    jpeg_compressibility for every prompt, builds the run)."""
    ocr = tmp_path / "ocr.parquet"
    pd.DataFrame({"prompt": [f"p{i}" for i in range(8)], "data_source": ["flow_grpo/ocr"] * 8}).to_parquet(ocr)
    with pytest.raises(ValueError, match=r"data.train_files: data_source 'flow_grpo/ocr' \(8 prompt\(s\)\)"):
        _build(tiny_flux_dir, f"data.train_files={ocr}")
    # a reward function set: the data source routes nothing
    assert _build(tiny_flux_dir, f"data.train_files={ocr}", "reward.reward_functions={brightness: 1.0}").reward \
        .weights() == {"brightness": 1.0}
    jpeg = tmp_path / "jpeg.parquet"
    pd.DataFrame({"prompt": [f"p{i}" for i in range(8)], "data_source": ["jpeg_compressibility"] * 8}).to_parquet(jpeg)
    spec = _build(tiny_flux_dir, f"data.train_files={jpeg}")
    assert spec.reward.weights() == {"jpeg_compressibility": 1.0}
    assert any("routed by data_source" in d and "'jpeg_compressibility' (8)" in d for d in spec.decisions)
    # validation prompts are scored too: their sources are checked when validation runs
    with pytest.raises(ValueError, match="data.val_files: data_source 'flow_grpo/ocr'"):
        _build(tiny_flux_dir, f"data.train_files={jpeg}", f"data.val_files={ocr}", "trainer.val_before_train=true")
    assert _build(tiny_flux_dir, f"data.train_files={jpeg}", f"data.val_files={ocr}").reward.weights() == \
        {"jpeg_compressibility": 1.0}
