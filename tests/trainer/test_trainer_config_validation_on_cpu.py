"""Every bad configuration fails before any worker starts, naming the key, the value and the fix."""

from __future__ import annotations

import json
import warnings

import pytest

from digenrl_verl.main import TINY_CPU, compose, main
from digenrl_verl.trainer.config import build_run


def _build(model_dir, *overrides):
    return build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model_dir}", *overrides]))


DISAGG = "trainer.digenrl.mode=disaggregated"

CASES = [
    # (overrides, substrings the error must contain)
    ([DISAGG, "trainer.digenrl.tcss.staleness=2"], ["trainer.digenrl.tcss.staleness", "2"]),
    ([DISAGG, "trainer.digenrl.tcss.staleness=1", "trainer.digenrl.tcss.max_stale_fraction=1.5"],
     ["trainer.digenrl.tcss.max_stale_fraction", "1.5", "[0, 1]"]),
    (["actor_rollout_ref.rollout.n=1"], ["actor_rollout_ref.rollout.n", "at least 2"]),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], ["ppo_mini_batch_size", "data.train_batch_size"]),
    ([DISAGG, "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"],
     ["ppo_micro_batch_size_per_gpu", "raise it"]),
    (["actor_rollout_ref.model.algorithm=dpo"], ["actor_rollout_ref.model.algorithm", "flow_grpo"]),
    (["reward.reward_functions={sharpnezz: 1.0}"], ["sharpnezz", "brightness"]),
    (["actor_rollout_ref.rollout.algo.sde_type=euler"], ["actor_rollout_ref.rollout.algo.sde_type", "cps"]),
    (["trainer.digenrl.mode=split"], ["trainer.digenrl.mode", "disaggregated"]),
    (["actor_rollout_ref.rollout.algo.sde_window_size=9"], ["sde_window_size", "num_inference_steps"]),
    (["algorithm.timestep_fraction=1.5"], ["algorithm.timestep_fraction", "(0, 1]"]),
    ([DISAGG, "trainer.digenrl.pools.generator.workers_per_node=0"], ["trainer.digenrl.pools.generator", "empty"]),
    ([DISAGG, "trainer.digenrl.pools.trainer.workers_per_node=500"], ["trainer.digenrl.pools", "shrink"]),
    ([DISAGG, "data.train_batch_size=1", "actor_rollout_ref.rollout.n=2",
      "trainer.digenrl.pools.generator.workers_per_node=3"], ["generator ranks", "never get a sample"]),
    ([DISAGG, "trainer.n_gpus_per_node=1"], ["at least 2 CPU workers", "trainer.n_gpus_per_node",
                                              "trainer.digenrl.pools"]),
    ([DISAGG, "trainer.nnodes=4", "trainer.n_gpus_per_node=8"], ["trainer.nnodes=4 x trainer.n_gpus_per_node=8",
                                                                "32 CPU worker processes", "trainer.device=cuda"]),
    (["trainer.n_gpus_per_node=0"], ["trainer.n_gpus_per_node=0", ">= 1"]),
    (["trainer.device=npu"], ["trainer.device='npu' is not supported", "cuda"]),
    (["trainer.total_training_steps=0"], ["trainer.total_training_steps"]),
    ([DISAGG, "trainer.digenrl.pools.generator.use_gpu=true"], ["use_gpu", "trainer.device=cuda"]),
    (["actor_rollout_ref.actor.strategy=megatron"], ["actor_rollout_ref.actor.strategy", "fsdp2", "ddp"]),
    ([DISAGG, "trainer.digenrl.pools.trainer.workers_per_node=3", "actor_rollout_ref.rollout.n=2"],
     ["actor_rollout_ref.actor.strategy=fsdp", "rollout.n=2 < 3", "strategy=ddp"]),
    ([DISAGG, "trainer.digenrl.pools.trainer.workers_per_node=2", "actor_rollout_ref.actor.fsdp_config.fsdp_size=1"],
     ["fsdp_config.fsdp_size=1", "hybrid sharding", "-1"]),
    # values of the wrong type name their key (they used to reach float()/tuple() and raise a bare TypeError)
    (["actor_rollout_ref.actor.optim.lr=null"], ["actor_rollout_ref.actor.optim.lr=None", "must be a number"]),
    (["actor_rollout_ref.actor.optim.betas=0.9"], ["actor_rollout_ref.actor.optim.betas=0.9", "list of numbers"]),
    (["actor_rollout_ref.rollout.algo.noise_level=abc"], ["actor_rollout_ref.rollout.algo.noise_level='abc'",
                                                          "must be a number"]),
    (["actor_rollout_ref.rollout.seed=1.5"], ["actor_rollout_ref.rollout.seed=1.5", "must be an integer"]),
    (["actor_rollout_ref.rollout.pipeline.num_inference_steps=0"],
     ["actor_rollout_ref.rollout.pipeline.num_inference_steps", "positive integer", "0"]),
    (["actor_rollout_ref.rollout.dtype=bf32"], ["actor_rollout_ref.rollout.dtype='bf32'", "bfloat16"]),
]


