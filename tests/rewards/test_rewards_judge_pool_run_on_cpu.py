"""One real disaggregated step on Ray with the VLM judge in its own pool (verl-omni's
`reward.reward_model.enable_resource_pool=True`, `nnodes=1`, `n_gpus_per_node=2`: two judge replicas), a tiny random
Qwen2.5-VL judge: the generators score by sending the decoded images to the judge actors, which hold the model."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
import ray
from ray.exceptions import RayActorError

from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.trainer.ray_executor import _raises
from digenrl_verl.trainer.runner import DigenRLTrainer
from digenrl_verl.workers.judge import RemoteJudge, colocated_options

pytestmark = pytest.mark.slow  # starts Ray workers and a judge pool, trains a step


def _scorer_judge(worker) -> tuple[str, int, bool, int]:
    """(class of the generator's judge backend, its judge actors, whether it holds a judge model, the generator's
    pid), read inside the generator worker."""
    def probe(self):
        judge = self.scorer.components["genrm_ocr"][0].judge
        return type(judge).__name__, len(judge.actors), hasattr(judge, "model"), os.getpid()

    return ray.get(worker.__ray_call__.remote(probe))


def _one_step(spec, inspect):
    """Train the spec's one step; before the shutdown: what the generator's judge is (`_scorer_judge`), what each
    judge replica judged, and `inspect(trainer)`. (trainer, summary, those three)."""
    trainer = DigenRLTrainer(spec)
    try:
        summary = trainer.fit()
        return trainer, summary, _scorer_judge(trainer.workers["gen:0"]), trainer.judge_pool.stats(), inspect(trainer)
    finally:
        trainer.shutdown()


def test_one_step_scores_through_the_judge_pool(ray_session, tmp_path, judge_step_run):
    spec = judge_step_run("trainer.digenrl.final_eval_prompts=0",  # only the step's SCOREs ask the judge
                          "reward.reward_model.enable_resource_pool=True", "reward.reward_model.nnodes=1",
                          "reward.reward_model.n_gpus_per_node=2")
    assert spec.reward.reward_model.pool.replicas == 2 and spec.reward.reward_model.backend == "transformers"
    trainer, summary, (kind, actors, holds_model, gen_pid), judged, groups = _one_step(
        spec, lambda trainer: ray.util.placement_group_table())
    after = ray.util.placement_group_table()
    assert (kind, actors, holds_model) == ("RemoteJudge", 2, False)  # the generator holds no judge model
    assert [j["backend"] for j in judged] == ["TransformersJudge"] * 2
    assert sum(j["images"] for j in judged) == 4  # 2 prompts x n=2 decoded images, each judged once
    assert all(j["calls"] >= 1 for j in judged) and gen_pid not in {j["pid"] for j in judged}
    pools = [g for g in groups.values() if g["name"].startswith(f"reward_pool_{trainer.run_id}_")]
    assert len(pools) == 1 and pools[0]["strategy"] == "STRICT_PACK" and len(pools[0]["bundles"]) == 2
    assert trainer.judge_pool.actors == [] and trainer.judge_pool.placement_groups == []  # released
    assert after[pools[0]["placement_group_id"]]["state"] == "REMOVED"  # its resources went back to Ray
    assert summary["steps"] == 1 and summary["samples"] == 4
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [row for row in map(json.loads, lines) if "summary" not in row]
    assert len(steps) == 1 and steps[0][M["reward_nonfinite"]] == 0
    assert math.isfinite(steps[0][M["reward_mean"]]) and 0.0 <= steps[0][M["reward_mean"]] <= 1.0


def test_one_step_scores_through_a_judge_colocated_on_the_worker_pools(ray_session, tmp_path, judge_step_run):
    """verl-omni's Qwen-Image OCR placement (a TP > 1 vLLM judge, no reward pool) on CPU: one replica per TP devices
    of the worker pools (here generator 1 + trainer 1, TP 2: one), started on their node after them, reserving no
    CPU, reached by name; the generator holds no judge model."""
    spec = judge_step_run("trainer.digenrl.final_eval_prompts=0",
                          "reward.reward_model.rollout.tensor_model_parallel_size=2")
    pool = spec.reward.reward_model.pool
    assert pool.colocated and pool.replicas == 1 and spec.reward.reward_model.backend == "transformers"
    def placed(trainer):
        nodes = {ray.get(w.placement.remote())[0] for w in trainer.workers.values()}
        where = ray.get([a.__ray_call__.remote(lambda self: (ray.get_runtime_context().get_node_id(),
                                                             ray.get_runtime_context().get_assigned_resources()))
                         for a in trainer.judge_pool.actors])
        return trainer.judge_pool.names(), nodes, where

    trainer, summary, (kind, actors, holds_model, gen_pid), judged, (names, nodes, where) = _one_step(spec, placed)
    assert (kind, actors, holds_model) == ("RemoteJudge", 1, False)  # the generator holds no judge model
    assert [j["backend"] for j in judged] == ["TransformersJudge"] and judged[0]["images"] == 4
    assert gen_pid != judged[0]["pid"] and names == [f"reward_pool_{trainer.run_id}_0"]
    assert where == [(nodes.pop(), {})] and not nodes  # on the workers' node, holding no CPU of Ray's
    assert trainer.judge_pool.actors == [] and summary["steps"] == 1 and summary["samples"] == 4
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [row for row in map(json.loads, lines) if "summary" not in row]
    assert len(steps) == 1 and math.isfinite(steps[0][M["reward_mean"]])


def test_a_colocated_replica_sees_the_gpus_it_is_given_and_no_cpu_of_rays(ray_session):
    """The options of a colocated replica, on a real Ray actor: Ray leaves the given CUDA_VISIBLE_DEVICES alone
    (a task without GPUs would otherwise get an empty one), and the actor holds no resources of Ray's."""
    node = ray.get_runtime_context().get_node_id()

    @ray.remote
    class Probe:
        def where(self):
            context = ray.get_runtime_context()
            return os.environ.get("CUDA_VISIBLE_DEVICES"), context.get_node_id(), context.get_assigned_resources()

    probe = Probe.options(**colocated_options("colocated_probe", node, ["2", "3"])).remote()
    try:
        assert ray.get(probe.where.remote()) == ("2,3", node, {})
        assert ray.get_actor("colocated_probe")._actor_id == probe._actor_id
    finally:
        ray.kill(probe)


