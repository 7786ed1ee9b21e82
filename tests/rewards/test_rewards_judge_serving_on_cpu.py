"""How the VLM judge is served (issue 11): verl-omni's `reward.reward_model.enable_resource_pool` / `n_gpus_per_node`
/ `nnodes` (the judge's own pool) and `reward.reward_model.rollout.*` (the vLLM backend) through the config adapter,
the judge-backend interface of the reward, and the dry-run plan. No Ray here (the pool's run: the _run_ test)."""

from __future__ import annotations

import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest
import ray
import torch
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

from digenrl_verl.config import verl_omni_reward
from digenrl_verl.config.verl_omni import (
    NO_EFFECT, UNSUPPORTED, RecipeKeys, build_digenrl, build_layout, check_unsupported,
    cpu_process_limit,
)
from digenrl_verl.config.verl_omni_reward import build_reward
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.models.tiny import build_tiny_model_dir
from digenrl_verl.rewards import JUDGE_REWARD, JudgeConfig, RewardConfig, VLMJudgeReward, build_reward as make_reward
from digenrl_verl.rewards.tiny_judge import build_tiny_judge_dir
from digenrl_verl.rewards.vlm_judge import JudgePoolSpec, judge_backend_unavailable, judge_ocr_score
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.runner import DigenRLTrainer
from digenrl_verl.workers import judge as judge_workers
from digenrl_verl.workers.pools import PoolSpec

GENRM = "/somewhere/verl_omni/utils/reward_score/genrm_ocr.py"  # verl-omni's file; never loaded
POOL = ["reward.reward_model.enable_resource_pool=True", "reward.reward_model.nnodes=1"]
NO_VLLM = judge_backend_unavailable("vllm")  # why vLLM cannot judge here (None on a CUDA machine with vllm)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return str(build_tiny_judge_dir(tmp_path_factory.mktemp("judges") / "qwen2_5_vl", "qwen2_5_vl", seed=0))


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    return str(build_tiny_model_dir("FluxPipeline", tmp_path_factory.mktemp("models") / "flux", seed=0))


def _digenrl(keys):
    """The run's `trainer.digenrl` section with its pools, as `build_run` gives it to `build_reward`."""
    return build_layout(keys, build_digenrl(keys))


def _judge(judge_dir, *overrides):
    keys = RecipeKeys(compose([TINY_CPU, "reward.reward_model.enable=True",
                               f"reward.reward_model.model_path={judge_dir}",
                               "reward.reward_functions={genrm_ocr: 1.0}", *overrides]))
    check_unsupported(keys)
    return build_reward(keys, _digenrl(keys)).reward_model, keys


@pytest.fixture
def vllm_runs_here(monkeypatch):
    """The config adapter sees a machine where vLLM can judge (installed, CUDA), whatever this one has."""
    monkeypatch.setattr(verl_omni_reward, "judge_backend_unavailable", lambda name: None)


def test_enable_resource_pool_gives_the_judge_its_own_pool_sized_like_verl_omnis_reward_pool(judge_dir):
    assert "reward.reward_model.enable_resource_pool" not in UNSUPPORTED
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the transformers judge on CPU: nothing to warn about
        judge, keys = _judge(judge_dir, *POOL, "reward.reward_model.n_gpus_per_node=3")
    assert judge.pool == JudgePoolSpec(nnodes=1, per_node=3, use_gpu=False, devices_per_replica=1)
    assert judge.pool.replicas == 3 and judge.backend == "transformers"
    assert {"reward.reward_model.enable_resource_pool", "reward.reward_model.n_gpus_per_node",
            "reward.reward_model.nnodes", "reward.reward_model.rollout.name"} <= keys.read
    [note] = [d for d in keys.decisions if d.startswith("reward.reward_model.model_path")]
    assert "in its own Ray pool (the reward pool), served by transformers generate" in note
    [pool] = [d for d in keys.decisions if d.startswith("reward pool")]
    assert pool.startswith("reward pool (reward.reward_model.enable_resource_pool=True): 3 judge replica(s) of 1 CPU "
                           "worker process(es) on 1 node(s) x 3, from reward.reward_model.n_gpus_per_node=3 x "
                           "reward.reward_model.nnodes=1 on trainer.device=cpu")
    assert pool.endswith("on CPU each replica is a whole copy of the judge model in its own process: 3 copies in "
                         "memory; lower reward.reward_model.n_gpus_per_node for fewer")
    no_pool, _ = _judge(judge_dir)
    assert no_pool.pool is None  # without the flag: today's in-process judge