@pytest.mark.parametrize("overrides,needles", CASES, ids=[c[0][-1] for c in CASES])
def test_bad_config_names_the_key(tiny_flux_dir, overrides, needles):
    with pytest.raises(ValueError) as err:
        _build(tiny_flux_dir, *overrides)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_a_key_nothing_reads_is_warned_by_name_and_shown_in_the_plan(tiny_flux_dir):
    """A key added with `+` that neither digenrl_verl nor verl-omni has (a typo) has no effect: warned by name with
    the valid keys of its section, and listed among the plan's decisions; user-named entries of open sections
    (reward functions) and the shipped keys are not."""
    with pytest.warns(UserWarning, match=r"actor_rollout_ref\.actor\.optim\.lr_typo=1 has no effect.*valid keys "
                                         r"under actor_rollout_ref\.actor\.optim: .*'lr'"):
        run = _build(tiny_flux_dir, "+actor_rollout_ref.actor.optim.lr_typo=1")
    assert any(d.startswith("actor_rollout_ref.actor.optim.lr_typo: not a key") for d in run.decisions)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _build(tiny_flux_dir, DISAGG, "reward.reward_functions={brightness: 1.0}")
    assert not [w for w in caught if "neither digenrl_verl nor verl-omni" in str(w.message)]
    assert not [d for d in run.decisions if "not a key of" in d]


def test_checkpoints_kept_follow_verl_omnis_key_and_default(tiny_flux_dir):
    """verl-omni's ``trainer.max_actor_ckpt_to_keep`` is the key (default null: every checkpoint kept, as verl-omni);
    the package's former ``trainer.max_ckpt_to_keep`` (default 2) is gone, and naming it fails (the entry point
    lists the valid keys, max_actor_ckpt_to_keep among them)."""
    assert _build(tiny_flux_dir).checkpoint.max_to_keep is None
    assert _build(tiny_flux_dir, "trainer.max_actor_ckpt_to_keep=3").checkpoint.max_to_keep == 3
    with pytest.raises(Exception, match=r"trainer\.max_ckpt_to_keep"):
        _build(tiny_flux_dir, "trainer.max_ckpt_to_keep=3")


def test_null_seed_and_sampling_steps_are_decisions_in_the_plan(tiny_flux_dir):
    run = _build(tiny_flux_dir, "actor_rollout_ref.rollout.seed=null",
                 "actor_rollout_ref.rollout.pipeline.num_inference_steps=null")
    assert run.policy.rollout.num_inference_steps == 10
    assert any(f"rollout.seed=None: unseeded, as in verl-omni: a seed was drawn at start; this run uses "
               f"{run.policy.rollout.seed}" in d for d in run.decisions)
    assert any("num_inference_steps=null: 10 sampling steps" in d for d in run.decisions)


def test_unknown_architecture_lists_the_valid_ones(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "FooPipeline", "_diffusers_version": "0"}))
    with pytest.raises(ValueError) as err:
        _build(tmp_path)
    assert "FooPipeline" in str(err.value) and "FluxPipeline" in str(err.value)


def test_model_path_that_is_not_a_diffusers_directory(tmp_path):
    with pytest.raises(ValueError, match="actor_rollout_ref.model.path"):
        _build(tmp_path)


def test_dry_run_validates_prints_the_plan_and_pools_and_starts_nothing(tiny_flux_dir, capsys):
    import ray

    assert main([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", DISAGG, "trainer.digenrl.dry_run=true",
                 "trainer.digenrl.pools.generator.workers_per_node=2"]) == 0
    out = capsys.readouterr().out
    assert "mode: disaggregated; pools: generator: 2 worker(s), trainer: 1 worker(s)" in out
    assert "tag=bts" in out and "dry run: config valid, no worker started" in out
    assert "engines: generation diffusers (float32 on cpu); trainer whole model per rank (ddp)" in out
    assert not ray.is_initialized() or "digenrl" not in str(ray.util.list_named_actors())


