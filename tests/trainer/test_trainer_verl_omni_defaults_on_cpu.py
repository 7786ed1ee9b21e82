"""The one flag's defaults fit verl-omni's: what a verl-omni recipe leaves out or sets differently is translated, and
every such decision is printed by the plan (`RunSpec.describe`, what the dry run shows). Issue 11, item 3."""

from __future__ import annotations

import shutil
import warnings

import pytest

from digenrl_verl.config.digenrl import PoolConfig, PoolsConfig
from digenrl_verl.config.verl_omni import VERL_OMNI_DEFAULTS, pools_from_layout, split_layout
from digenrl_verl.engines.base import EngineEntry
from digenrl_verl.main import compose, main
from digenrl_verl.trainer.config import build_run

DISAGG = "trainer.digenrl.mode=disaggregated"
A = "actor_rollout_ref"


def _build(model_dir, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_run(compose([f"{A}.model.path={model_dir}", *overrides]))


def _decision(spec, needle: str) -> str:
    found = [d for d in spec.decisions if needle in d]
    assert len(found) == 1, (needle, spec.decisions)
    assert found[0] in spec.describe()
    return found[0]


# ------------------------------------------------------------------------------ a. vllm_omni with the default TAG
def test_vllm_omni_keeps_the_default_tag_through_the_trainers_own_engine(tiny_flux_dir, monkeypatch):
    monkeypatch.setattr(EngineEntry, "unavailable_reason", lambda self: None)  # as on a CUDA machine with vLLM-Omni
    spec = _build(tiny_flux_dir, DISAGG, f"{A}.rollout.name=vllm_omni")
    assert spec.schedule.tag.policy == "bts" and spec.policy.engine.name == "vllm_omni"
    text = _decision(spec, "TAG")
    assert "own diffusers engine" in text and "tag.policy=off" in text
    assert spec.train.recompute_old_log_probs  # the two engines' samples both get the trainer's old log-probs
    off = _build(tiny_flux_dir, DISAGG, f"{A}.rollout.name=vllm_omni", "trainer.digenrl.tag.policy=off")
    assert not [d for d in off.decisions if "TAG" in d]
    assert not [d for d in _build(tiny_flux_dir, DISAGG).decisions if "TAG" in d]  # diffusers: nothing to decide


# ------------------------------------------------------------------------------ b. algorithm.global_std=True
def test_global_std_is_coerced_with_a_printed_reason_when_updates_pipeline(tiny_flux_dir):
    with pytest.warns(UserWarning, match=r"algorithm\.global_std=True -> False"):
        spec = build_run(compose([f"{A}.model.path={tiny_flux_dir}", DISAGG, "algorithm.global_std=true"]))
    assert spec.advantage.global_std is False
    assert "trainer.digenrl.pipeline=false" in _decision(spec, "algorithm.global_std")


@pytest.mark.parametrize("overrides", [[DISAGG, "trainer.digenrl.pipeline=false"], ["trainer.digenrl.mode=colocated"]])
def test_global_std_is_kept_where_every_group_is_scored_before_the_first_update(tiny_flux_dir, overrides):
    spec = _build(tiny_flux_dir, *overrides, "algorithm.global_std=true")
    assert spec.advantage.global_std is True
    assert not [d for d in spec.decisions if "-> False" in d]


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


def test_a_gpu_layout_on_the_cpu_default_becomes_cpu_workers_only_with_the_change_printed(tiny_flux_dir):
    spec = _build(tiny_flux_dir, DISAGG, "trainer.n_gpus_per_node=8")
    assert spec.digenrl.pools.generator.size == 4 and not spec.digenrl.pools.generator.use_gpu
    text = _decision(spec, "pools:")
    assert "CPU worker process(es)" in text and "set trainer.device=cuda" in text


def test_given_pools_win_and_the_layout_keys_warn_by_name(tiny_flux_dir):
    cfg = compose([f"{A}.model.path={tiny_flux_dir}", DISAGG, "trainer.n_gpus_per_node=8",
                   "trainer.digenrl.pools.generator.workers_per_node=3"])
    with pytest.warns(UserWarning, match=r"trainer\.n_gpus_per_node=8 has no effect.*trainer\.digenrl\.pools is given"):
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
def test_the_plan_prints_each_default_that_differs_from_verl_omnis(tiny_flux_dir):
    spec = _build(tiny_flux_dir)
    text = spec.describe()
    assert "differences from verl-omni's defaults" in text
    for key, theirs in VERL_OMNI_DEFAULTS.items():
        assert f"{key}=" in text and f"(verl-omni: {theirs!r})" in text, key
    recipe = _build(tiny_flux_dir, f"{A}.rollout.pipeline.height=64", f"{A}.rollout.pipeline.width=48",
                    f"{A}.rollout.pipeline.num_inference_steps=10", f"{A}.rollout.pipeline.max_sequence_length=77")
    kept = recipe.policy.pipeline
    assert (kept.height, kept.width, kept.max_sequence_length) == (64, 48, 77)
    assert recipe.policy.rollout.num_inference_steps == 10
    assert not [d for d in recipe.differences
                if d.startswith((f"{A}.rollout.pipeline.height=", f"{A}.rollout.pipeline.num_inference_steps="))]
    assert [d for d in recipe.differences if ".pipeline.video_flow_shift=" in d]  # still at ours


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
def test_the_dry_run_prints_decisions_and_differences(tiny_flux_dir, capsys):
    assert main([f"{A}.model.path={tiny_flux_dir}", DISAGG, "trainer.digenrl.dry_run=true",
                 "algorithm.global_std=true", f"{A}.rollout.pipeline.height=64"]) == 0
    out = capsys.readouterr().out
    assert "decisions:\n  - pools: generator 1 + trainer 1 CPU worker process(es)" in out
    assert "  - algorithm.global_std=True -> False" in out
    assert "differences from verl-omni's defaults (keys at this plugin's default, which differs):" in out
    assert f"  - {A}.rollout.pipeline.width=32 (verl-omni: 512)" in out and ".pipeline.height=" not in out


@pytest.mark.parametrize("setting", ["gap=false", "pipeline=false"])
def test_gap_and_pipeline_warn_by_name_in_colocated_mode(tiny_flux_dir, setting):
    cfg = compose([f"{A}.model.path={tiny_flux_dir}", "trainer.digenrl.mode=colocated", f"trainer.digenrl.{setting}"])
    name = setting.split("=")[0]
    with pytest.warns(UserWarning, match=rf"trainer\.digenrl\.{name} has no effect in .*mode=colocated"):
        spec = build_run(cfg)
    _decision(spec, f"trainer.digenrl.{name}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        build_run(compose([f"{A}.model.path={tiny_flux_dir}", DISAGG, f"trainer.digenrl.{setting}"]))