def test_pool_replicas_follow_verl_reward_model_manager_counting():
    pool = JudgePoolSpec(nnodes=2, per_node=8, use_gpu=True, devices_per_replica=3)  # world 16, TP 3: 2 per node
    assert (pool.replicas_per_node, pool.replicas, pool.unused_per_node) == (2, 4, 2)
    assert pool.bundle() == {"CPU": 1.0, "GPU": 3.0} and "2 GPU(s) per node unused" in pool.describe()
    assert JudgePoolSpec(1, 2).bundle() == {"CPU": 1.0}
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=4: .*n_gpus_per_node=2"):
        JudgePoolSpec(nnodes=1, per_node=2, use_gpu=True, devices_per_replica=4)


def test_bad_pool_sizes_fail_naming_the_key(judge_dir):
    with pytest.raises(ValueError, match=r"reward\.reward_model\.nnodes=0 must be an integer >= 1"):
        _judge(judge_dir, "reward.reward_model.enable_resource_pool=True")  # nnodes=0: verl-omni's default
    with pytest.raises(ValueError, match=r"reward\.reward_model\.n_gpus_per_node=0 must be"):
        _judge(judge_dir, *POOL, "reward.reward_model.n_gpus_per_node=0")
    with pytest.raises(ValueError, match=r"n_gpus_per_node=500 x .* judge processes \+ \d+ of the worker pools: "
                                         r"\d+ CPU worker processes on a machine with"):
        _judge(judge_dir, *POOL, "reward.reward_model.n_gpus_per_node=500")


def test_cpu_judge_processes_count_with_the_worker_processes_against_one_limit(judge_dir):
    """The judge's CPU processes and the worker pools' share the machine: one limit for their sum."""
    digenrl = _digenrl(RecipeKeys(compose([TINY_CPU, ])))
    workers = sum(digenrl.pools[r].size for r in digenrl.roles)
    room = cpu_process_limit() - workers  # judge processes that still fit
    judge, _ = _judge(judge_dir, *POOL, f"reward.reward_model.n_gpus_per_node={room}")
    assert judge.pool.replicas == room
    with pytest.raises(ValueError, match=rf"= {room + 1} judge processes \+ {workers} of the worker pools: "
                                         rf"{room + workers + 1} CPU worker processes"):
        _judge(judge_dir, *POOL, f"reward.reward_model.n_gpus_per_node={room + 1}")
    # colocated replicas (TP > 1 without a pool) are processes too: one node of the limit's workers has no room
    limit = cpu_process_limit()
    with pytest.raises(ValueError, match=rf"tensor_model_parallel_size=2 with .*enable_resource_pool=false on trainer"
                                         rf"\.device=cpu: {limit // 2} judge processes colocated with the {limit} of "
                                         rf"the worker pools.*set reward\.reward_model\.rollout\.tensor_model_"
                                         rf"parallel_size=1 \(the judge then runs inside each scoring worker"):
        _judge(judge_dir, "reward.reward_model.rollout.name=vllm", "trainer.digenrl.mode=disaggregated",
               f"trainer.n_gpus_per_node={limit}")


def test_the_reward_pool_line_says_how_many_copies_of_the_judge_a_cpu_pool_holds():
    keys = RecipeKeys(compose([TINY_CPU, *POOL]))
    assert verl_omni_reward._pool_note(keys, JudgePoolSpec(1, 8)).endswith(
        "8 copies in memory (reward.reward_model.n_gpus_per_node=8 is the default); lower "
        "reward.reward_model.n_gpus_per_node for fewer")
    assert "copies" not in verl_omni_reward._pool_note(keys, JudgePoolSpec(1, 8, use_gpu=True))