def test_bad_config_through_the_entry_point_exits_2_with_the_message(tiny_flux_dir, capsys):
    assert main([f"actor_rollout_ref.model.path={tiny_flux_dir}", "trainer.digenrl.tcss.staleness=3", DISAGG]) == 2
    assert "trainer.digenrl.tcss.staleness" in capsys.readouterr().err


def test_ocr_reward_without_its_extra_says_how_to_install_it(tiny_flux_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "rapidocr_onnxruntime" else real(name, *a))
    with pytest.raises(ValueError, match=r"reward.reward_functions.*pip install digenrl-verl\[ocr\]"):
        _build(tiny_flux_dir, "reward.reward_functions={ocr: 1.0}")


@pytest.mark.parametrize("overrides,want", [
    ([DISAGG, "trainer.digenrl.pools.trainer.workers_per_node=2"], "fsdp"),  # verl-omni's default key value
    ([DISAGG, "trainer.digenrl.pools.trainer.workers_per_node=2", "actor_rollout_ref.actor.strategy=fsdp2"], "fsdp2"),
    ([DISAGG, "trainer.digenrl.pools.trainer.workers_per_node=2", "actor_rollout_ref.actor.strategy=ddp"], "ddp"),
    ([DISAGG], "ddp"),  # one trainer rank: nothing to shard with
    (["trainer.digenrl.mode=colocated"], "ddp"),  # colocated ranks sample on their own: whole model each
])
def test_strategy_resolves_per_layout(tiny_flux_dir, overrides, want):
    sharding = _build(tiny_flux_dir, *overrides).train.sharding
    assert sharding.strategy == want


def test_fsdp_wrap_keys_reach_the_sharding_spec(tiny_flux_dir):
    spec = _build(tiny_flux_dir, DISAGG, "trainer.digenrl.pools.trainer.workers_per_node=2",
                  "actor_rollout_ref.model.fsdp_layer_prefixes=[single_transformer_blocks.]",
                  "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=10",
                  "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false").train.sharding
    assert (spec.layer_prefixes, spec.min_num_params, spec.reshard_after_forward) == (
        ("single_transformer_blocks.",), 10, False)


def test_fsdp2_in_colocated_mode_warns_that_ranks_keep_whole_models(tiny_flux_dir):
    with pytest.warns(UserWarning, match="colocated ranks keep a whole model"):
        _build(tiny_flux_dir, "trainer.digenrl.mode=colocated", "actor_rollout_ref.actor.strategy=fsdp2")


def test_pools_may_share_a_gpu_by_fraction():
    from digenrl_verl.config.digenrl import DigenRLConfig

    digenrl = DigenRLConfig.from_node({"pools": {"generator": {"use_gpu": True, "gpu_fraction": 0.5}}})
    assert digenrl.pools.generator.shares_a_device and not digenrl.pools.trainer.shares_a_device
    for bad, why in (({"use_gpu": True, "gpu_fraction": 0.3}, "1/k"), ({"gpu_fraction": 0.5}, "use_gpu=true")):
        with pytest.raises(ValueError, match=rf"trainer\.digenrl\.pools\.trainer\.gpu_fraction=.*{why}"):
            DigenRLConfig.from_node({"pools": {"trainer": bad}})


@pytest.mark.parametrize("barrier", ["trainer.save_freq=1", "trainer.test_freq=1"])
def test_staleness_with_a_barrier_after_every_step_is_warned_by_name(tiny_flux_dir, barrier):
    """A checkpoint or a validation after every step drains the pipeline: TCSS staleness 1 never runs ahead (a
    20-step run of bench e2e --baseline verl_omni --staleness 1 with save_freq=1 had 0 stale samples)."""
    key = barrier.split("=")[0]
    with pytest.warns(UserWarning, match=rf"tcss\.staleness=1 has no effect with {key}=1"):
        run = _build(tiny_flux_dir, DISAGG, "trainer.digenrl.tcss.staleness=1", barrier)
    assert any(d.startswith("trainer.digenrl.tcss.staleness=1 has no effect") for d in run.decisions)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _build(tiny_flux_dir, DISAGG, "trainer.digenrl.tcss.staleness=1", "trainer.save_freq=2")
        _build(tiny_flux_dir, DISAGG, barrier)  # on-policy: nothing to warn
    assert not [w for w in caught if "tcss.staleness" in str(w.message)]
