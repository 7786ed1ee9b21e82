"""How the VLM judge is served (issue 11): verl-omni's `reward.reward_model.enable_resource_pool` / `n_gpus_per_node`
/ `nnodes` (the judge's own pool) and `reward.reward_model.rollout.*` (the vLLM backend) through the config adapter,
the judge-backend interface of the reward, and the dry-run plan. No Ray here (the pool's run: the _run_ test)."""

from __future__ import annotations

import warnings

import pytest
import torch

from digenrl_verl.config.verl_omni import NO_EFFECT, UNSUPPORTED, RecipeKeys, build_reward, check_unsupported
from digenrl_verl.main import compose
from digenrl_verl.models.tiny import build_tiny_model_dir
from digenrl_verl.rewards import JUDGE_REWARD, JudgeConfig, RewardConfig, VLMJudgeReward, build_reward as make_reward
from digenrl_verl.rewards.tiny_judge import build_tiny_judge_dir
from digenrl_verl.rewards.vlm_judge import JudgePool, judge_backend_unavailable, judge_ocr_score
from digenrl_verl.trainer.config import build_run

GENRM = "/somewhere/verl_omni/utils/reward_score/genrm_ocr.py"  # verl-omni's file; never loaded
POOL = ["reward.reward_model.enable_resource_pool=True", "reward.reward_model.nnodes=1"]
NO_VLLM = judge_backend_unavailable("vllm")  # why vLLM cannot judge here (None on a CUDA machine with vllm)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return str(build_tiny_judge_dir(tmp_path_factory.mktemp("judges") / "qwen2_5_vl", "qwen2_5_vl", seed=0))


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    return str(build_tiny_model_dir("FluxPipeline", tmp_path_factory.mktemp("models") / "flux", seed=0))


def _judge(judge_dir, *overrides):
    keys = RecipeKeys(compose(["reward.reward_model.enable=True", f"reward.reward_model.model_path={judge_dir}",
                               "reward.reward_functions={genrm_ocr: 1.0}", *overrides]))
    check_unsupported(keys)
    return build_reward(keys).reward_model, keys


def test_enable_resource_pool_gives_the_judge_its_own_pool_sized_like_verl_omnis_reward_pool(judge_dir):
    assert "reward.reward_model.enable_resource_pool" not in UNSUPPORTED
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the transformers judge on CPU: nothing to warn about
        judge, keys = _judge(judge_dir, *POOL, "reward.reward_model.n_gpus_per_node=3")
    assert judge.pool == JudgePool(nnodes=1, per_node=3, use_gpu=False, devices_per_replica=1)
    assert judge.pool.replicas == 3 and judge.backend == "transformers"
    assert {"reward.reward_model.enable_resource_pool", "reward.reward_model.n_gpus_per_node",
            "reward.reward_model.nnodes", "reward.reward_model.rollout.name"} <= keys.read
    [note] = [d for d in keys.decisions if d.startswith("reward.reward_model.model_path")]
    assert "in its own Ray pool (the reward pool), served by transformers generate" in note
    [pool] = [d for d in keys.decisions if d.startswith("reward pool")]
    assert pool.startswith("reward pool (reward.reward_model.enable_resource_pool=True): 3 judge replica(s) of 1 CPU "
                           "worker process(es) on 1 node(s) x 3, from reward.reward_model.n_gpus_per_node=3 x "
                           "reward.reward_model.nnodes=1 on trainer.device=cpu")
    no_pool, _ = _judge(judge_dir)
    assert no_pool.pool is None  # without the flag: today's in-process judge


def test_pool_replicas_follow_verl_reward_model_manager_counting():
    pool = JudgePool(nnodes=2, per_node=8, use_gpu=True, devices_per_replica=3)  # world 16, TP 3: 2 per node
    assert (pool.replicas_per_node, pool.replicas, pool.unused_per_node) == (2, 4, 2)
    assert pool.bundle() == {"CPU": 1.0, "GPU": 3.0} and "2 GPU(s) per node unused" in pool.describe()
    assert JudgePool(1, 2).bundle() == {"CPU": 1.0}
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=4: .*n_gpus_per_node=2"):
        JudgePool(nnodes=1, per_node=2, use_gpu=True, devices_per_replica=4)


def test_bad_pool_sizes_fail_naming_the_key(judge_dir):
    with pytest.raises(ValueError, match=r"reward\.reward_model\.nnodes=0 must be an integer >= 1"):
        _judge(judge_dir, "reward.reward_model.enable_resource_pool=True")  # nnodes=0: verl-omni's default
    with pytest.raises(ValueError, match=r"reward\.reward_model\.n_gpus_per_node=0 must be"):
        _judge(judge_dir, *POOL, "reward.reward_model.n_gpus_per_node=0")
    with pytest.raises(ValueError, match=r"n_gpus_per_node=500 x .* judge processes on a machine with"):
        _judge(judge_dir, *POOL, "reward.reward_model.n_gpus_per_node=500")