@pytest.mark.skipif(NO_VLLM is None, reason="vLLM can judge on this machine: no fall-back to test")
def test_vllm_without_cuda_falls_back_on_cpu_with_a_printed_reason_and_fails_on_cuda(judge_dir):
    rollout = ["reward.reward_model.rollout.name=vllm", "reward.reward_model.rollout.tensor_model_parallel_size=4"]
    with pytest.warns(UserWarning, match=r"reward\.reward_model\.rollout\.name=vllm -> transformers: trainer\.device="
                                         r"cpu .*Fix: trainer\.device=cuda \(pip install 'digenrl-verl\[vllm\]'.*"
                                         r"rollout\.name=transformers"):
        judge, keys = _judge(judge_dir, *rollout, *POOL, "reward.reward_model.n_gpus_per_node=4")
    assert judge.backend == "transformers" and judge.tensor_parallel_size == 1 and judge.pool.replicas == 4
    assert any(d.startswith("reward.reward_model.rollout.name=vllm -> transformers") for d in keys.decisions)
    on_gpu = [*rollout, "trainer.device=cuda"]
    with pytest.raises(ValueError, match=r"reward\.reward_model\.rollout\.name=vllm cannot be used here: .*Fix: pip "
                                         r"install .*or set reward\.reward_model\.rollout\.name=transformers"):
        _judge(judge_dir, *on_gpu)
    # a dry run plans for the cluster: the vLLM judge, TP 4 replicas in the pool, and the decision says why
    judge, keys = _judge(judge_dir, *on_gpu, *POOL, "trainer.digenrl.dry_run=true")
    assert judge.backend == "vllm" and judge.tensor_parallel_size == 4
    assert judge.pool == JudgePoolSpec(1, 8, use_gpu=True, devices_per_replica=4) and judge.pool.replicas == 2
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
        keys = RecipeKeys(compose([TINY_CPU, "reward.reward_model.enable_resource_pool=True"]))
        build_reward(keys, _digenrl(keys))
    assert NO_EFFECT["reward.reward_model.rollout.free_cache_engine"].startswith("the judge stays resident")
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2: the transformers judge"):
        JudgeConfig("x", tensor_parallel_size=2)


def test_the_dry_run_plan_prints_the_reward_pool(judge_dir, flux_dir):
    ocr = [f"reward.custom_reward_function.path={GENRM}", "reward.custom_reward_function.name=compute_score_ocr"]
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={flux_dir}", "trainer.digenrl.mode=disaggregated",
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
    cfg = JudgeConfig(judge_dir, pool=JudgePoolSpec(1, 1))
    reward = make_reward(RewardConfig(reward_functions={JUDGE_REWARD: 1.0}, reward_model=cfg), echo)
    images = torch.zeros(3, 3, 8, 8, dtype=torch.uint8)
    scores = reward.score(images, ['"OPEN"', '"SHUT"', '"pen"'])
    assert echo.seen == 3 and reward.components[JUDGE_REWARD][0].judge is echo
    assert scores.tolist() == pytest.approx([1.0, judge_ocr_score("open", "SHUT"), 1.0])
    with pytest.raises(RuntimeError, match=r"the judge runs in its own pool \(reward\.reward_model\.enable_resource_"
                                           r"pool=True\), and this worker was given no handle"):
        VLMJudgeReward(cfg)  # a pooled judge is never silently built in-process
    with pytest.raises(RuntimeError, match=r"the judge runs as colocated replicas"):
        VLMJudgeReward(JudgeConfig(judge_dir, pool=JudgePoolSpec(1, 2, devices_per_replica=2, colocated=True)))


# --- review findings (issue 11): serving choices that were accepted and failed later, or were silent -----------

def test_vllm_on_cpu_falls_back_to_transformers_even_where_vllm_could_run(judge_dir, vllm_runs_here):
    """trainer.device=cpu keeps the judge on CPU: transformers, warned by name, whatever this machine has."""
    with pytest.warns(UserWarning) as caught:
        judge, keys = _judge(judge_dir, "reward.reward_model.rollout.name=vllm",
                             "reward.reward_model.rollout.tensor_model_parallel_size=2",
                             "reward.reward_model.rollout.max_num_seqs=64")
    text = [str(w.message) for w in caught]
    assert judge.backend == "transformers" and judge.tensor_parallel_size == 1
    assert any(t.startswith("reward.reward_model.rollout.name=vllm -> transformers: trainer.device=cpu (vLLM judges "
                            "on CUDA only)") for t in text)
    assert any(d.startswith("reward.reward_model.rollout.name=vllm -> transformers") for d in keys.decisions)
    # a changed engine key is warned by name; tensor_model_parallel_size still counts the colocated replicas
    assert any(t.startswith("reward.reward_model.rollout.max_num_seqs=64 has no effect with reward.reward_model."
                            "rollout.name=vllm (fallen back to transformers)") for t in text)
    assert judge.pool.colocated and judge.pool.replicas == 1 and not any("parallel_size=2 has no" in t for t in text)


