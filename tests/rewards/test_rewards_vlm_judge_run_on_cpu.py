"""One real disaggregated step on Ray with a tiny random Qwen2.5-VL judge as the reward (verl-omni's
`reward.reward_model.enable=True` OCR recipe keys): the judge is loaded and run inside the generator worker."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import ray

from digenrl_verl.main import compose
from digenrl_verl.models.tiny import build_tiny_model_dir
from digenrl_verl.rewards.tiny_judge import build_tiny_judge_dir
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.runner import DigenRLTrainer

pytestmark = pytest.mark.slow  # starts Ray workers and trains a step

GENRM = "/verl-omni/verl_omni/utils/reward_score/genrm_ocr.py"  # verl-omni's file, as its scripts name it


def _judge_of(worker) -> tuple[str, int]:
    """(class name of the generator's judge reward, its model's parameter count), read inside the worker."""
    def probe(self):
        judge = self.scorer.components["genrm_ocr"][0]
        return type(judge).__name__, sum(p.numel() for p in judge.judge.model.parameters())

    return ray.get(worker.__ray_call__.remote(probe))


def test_one_disaggregated_step_scores_with_the_tiny_judge_in_the_generator(ray_session, tmp_path, monkeypatch):
    flux = build_tiny_model_dir("FluxPipeline", tmp_path / "flux", seed=0)
    judge = build_tiny_judge_dir(tmp_path / "judge", "qwen2_5_vl", seed=0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('a shop sign that reads "OPEN"\na poster with the word "SALE"\n')
    monkeypatch.setenv("GENRM_OCR_MAX_TOKENS", "4")  # verl-omni's override of the judge's 4096 new tokens
    cfg = compose([
        f"actor_rollout_ref.model.path={flux}", "trainer.digenrl.mode=disaggregated", f"data.train_files={prompts}",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=1",
        f"trainer.digenrl.output_dir={tmp_path / 'run'}", "trainer.logger=[console]",
        "reward.reward_model.enable=True", f"reward.reward_model.model_path={judge}",
        "reward.reward_model.rollout.name=vllm", f"reward.custom_reward_function.path={GENRM}",
        "reward.custom_reward_function.name=compute_score_ocr",
    ])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        spec = build_run(cfg)
    assert spec.reward.weights() == {"genrm_ocr": 1.0} and spec.reward.reward_model.max_new_tokens == 4
    trainer = DigenRLTrainer(spec)
    try:
        summary = trainer.fit()
        generator = trainer.workers["gen:0"]
        kind, params = _judge_of(generator)
        stats = ray.get([w.checksum.remote() for w in trainer.workers.values()])
    finally:
        trainer.shutdown()
    assert kind == "VLMJudgeReward" and 0 < params < 100_000
    assert summary["steps"] == 1 and summary["samples"] == 4
    assert [s["version"] for s in stats] == [1, 1] and len({s["checksum"] for s in stats}) == 1
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [row for row in map(json.loads, lines) if "summary" not in row]  # one row per step, then the summary
    assert len(steps) == 1 and steps[0]["reward/nonfinite_samples"] == 0
    assert math.isfinite(steps[0]["reward/mean"]) and 0.0 <= steps[0]["reward/mean"] <= 1.0