@pytest.mark.skipif(NO_VLLM is None, reason="vLLM can judge on this machine: no fall-back to test")
def test_vllm_without_cuda_falls_back_on_cpu_with_a_printed_reason_and_fails_on_cuda(judge_dir):
    rollout = ["reward.reward_model.rollout.name=vllm", "reward.reward_model.rollout.tensor_model_parallel_size=4"]
    with pytest.warns(UserWarning, match=r"reward\.reward_model\.rollout\.name=vllm -> transformers: .*Fix: pip "
                                         r"install 'digenrl-verl\[vllm\]'.*rollout\.name=transformers"):
        judge, keys = _judge(judge_dir, *rollout, *POOL)
    assert judge.backend == "transformers" and judge.tensor_parallel_size == 1 and judge.pool.replicas == 8
    assert any(d.startswith("reward.reward_model.rollout.name=vllm -> transformers") for d in keys.decisions)
    on_gpu = [*rollout, "trainer.device=cuda"]
    with pytest.raises(ValueError, match=r"reward\.reward_model\.rollout\.name=vllm cannot be used here: .*Fix: pip "
                                         r"install .*or set reward\.reward_model\.rollout\.name=transformers"):
        _judge(judge_dir, *on_gpu)
    # a dry run plans for the cluster: the vLLM judge, TP 4 replicas in the pool, and the decision says why
    judge, keys = _judge(judge_dir, *on_gpu, *POOL, "trainer.digenrl.dry_run=true")
    assert judge.backend == "vllm" and judge.tensor_parallel_size == 4
    assert judge.pool == JudgePool(1, 8, use_gpu=True, devices_per_replica=4) and judge.pool.replicas == 2
    assert judge.max_model_len == 4096 and judge.max_num_seqs == 1024 and judge.dtype == "bfloat16"  # verl's sizes
    assert any("the dry run plans for the cluster" in d for d in keys.decisions)


def test_judge_backend_names_and_unused_engine_settings(judge_dir):
    with pytest.raises(ValueError, match=r"unknown reward\.reward_model\.rollout\.name='sglang'; valid: "
                                         r"\['transformers', 'vllm'\]"):
        _judge(judge_dir, "reward.reward_model.rollout.name=sglang")
    with pytest.warns(UserWarning, match=r"rollout\.tensor_model_parallel_size=4 has no effect with "
                                         r"reward\.reward_model\.rollout\.name=transformers"):
        judge, _ = _judge(judge_dir, "reward.reward_model.rollout.name=transformers",
                          "reward.reward_model.rollout.tensor_model_parallel_size=4")
    assert judge.backend == "transformers" and judge.tensor_parallel_size == 1
    with pytest.warns(UserWarning, match=r"reward\.reward_model\.enable_resource_pool=True has no effect: "
                                         r"reward\.reward_model\.enable=false"):
        build_reward(RecipeKeys(compose(["reward.reward_model.enable_resource_pool=True"])))
    assert NO_EFFECT["reward.reward_model.rollout.free_cache_engine"].startswith("the judge stays resident")
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2: the transformers judge"):
        JudgeConfig("x", tensor_parallel_size=2)


def test_the_dry_run_plan_prints_the_reward_pool(judge_dir, flux_dir):
    ocr = [f"reward.custom_reward_function.path={GENRM}", "reward.custom_reward_function.name=compute_score_ocr"]
    cfg = compose([f"actor_rollout_ref.model.path={flux_dir}", "trainer.digenrl.mode=disaggregated",
                   "reward.reward_model.enable=True", f"reward.reward_model.model_path={judge_dir}", *ocr,
                   *POOL, "reward.reward_model.n_gpus_per_node=2"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        plan = build_run(cfg).describe()
    assert "  - reward pool (reward.reward_model.enable_resource_pool=True): 2 judge replica(s) of 1 CPU worker " \
           "process(es) on 1 node(s) x 2" in plan
    assert "reward: {'genrm_ocr': 1.0}" in plan


class _EchoJudge:
    """A judge backend that answers every image with a fixed text (the interface, without a model)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.seen = 0

    def transcribe(self, images):
        self.seen += len(images)
        return [self.answer] * len(images)


def test_the_judge_reward_asks_the_backend_it_is_given(judge_dir):
    echo = _EchoJudge("open")
    cfg = JudgeConfig(judge_dir, pool=JudgePool(1, 1))
    reward = make_reward(RewardConfig(reward_functions={JUDGE_REWARD: 1.0}, reward_model=cfg), echo)
    images = torch.zeros(3, 3, 8, 8, dtype=torch.uint8)
    scores = reward.score(images, ['"OPEN"', '"SHUT"', '"pen"'])
    assert echo.seen == 3 and reward.components[JUDGE_REWARD][0].judge is echo
    assert scores.tolist() == pytest.approx([1.0, judge_ocr_score("open", "SHUT"), 1.0])
    with pytest.raises(RuntimeError, match=r"enable_resource_pool=True: the judge runs in its own pool"):
        VLMJudgeReward(cfg)  # a pooled judge is never silently built in-process