def test_in_process_vllm_judge_needs_one_device(judge_dir, vllm_runs_here):
    """Without its own pool a vLLM judge of one GPU runs in each scoring worker, on that worker's GPU; a replica of
    several GPUs is colocated on the worker pools' GPUs (next test); a bare JudgeConfig in-process needs TP 1."""
    on_gpu = ["trainer.device=cuda", "reward.reward_model.rollout.name=vllm"]
    judge, keys = _judge(judge_dir, *on_gpu, "reward.reward_model.rollout.tensor_model_parallel_size=1")
    assert judge.backend == "vllm" and judge.pool is None and judge.tensor_parallel_size == 1
    assert any("gpu_memory_utilization 0.5 of the GPU that holds the diffusion model" in d for d in keys.decisions)
    pooled, _ = _judge(judge_dir, *on_gpu, *POOL)  # in the reward pool a replica has TP GPUs
    assert pooled.tensor_parallel_size == 2 and pooled.pool.replicas == 4 and not pooled.pool.colocated
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2 with .*enable_resource_pool=false"):
        JudgeConfig("x", backend="vllm", tensor_parallel_size=2)


QWEN_OCR = ["trainer.device=cuda", "reward.reward_model.rollout.name=vllm", "trainer.digenrl.mode=disaggregated",
            "trainer.n_gpus_per_node=4", "trainer.nnodes=1"]  # verl-omni's Qwen-Image OCR layout: 4 GPUs, REWARD_TP=4


def test_a_multi_gpu_vllm_judge_without_a_pool_is_colocated_on_the_worker_pools_like_verl_omnis_global_pool(
        judge_dir, vllm_runs_here):
    """verl-omni's Qwen-Image OCR scripts serve a TP-4 vLLM judge on the 4 training GPUs (no reward pool): here 4 // 4
    = 1 replica colocated on the generator and trainer pools' 4 GPUs (2 + 2), planned and printed."""
    judge, keys = _judge(judge_dir, *QWEN_OCR, "reward.reward_model.rollout.tensor_model_parallel_size=4")
    assert judge.backend == "vllm" and judge.tensor_parallel_size == 4
    assert judge.pool == JudgePoolSpec(1, 4, use_gpu=True, devices_per_replica=4, colocated=True)
    assert judge.pool.replicas == 1
    line = next(d for d in keys.decisions if d.startswith("judge replicas ("))
    assert ("1 judge replica(s) of 4 GPU(s) on 1 node(s) x 4 of the worker pools (shared with their workers)" in line
            and "gpu_memory_utilization=0.5 of each of its GPUs" in line and "enable_resource_pool=true" in line)
    two, _ = _judge(judge_dir, *QWEN_OCR)  # verl's shipped TP 2: two replicas of two GPUs
    assert two.pool.replicas == 2 and two.pool.colocated
    multi, _ = _judge(judge_dir, *QWEN_OCR[:-1], "trainer.nnodes=4")  # whole nodes: 2 generate, 2 train
    assert (multi.pool.nnodes, multi.pool.per_node, multi.pool.replicas) == (4, 4, 8)
    two_nodes, _ = _judge(judge_dir, *QWEN_OCR[:-1], "trainer.nnodes=2")  # 1 node generates, 1 trains: 2 nodes of 4
    assert (two_nodes.pool.nnodes, two_nodes.pool.per_node, two_nodes.pool.replicas) == (2, 4, 4)  # TP 2
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=8 .*takes 8 GPUs of one node, and the worker "
                                         r"pools hold 4 per node \(generator 1 x 4, trainer 1 x 4\)"):
        _judge(judge_dir, *QWEN_OCR[:-1], "trainer.nnodes=2",
               "reward.reward_model.rollout.tensor_model_parallel_size=8")
    shared = ["trainer.digenrl.pools.generator.gpu_fraction=0.5", "trainer.digenrl.pools.trainer.gpu_fraction=0.5",
              "trainer.digenrl.pools.generator.use_gpu=true", "trainer.digenrl.pools.trainer.use_gpu=true"]
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2 with .*these pools share GPUs themselves "
                                         r"\(gpu_fraction < 1\).*set reward\.reward_model\.enable_resource_pool=true"):
        _judge(judge_dir, *QWEN_OCR, *shared)
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=8 with reward\.reward_model\.enable_resource_"
                                         r"pool=false: a judge replica takes 8 GPUs of one node, and the worker "
                                         r"pools hold 4 per node \(generator 1 x 2, trainer 1 x 2\); lower .*to at "
                                         r"most 4, or set .*enable_resource_pool=true"):
        _judge(judge_dir, *QWEN_OCR, "reward.reward_model.rollout.tensor_model_parallel_size=8")