@ray.remote(num_cpus=0)
class _Replica:
    """A judge replica stand-in: answers `<tag>:<image>` (after `delay_s`) and records what each call sent."""

    def __init__(self, tag: str, delay_s: float = 0.0) -> None:
        self.tag = tag
        self.delay_s = delay_s
        self.seen: list[list] = []

    def transcribe(self, images):
        self.seen.append(list(images))
        time.sleep(self.delay_s)
        return [f"{self.tag}:{x}" for x in images]

    def calls(self):
        return self.seen


def test_remote_judge_splits_each_call_over_every_replica_in_order(ray_session):
    replicas = [_Replica.remote(tag) for tag in "abc"]
    judge = RemoteJudge(replicas, first=1)
    out = judge.transcribe(list(range(5)))
    assert [o.split(":")[1] for o in out] == ["0", "1", "2", "3", "4"]  # answers in image order
    assert [o.split(":")[0] for o in out] == ["b", "c", "c", "a", "a"]  # contiguous shares, from replica `first`
    assert judge.transcribe([7]) == ["c:7"] and judge.transcribe([]) == []  # the next call starts one further
    assert ray.get([r.calls.remote() for r in replicas]) == [[[3, 4]], [[0]], [[1, 2], [7]]]


@ray.remote(num_cpus=0)
class _Scorer:
    """A scoring worker stand-in: judges through `RemoteJudge`, as a generator's SCORE task does."""

    def __init__(self, replicas) -> None:
        self.judge = RemoteJudge(replicas)

    def score(self, images):
        return self.judge.transcribe(images)

    def alive(self) -> bool:
        return True


def test_a_judge_replica_killed_mid_call_fails_the_task_without_looking_like_a_dead_scoring_worker(ray_session):
    """The executor takes a task whose result is a Ray actor error for the death of the worker that ran it
    (`ray_executor._raises`); a dead judge replica must fail the score task with a plain error naming the reward
    pool, not drop the live generator."""
    replicas = [_Replica.remote("a"), _Replica.remote("b", delay_s=60.0)]
    scorer = _Scorer.remote(replicas)
    ref = scorer.score.remote([0, 1, 2, 3])  # [0, 1] to a, [2, 3] to b (busy for a minute)
    deadline = time.monotonic() + 60
    while not ray.get(replicas[0].calls.remote()) and time.monotonic() < deadline:  # a answered: the call is out
        time.sleep(0.1)
    ray.kill(replicas[1], no_restart=True)  # b dies holding its share
    assert ray.wait([ref], timeout=60)[0] == [ref]
    assert not _raises(ref, RayActorError)  # the executor would not report the generator dead
    with pytest.raises(RuntimeError, match=r"judge replica 1 of 2 \(reward pool, reward\.reward_model\."
                                           r"enable_resource_pool=True\) died \(.*\); the scoring worker is alive"):
        ray.get(ref)
    assert ray.get(scorer.alive.remote())
