"""One real disaggregated step on Ray with a tiny random Qwen2.5-VL judge as the reward (verl-omni's
`reward.reward_model.enable=True` OCR recipe keys): the judge is loaded and run inside the generator worker."""

from __future__ import annotations

import json
import math

import pytest
import ray

from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.trainer.runner import DigenRLTrainer

pytestmark = pytest.mark.slow  # starts Ray workers and trains a step


def _judge_of(worker) -> tuple[str, int]:
    """(class name of the generator's judge reward, its model's parameter count), read inside the worker."""
    def probe(self):
        judge = self.scorer.components["genrm_ocr"][0]
        return type(judge).__name__, sum(p.numel() for p in judge.judge.model.parameters())

    return ray.get(worker.__ray_call__.remote(probe))


def test_one_disaggregated_step_scores_with_the_tiny_judge_in_the_generator(ray_session, tmp_path, judge_step_run):
    spec = judge_step_run("reward.reward_model.rollout.tensor_model_parallel_size=1")  # > 1: colocated replicas
    assert spec.reward.reward_model.pool is None
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
    assert len(steps) == 1 and steps[0][M["reward_nonfinite"]] == 0
    assert math.isfinite(steps[0][M["reward_mean"]]) and 0.0 <= steps[0][M["reward_mean"]] <= 1.0