def test_a_colocated_judge_on_cpu_keeps_the_gpu_plans_replica_count(judge_dir):
    """On CPU the vLLM judge falls back to transformers, placed as on GPUs: TP counts the replicas (not warned)."""
    with pytest.warns(UserWarning) as caught:
        judge, keys = _judge(judge_dir, "reward.reward_model.rollout.name=vllm", "trainer.digenrl.mode=disaggregated",
                             "trainer.n_gpus_per_node=4", "reward.reward_model.rollout.tensor_model_parallel_size=4")
    assert judge.backend == "transformers" and judge.tensor_parallel_size == 1
    assert judge.pool == JudgePoolSpec(1, 4, use_gpu=False, devices_per_replica=4, colocated=True)
    assert not any("tensor_model_parallel_size=4 has no effect" in str(w.message) for w in caught)
    assert any("on CPU each replica is a whole copy of the judge model (transformers) in its own process: 1 copies"
               in d for d in keys.decisions)
    assert any("tensor_model_parallel_size still counts the replicas colocated" in d for d in keys.decisions)
    # on CPU a replica wider than a node's workers is narrowed to the node (on GPUs: an error, above)
    with pytest.warns(UserWarning, match=r"tensor_model_parallel_size=4 with .*enable_resource_pool=false on trainer"
                                         r"\.device=cpu: a replica would take 4 of a node's 2 CPU workers"):
        narrow, keys = _judge(judge_dir, "reward.reward_model.rollout.name=vllm", "trainer.digenrl.mode=disaggregated",
                              "trainer.n_gpus_per_node=2", "reward.reward_model.rollout.tensor_model_parallel_size=4")
    assert narrow.pool == JudgePoolSpec(1, 2, use_gpu=False, devices_per_replica=2, colocated=True)
    assert "reward.reward_model.rollout.tensor_model_parallel_size=4 -> 2 on trainer.device=cpu" in " ".join(
        keys.decisions)


def test_colocated_replicas_cut_each_nodes_distinct_devices():
    # workers that share a GPU (pools with gpu_fraction < 1) report it twice: one device
    placements = [("a", ["0"]), ("a", ["1"]), ("a", ["1"]), ("b", ["0"]), ("a", ["2"]), ("a", ["3"]), ("b", ["1"])]
    assert judge_workers.colocated_replicas(placements, 2) == [("a", ("0", "1")), ("a", ("2", "3")), ("b", ("0", "1"))]
    assert judge_workers.colocated_replicas(placements, 4) == [("a", ("0", "1", "2", "3"))]  # b's 2 stay unused
    assert judge_workers.colocated_replicas(placements, 3) == [("a", ("0", "1", "2"))]


def test_colocated_replicas_start_on_their_node_with_their_gpus(monkeypatch):
    """Each replica: no CPU, no GPU from Ray, pinned to its node, CUDA_VISIBLE_DEVICES = its workers' GPUs (Ray told
    to leave it); a placement that gives another count than the plan fails naming the key."""
    started = []

    class _Remote:
        def options(self, **options):
            return SimpleNamespace(remote=lambda cfg, threads: started.append(options) or options["name"])

    monkeypatch.setattr(judge_workers.ray, "remote", lambda cls: _Remote())
    cfg = JudgeConfig("x", backend="vllm", tensor_parallel_size=2,
                      pool=JudgePoolSpec(1, 4, use_gpu=True, devices_per_replica=2, colocated=True))
    pool = judge_workers.JudgePool(cfg, "rp_")
    assert pool.handles() == ["rp_0", "rp_1"]
    with pytest.raises(ValueError, match="start_colocated"):
        pool.start()
    node = "ab" * 28  # a Ray node id: 56 hex digits
    pool.start_colocated([(node, ["0"]), (node, ["1"]), (node, ["2"]), (node, ["3"])])
    assert [o["name"] for o in started] == ["rp_0", "rp_1"]
    assert all(o["num_cpus"] == 0 and o["num_gpus"] == 0 and o["scheduling_strategy"].node_id == node
               and not o["scheduling_strategy"].soft for o in started)
    assert [o["runtime_env"]["env_vars"] for o in started] == [
        {"CUDA_VISIBLE_DEVICES": "0,1", judge_workers.NOSET_CUDA: "1"},
        {"CUDA_VISIBLE_DEVICES": "2,3", judge_workers.NOSET_CUDA: "1"}]
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2 with reward\.reward_model\.enable_resource_"
                                         r"pool=false: the plan has 2 judge replica\(s\).*run on 2 node\(s\) with "
                                         r"\[1, 2\] distinct devices, which hold 1 replica\(s\)"):
        judge_workers.JudgePool(cfg, "rq_").start_colocated([("n1", ["0"]), ("n1", ["1"]), ("n2", ["0"])])


