"""Fixtures for the judge's one-step Ray runs: the tiny FLUX policy, a tiny random Qwen2.5-VL judge, two OCR prompts
and verl-omni's OCR reward keys, built into a run spec."""

from __future__ import annotations

import warnings

import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.models.tiny import build_tiny_model_dir
from digenrl_verl.rewards.tiny_judge import build_tiny_judge_dir
from digenrl_verl.trainer.config import build_run

GENRM = "/verl-omni/verl_omni/utils/reward_score/genrm_ocr.py"  # verl-omni's file, as its scripts name it


@pytest.fixture
def judge_step_run(tmp_path, monkeypatch):
    """judge_step_run(*overrides) -> the run spec of one disaggregated step (2 prompts x n=2) scored by the tiny judge
    (`reward.reward_model.rollout.name=vllm`, which falls back to transformers on CPU: warned, tested by the fast
    tier); outputs under tmp_path / "run"."""
    flux = build_tiny_model_dir("FluxPipeline", tmp_path / "flux", seed=0)
    judge = build_tiny_judge_dir(tmp_path / "judge", "qwen2_5_vl", seed=0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('a shop sign that reads "OPEN"\na poster with the word "SALE"\n')
    monkeypatch.setenv("GENRM_OCR_MAX_TOKENS", "4")  # verl-omni's override of the judge's 4096 new tokens

    def build(*overrides: str):
        cfg = compose([TINY_CPU,
            f"actor_rollout_ref.model.path={flux}", "trainer.digenrl.mode=disaggregated", f"data.train_files={prompts}",
            "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=1",
            f"trainer.digenrl.output_dir={tmp_path / 'run'}", "trainer.logger=[console]",
            "reward.reward_model.enable=True", f"reward.reward_model.model_path={judge}",
            "reward.reward_model.rollout.name=vllm", f"reward.custom_reward_function.path={GENRM}",
            "reward.custom_reward_function.name=compute_score_ocr", *overrides,
        ])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return build_run(cfg)

    return build
