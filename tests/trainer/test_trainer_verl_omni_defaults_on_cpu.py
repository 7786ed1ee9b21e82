"""The one flag's defaults fit verl-omni's: what a verl-omni recipe leaves out or sets differently is translated, and
every such decision is printed by the plan (`RunSpec.describe`, what the dry run shows). Issue 11, item 3."""

from __future__ import annotations

import shutil
import warnings

import pytest

from digenrl_verl.config.digenrl import PoolConfig, PoolsConfig
from digenrl_verl.config.verl_omni import NOT_VERL_OMNI_DEFAULTS, pools_from_layout, split_layout
from digenrl_verl.engines.base import EngineEntry
from digenrl_verl.main import TINY_CPU, compose, main
from digenrl_verl.trainer.config import build_run

DISAGG = "trainer.digenrl.mode=disaggregated"
A = "actor_rollout_ref"


def _build(model_dir, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_run(compose([TINY_CPU, f"{A}.model.path={model_dir}", *overrides]))


def _decision(spec, needle: str) -> str:
    found = [d for d in spec.decisions if needle in d]
    assert len(found) == 1, (needle, spec.decisions)
    assert found[0] in spec.describe()
    return found[0]


# ------------------------------------------------------------------------------ a. vllm_omni with the default TAG
def test_vllm_omni_keeps_the_default_tag_through_the_trainers_own_engine(tmp_path, monkeypatch):
    """verl-omni's replicas as the generators (the CUDA default; `generator_replicas=true` on this CPU): the trainers
    sample their TAG micro-batches with their own diffusers engine, said in the plan."""
    from digenrl_verl.models import build_tiny_model_dir

    wan = build_tiny_model_dir("WanPipeline", tmp_path / "tiny_wan")
    monkeypatch.setattr(EngineEntry, "unavailable_reason", lambda self: None)  # as on a machine with verl-omni
    replicas = (DISAGG, f"{A}.rollout.name=vllm_omni", "trainer.digenrl.generator_replicas=true",
                f"{A}.rollout.algo.sde_window_size=2")
    spec = _build(wan, *replicas)
    assert spec.schedule.tag.policy == "bts" and spec.policy.engine.name == "verl_omni_replica"
    text = _decision(spec, "TAG")
    assert "own diffusers engine" in text and "tag.policy=off" in text
    assert spec.train.recompute_old_log_probs  # the two engines' samples both get the trainer's old log-probs
    off = _build(wan, *replicas, "trainer.digenrl.tag.policy=off")
    assert not [d for d in off.decisions if "TAG" in d]
    assert not [d for d in _build(wan, DISAGG).decisions if "TAG" in d]  # diffusers: nothing to decide


# ------------------------------------------------------------------------------ b. algorithm.global_std=True
def test_global_std_is_honoured_updates_wait_for_the_steps_last_reward(tiny_flux_dir):
    """verl-omni's default (the step's std) is kept exactly, by the deferred scaling (issue 32): groups update as they
    are scored, the step's optimizer steps wait for its last reward, and the plan says so; with the KL term the
    updates wait for the last reward (pipeline off), naming the key and the switch that allows pipelining."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a decision, not a coercion warned about
        spec = build_run(compose([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", DISAGG, "algorithm.global_std=true"]))
    assert spec.advantage.global_std is True and spec.advantage.deferred_std is True
    assert spec.schedule.pipeline is True and spec.schedule.opt_waits_for_step is True
    assert "deferred scaling" in _decision(spec, "algorithm.global_std")
    kl = _build(tiny_flux_dir, DISAGG, "algorithm.global_std=true", f"{A}.actor.use_kl_loss=true")
    assert kl.schedule.pipeline is False and kl.advantage.deferred_std is False
    text = _decision(kl, "algorithm.global_std")
    assert "wait for its last reward" in text and "algorithm.global_std=false" in text
    assert f"{A}.actor.use_kl_loss=true" in text
    piped = _build(tiny_flux_dir, DISAGG, "algorithm.global_std=false")
    assert piped.schedule.pipeline is True and piped.advantage.global_std is False


@pytest.mark.parametrize("overrides", [[DISAGG, "trainer.digenrl.pipeline=false"], ["trainer.digenrl.mode=colocated"]])
def test_global_std_needs_no_decision_where_every_group_is_scored_before_the_first_update(tiny_flux_dir, overrides):
    spec = _build(tiny_flux_dir, *overrides, "algorithm.global_std=true")
    assert spec.advantage.global_std is True
    assert not [d for d in spec.decisions if "algorithm.global_std" in d]


# ------------------------------------------------------------------------------ c. pools from verl-omni's layout
@pytest.mark.parametrize("layout,mode,sizes", [
    (dict(nnodes=1, per_node=8), "disaggregated", {"generator": (1, 4), "trainer": (1, 4)}),
    (dict(nnodes=1, per_node=3), "disaggregated", {"generator": (1, 1), "trainer": (1, 2)}),
    (dict(nnodes=4, per_node=8), "disaggregated", {"generator": (2, 8), "trainer": (2, 8)}),
    (dict(nnodes=1, per_node=4, rollout_nnodes=1, rollout_per_node=2), "disaggregated",
     {"generator": (1, 2), "trainer": (1, 4)}),
    (dict(nnodes=2, per_node=8), "colocated", {"colocated": (2, 8)}),
])
def test_split_layout(layout, mode, sizes):
    pools = split_layout(mode, use_gpu=True, **layout)
    assert {role: (pools[role].nnodes, pools[role].workers_per_node) for role in sizes} == sizes
    assert all(pools[role].use_gpu for role in sizes)


def test_the_shipped_layout_derives_the_default_pools(tiny_flux_dir):
    """trainer.nnodes x trainer.n_gpus_per_node of the shipped config give PoolsConfig()'s defaults (one rule)."""
    for mode in ("colocated", "disaggregated"):
        spec = _build(tiny_flux_dir, f"trainer.digenrl.mode={mode}")
        assert spec.digenrl.pools == PoolsConfig()
        assert "from trainer.nnodes=1 x trainer.n_gpus_per_node=2 on trainer.device=cpu" in _decision(spec, "pools:")


def test_pools_follow_the_recipes_gpu_layout(tiny_flux_dir):
    spec = _build(tiny_flux_dir, DISAGG, "trainer.device=cuda", "trainer.n_gpus_per_node=8", "trainer.nnodes=2",
                  f"{A}.rollout.n=8")
    gpu = PoolConfig(nnodes=1, workers_per_node=8, use_gpu=True)
    assert (spec.digenrl.pools.generator, spec.digenrl.pools.trainer) == (gpu, gpu)
    assert spec.policy.device == "cuda"
    assert "generator 8 + trainer 8 GPU(s)" in _decision(spec, "pools:")


def test_a_gpu_layout_on_cpu_becomes_cpu_workers_with_the_layout_printed(tiny_flux_dir):
    spec = _build(tiny_flux_dir, DISAGG, "trainer.n_gpus_per_node=8")
    assert spec.digenrl.pools.generator.size == 4 and not spec.digenrl.pools.generator.use_gpu
    text = _decision(spec, "pools:")
    assert "4 + trainer 4 CPU worker process(es)" in text and "trainer.device=cpu" in text


def test_given_pools_win_and_the_layout_keys_warn_by_name(tiny_flux_dir):
    cfg = compose([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", DISAGG, "trainer.n_gpus_per_node=6",
                   "trainer.digenrl.pools.generator.workers_per_node=3"])
    with pytest.warns(UserWarning, match=r"trainer\.n_gpus_per_node=6 has no effect.*trainer\.digenrl\.pools is given"):
        spec = build_run(cfg)
    assert (spec.digenrl.pools.generator.size, spec.digenrl.pools.trainer.size) == (3, 1)
    assert "trainer.n_gpus_per_node not used" in _decision(spec, "pools:")


def test_pools_from_layout_reads_a_verl_omni_config():
    """The mapping form (verl-omni's entry point): a missing key takes verl-omni's default (cuda, 8 per node)."""
    pools = pools_from_layout({"trainer": {"nnodes": 1}}, "disaggregated")
    assert {r: (p["workers_per_node"], p["use_gpu"]) for r, p in pools.items()} == {"generator": (4, True),
                                                                                    "trainer": (4, True)}
    assert set(pools_from_layout({"trainer": {"device": "cpu", "n_gpus_per_node": 2}}, "colocated")) == {"colocated"}
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        pools_from_layout({"trainer": {"nnodes": 1, "n_gpus_per_node": 1}}, "disaggregated")


# ------------------------------------------------------------------------------ d. verl-omni's defaults
def test_without_the_preset_a_run_takes_verl_omnis_defaults(tiny_flux_dir):
    """No preset: the plan is verl-omni's run (512 px, 10 steps, cuda, 30 epochs, its LR and std); only the
    NOT_VERL_OMNI_DEFAULTS keys differ, each printed with verl-omni's value and why."""
    spec = _build_plain(tiny_flux_dir, f"{A}.rollout.n=8", "trainer.digenrl.dry_run=true",
                        "data.train_batch_size=4", f"{A}.actor.ppo_mini_batch_size=4")
    pipe, roll = spec.policy.pipeline, spec.policy.rollout
    assert (pipe.height, pipe.width, pipe.max_sequence_length, roll.num_inference_steps) == (512, 512, 512, 10)
    assert (roll.noise_level, roll.timestep_fraction, spec.policy.device) == (1.0, 1.0, "cuda")
    assert (spec.train.optim.lr, spec.train.optim.weight_decay, spec.advantage.global_std) == (1e-6, 0.01, True)
    assert spec.num_steps == 30 * (8 // 4)  # total_epochs x the built-in prompts' batches
    assert spec.reward.weights() == {"jpeg_compressibility": 1.0}
    text = spec.describe()
    left = {k: v for k, v in NOT_VERL_OMNI_DEFAULTS.items() if k != f"{A}.model.path"}  # the path is given
    for key, (theirs, why) in left.items():
        assert f"{key}=" in text and f"(verl-omni: {theirs!r}): {why}" in text, key
    assert len(spec.differences) == len(left)
    assert not [d for d in spec.differences if "rollout.pipeline.height" in d]  # following verl-omni: not listed


def _build_plain(model_dir, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_run(compose([f"{A}.model.path={model_dir}", *overrides]))


def test_null_seeds_are_drawn_and_said_and_a_run_length_follows_the_epochs(tiny_flux_dir):
    a = _build(tiny_flux_dir, f"{A}.rollout.seed=null", "data.seed=null", "trainer.total_training_steps=null",
               "trainer.total_epochs=3")
    b = _build(tiny_flux_dir, f"{A}.rollout.seed=null", "data.seed=null")
    assert (a.policy.rollout.seed, a.data.seed) != (b.policy.rollout.seed, b.data.seed)  # drawn (2**-62 to fail)
    text = _decision(a, f"{A}.rollout.seed=None")
    assert f"set {A}.rollout.seed={a.policy.rollout.seed}" in text
    assert a.resolved[f"{A}.rollout.seed"] == a.policy.rollout.seed and a.resolved["data.seed"] == a.data.seed
    assert a.num_steps == 3 * (8 // 4)
    assert "total_epochs=3 x 2 step(s)" in _decision(a, "trainer.total_training_steps=null")
    capped = _build(tiny_flux_dir, "trainer.total_training_steps=9", "trainer.total_epochs=2")
    assert capped.num_steps == 4 and "ends after 4 steps" in _decision(capped, "total_training_steps=9")
    with pytest.raises(ValueError, match=r"data\.train_batch_size=16 is larger than the 8 prompts"):
        _build(tiny_flux_dir, "data.train_batch_size=16")


# ------------------------------------------------------------------------------ e. Hugging Face model ids
def _fake_hub_cache(root, repo_id: str, model_dir) -> str:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, repo / "snapshots" / commit)
    return str(repo / "snapshots" / commit)


def test_a_cached_hugging_face_model_id_resolves_to_its_snapshot(tiny_flux_dir, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    snapshot = _fake_hub_cache(tmp_path, "digenrl-test/Tiny-Flux", tiny_flux_dir)
    spec = _build("digenrl-test/Tiny-Flux")
    assert spec.policy.model_path == snapshot and spec.architecture == "FluxPipeline"
    assert snapshot in _decision(spec, "Hugging Face model id")


def test_an_uncached_hugging_face_model_id_is_rejected_by_name_with_the_fix(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match=r"model\.path='Qwen/Qwen-Image' is neither.*hf download Qwen/Qwen-Image"):
        _build("Qwen/Qwen-Image")


# ------------------------------------------------------------------------------ g. the dry run prints it all
def test_the_dry_run_prints_decisions_and_differences_and_writes_plan_json(tiny_flux_dir, tmp_path, capsys):
    import json

    assert main([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", DISAGG, "trainer.digenrl.dry_run=true",
                 "algorithm.global_std=true", f"{A}.rollout.pipeline.height=64",
                 f"trainer.digenrl.output_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "decisions:\n  - pools: generator 1 + trainer 1 CPU worker process(es)" in out
    assert "  - algorithm.global_std=True (verl-omni's default)" in out
    assert "differences from verl-omni's defaults (keys at this plugin's default, which differs):" in out
    assert f"  - {A}.rollout.tensor_model_parallel_size=1 (verl-omni: 2)" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["config"][f"{A}.rollout.pipeline.height"] == 64 and plan["config"]["algorithm.global_std"] is True
    assert plan["schedule"]["pipeline"] is True and plan["pools"]["trainer"]["size"] == 1  # deferred scaling (#32)
    assert plan["decisions"] and len(plan["differences_from_verl_omni"]) == len(NOT_VERL_OMNI_DEFAULTS) - 1


@pytest.mark.parametrize("setting", ["gap=false", "pipeline=false"])
def test_gap_and_pipeline_warn_by_name_in_colocated_mode(tiny_flux_dir, setting):
    cfg = compose([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", "trainer.digenrl.mode=colocated",
                   f"trainer.digenrl.{setting}"])
    name = setting.split("=")[0]
    with pytest.warns(UserWarning, match=rf"trainer\.digenrl\.{name} has no effect in .*mode=colocated"):
        spec = build_run(cfg)
    _decision(spec, f"trainer.digenrl.{name}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        build_run(compose([TINY_CPU, f"{A}.model.path={tiny_flux_dir}", DISAGG, f"trainer.digenrl.{setting}"]))