def test_null_engine_settings_fail_naming_the_key(judge_dir, vllm_runs_here):
    on_gpu = ["trainer.device=cuda", "reward.reward_model.rollout.name=vllm",
              "reward.reward_model.rollout.tensor_model_parallel_size=1"]
    with pytest.raises(ValueError, match=r"reward\.reward_model\.rollout\.gpu_memory_utilization=None must be a "
                                         r"number in \(0, 1\]"):
        _judge(judge_dir, *on_gpu, "reward.reward_model.rollout.gpu_memory_utilization=null")
    with pytest.raises(ValueError, match=r"reward\.reward_model\.rollout\.max_num_seqs='many' must be an integer"):
        _judge(judge_dir, *on_gpu, "reward.reward_model.rollout.max_num_seqs=many")


def test_pool_sizes_without_the_pool_warn_by_name(judge_dir):
    with pytest.warns(UserWarning) as caught:
        judge, _ = _judge(judge_dir, "reward.reward_model.n_gpus_per_node=4", "reward.reward_model.nnodes=2")
    assert judge.pool is None
    text = [str(w.message) for w in caught]
    for key in ("n_gpus_per_node=4", "nnodes=2"):
        assert any(t.startswith(f"reward.reward_model.{key} has no effect with reward.reward_model."
                                "enable_resource_pool=false") for t in text), key


def test_the_dry_run_flag_comes_from_the_section(judge_dir, monkeypatch):
    """`build_judge` plans for the cluster when the `trainer.digenrl` section it is given is a dry run."""
    monkeypatch.setattr(verl_omni_reward, "judge_backend_unavailable", lambda name: "no CUDA device (test)")
    keys = RecipeKeys(compose([TINY_CPU, "reward.reward_model.enable=True",
                               f"reward.reward_model.model_path={judge_dir}", "reward.reward_model.rollout.name=vllm",
                               "trainer.device=cuda", *POOL]))
    with pytest.raises(ValueError, match=r"rollout\.name=vllm cannot be used here: no CUDA device \(test\)"):
        verl_omni_reward.build_judge(keys, _digenrl(keys))
    with pytest.warns(UserWarning, match=r"rollout\.name=vllm: this machine cannot run vLLM \(no CUDA device "
                                         r"\(test\)\); the dry run plans for the cluster"):
        judge = verl_omni_reward.build_judge(keys, replace(_digenrl(keys), dry_run=True))
    assert judge.backend == "vllm" and any("the dry run plans for the cluster" in d for d in keys.decisions)


class _Cluster:
    """Ray's resource view, stubbed: what is available cluster-wide and each alive node's resources."""

    def __init__(self, monkeypatch, available, nodes):
        monkeypatch.setattr(ray, "available_resources", lambda: dict(available))
        monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": dict(n)} for n in nodes])


def _gpu_judge(per_node=8, nnodes=1, tp=1):
    return JudgeConfig("x", backend="vllm", tensor_parallel_size=tp,
                       pool=JudgePoolSpec(nnodes, per_node, use_gpu=True, devices_per_replica=tp))


def test_the_reward_pool_check_counts_the_worker_pools_and_one_node_per_group(monkeypatch):
    pool = judge_workers.JudgePool(_gpu_judge(), "reward_pool_t_")
    _Cluster(monkeypatch, {"CPU": 32, "GPU": 12}, [{"CPU": 16, "GPU": 8}, {"CPU": 16, "GPU": 4}])
    pool.check_placeable()  # 8 GPUs on one node of 8
    workers = (PoolSpec("generator_pool", (4,), use_gpu=True), PoolSpec("trainer_pool", (2,), use_gpu=True))
    with pytest.raises(ValueError, match=r"reward\.reward_model\.enable_resource_pool=True: the Ray cluster has 12 GPU "
                                         r"left; the reward pool \(.*\) and the worker pools 6 process\(es\) need 14; "
                                         r"lower reward\.reward_model\.n_gpus_per_node / reward\.reward_model\.nnodes"):
        pool.check_placeable(workers)  # the error names the reward pool, not the generator pool placed after it
    _Cluster(monkeypatch, {"CPU": 32, "GPU": 8}, [{"CPU": 16, "GPU": 4}, {"CPU": 16, "GPU": 4}])
    with pytest.raises(ValueError, match=r"needs \{'CPU': 8\.0, 'GPU': 8\.0\} on one node \(STRICT_PACK"):
        pool.check_placeable()  # 8 GPUs free in all, but no node has 8


def test_the_reward_pool_is_placed_before_start_returns(monkeypatch):
    """start() waits (bounded) for its placement groups; a group that is never placed is removed and the error
    names the sizing keys; no judge actor was started."""
    _Cluster(monkeypatch, {"CPU": 32, "GPU": 8}, [{"CPU": 32, "GPU": 8}])
    removed, waited = [], []

    class Group:
        def ready(self):
            return self

    def never_placed(refs, timeout=None):
        waited.append((len(refs), timeout))
        raise GetTimeoutError("not placed")

    monkeypatch.setattr(judge_workers, "placement_group", lambda bundles, strategy, name: Group())
    monkeypatch.setattr(judge_workers, "remove_placement_group", removed.append)
    monkeypatch.setattr(ray, "get", never_placed)
    pool = judge_workers.JudgePool(_gpu_judge(per_node=4, nnodes=2), "reward_pool_t_")
    with pytest.raises(ValueError, match=r"reward pool \(.*\) was not placed within 120 s .*lower reward\.reward_model"
                                         r"\.n_gpus_per_node / reward\.reward_model\.nnodes"):
        pool.start()
    assert waited == [(2, judge_workers.PLACE_TIMEOUT_S)] and len(removed) == 2
    assert pool.actors == [] and pool.placement_groups == []


class _Releases:
    def __init__(self, fail: bool) -> None:
        self.fail, self.released = fail, False

    def release(self) -> None:
        self.released = True
        if self.fail:
            raise RuntimeError("judge pool release failed")


def test_shutdown_releases_the_worker_pools_when_the_judge_pool_release_raises():
    judge, manager = _Releases(fail=True), _Releases(fail=False)
    trainer = SimpleNamespace(worker_groups={}, workers={}, supervisor=None, release_own_pools=lambda: None,
                              judge_pool=judge, pool_manager=manager)
    with pytest.raises(RuntimeError, match="judge pool release failed"):
        DigenRLTrainer.shutdown(trainer)
    assert judge.released and manager.released  # the worker pools' placement groups went back all the same


class _Replica:
    """A judge actor handle, stubbed: `transcribe.remote(images)` is a ref the stubbed `ray.get` answers."""

    def __init__(self, dead: bool) -> None:
        self.dead = dead
        self.transcribe = SimpleNamespace(remote=lambda images: (self, list(images)))


def test_a_dead_judge_replica_is_a_plain_error_naming_the_reward_pool(monkeypatch):
    """Ray re-raises a task's error as its cause's class: an actor error escaping the score task would make the
    executor take the live scoring worker for dead (tests/rewards/test_rewards_judge_pool_run_on_cpu.py runs it)."""
    def get(ref, timeout=None):
        replica, images = ref
        if replica.dead:
            raise ActorDiedError()
        return [f"ok:{x}" for x in images]

    monkeypatch.setattr(ray, "get", get)
    judge = judge_workers.RemoteJudge([_Replica(dead=False), _Replica(dead=True)])
    assert judge.transcribe([1]) == ["ok:1"]  # replica 0 only
    with pytest.raises(RuntimeError, match=r"judge replica 1 of 2 \(reward pool, reward\.reward_model\."
                                           r"enable_resource_pool=True\) died \(ActorDiedError The actor died "
                                           r"unexpectedly.*\); the scoring worker is alive") as caught:
        judge.transcribe([1, 2, 3, 4])
    assert not isinstance(caught.value, RayActorError)
