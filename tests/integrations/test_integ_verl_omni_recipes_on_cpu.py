"""verl-omni's recipes against our entry point: their override lists compose unchanged with the one flag,
every blocker fails naming its key, the rest validates (dry run) and the tiny variants train one real step."""

from __future__ import annotations

import json
import warnings

import pytest
from omegaconf import OmegaConf
import torch

from digenrl_verl.integrations.verl_omni_recipes import DIGENRL_FLAG, RECIPES
from digenrl_verl.main import TINY_CPU, compose, run
from digenrl_verl.trainer.config import build_run

torch.set_num_threads(1)
RECIPE_NAMES = sorted(RECIPES)


def _quiet_build(cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_run(cfg)


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_recipe_composes_unchanged_and_each_blocker_fails_naming_its_key(name, tiny_dirs, reward_dir, data_dir):
    recipe = RECIPES[name]
    model = tiny_dirs[recipe.architecture]
    # The list as verl-omni ships it, plus the flag: Hydra accepts every key (no unknown-key error).
    cfg = compose(recipe.render(model, reward_dir, data_dir, extra=[DIGENRL_FLAG]))
    assert cfg.trainer.digenrl.mode == "disaggregated"
    assert cfg.trainer.logger == ["console", "wandb"] or cfg.trainer.logger == ["console", "tensorboard"]
    with pytest.raises(ValueError):
        _quiet_build(cfg)
    # Each blocker alone (the others switched off) fails with a message that names it.
    for key in recipe.blockers:
        others = [k for k in recipe.blockers if k != key]
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            _quiet_build(compose(recipe.render(model, reward_dir, data_dir, switch_off=others, extra=[DIGENRL_FLAG])))


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_recipe_with_blockers_off_validates_and_its_keys_take_effect(name, tiny_dirs, reward_dir, data_dir):
    recipe = RECIPES[name]
    cfg = compose(recipe.render(tiny_dirs[recipe.architecture], reward_dir, data_dir, switch_off=True,
                                extra=[DIGENRL_FLAG]))
    spec = _quiet_build(cfg)
    ov = {k: v.strip('"') for k, v in (o.lstrip("+").split("=", 1) for o in recipe.render("M", "R", switch_off=True))}
    a = "actor_rollout_ref"
    assert spec.schedule.mode == "disaggregated" and spec.architecture == recipe.architecture
    assert spec.n == int(ov[f"{a}.rollout.n"]) and spec.prompts_per_step == int(ov["data.train_batch_size"])
    assert spec.num_steps == int(ov["trainer.total_training_steps"])
    roll = spec.policy.rollout
    assert roll.sde_type == ov[f"{a}.rollout.algo.sde_type"]
    assert roll.noise_level == pytest.approx(float(ov[f"{a}.rollout.algo.noise_level"]))
    assert roll.timestep_selection == "window" and roll.sde_window_size == int(ov[f"{a}.rollout.algo.sde_window_size"])
    assert roll.sde_window_range == (0, 5) and roll.num_train_steps == roll.sde_window_size
    assert spec.policy.lora.rank == int(ov.get(f"{a}.model.lora_rank", 0))
    assert spec.train.optim.lr == pytest.approx(float(ov[f"{a}.actor.optim.lr"]))
    if f"{a}.actor.diffusion_loss.clip_ratio" in ov:
        assert spec.train.loss.clip_ratio == pytest.approx(float(ov[f"{a}.actor.diffusion_loss.clip_ratio"]))
    for key in ("height", "width", "num_inference_steps", "guidance_scale", "true_cfg_scale"):
        if f"{a}.rollout.pipeline.{key}" in ov and key != "num_inference_steps":
            assert getattr(spec.policy.pipeline, key) == pytest.approx(float(ov[f"{a}.rollout.pipeline.{key}"]))
    if f"{a}.rollout.pipeline.num_inference_steps" in ov:
        assert roll.num_inference_steps == int(ov[f"{a}.rollout.pipeline.num_inference_steps"])
    if "reward.custom_reward_function.path" in ov:
        assert spec.reward.custom_reward_function_path.endswith(ov["reward.custom_reward_function.path"][2:])
    from digenrl_verl.trainer.data import load_prompts

    prompts, _ = load_prompts(cfg.data.train_files, cfg.data.prompt_key)  # verl-style chat prompts → user text
    assert prompts[0] == 'A sign that reads "HELLO"'
    if ov.get(f"{a}.actor.fsdp_config.model_dtype") == "bfloat16":
        assert spec.policy.dtype == "bfloat16" and spec.train.recompute_old_log_probs


def test_dry_run_prints_the_plan_and_starts_nothing(tiny_dirs, reward_dir, data_dir, capsys):
    recipe = RECIPES["sd35_flowgrpo_lora_v1_separate_async"]
    cfg = compose(recipe.render(tiny_dirs[recipe.architecture], reward_dir, data_dir, switch_off=True,
                                extra=[DIGENRL_FLAG, "trainer.digenrl.dry_run=true"]))
    assert run(cfg) == 0
    out = capsys.readouterr().out
    # pools from the recipe's layout: 1 standalone rollout node x 2, the trainer's 1 node x 2
    assert "mode: disaggregated; pools: generator: 2 worker(s), trainer: 2 worker(s)" in out
    assert "actor_rollout_ref.rollout.nnodes=1 (standalone rollout nodes)" in out
    assert "sde_type=cps" in out and "dry run: config valid, no worker started" in out


def test_no_effect_keys_warn_instead_of_being_ignored_silently(tiny_dirs, reward_dir, data_dir):
    recipe = RECIPES["qwen_image_flowgrpo_lora"]
    cfg = compose(recipe.render(tiny_dirs[recipe.architecture], reward_dir, data_dir, switch_off=True,
                                extra=[DIGENRL_FLAG]))
    with pytest.warns(UserWarning) as record:
        build_run(cfg)
    text = " ".join(str(w.message) for w in record)
    for key in ("fsdp_config.param_offload=True", "fsdp_config.optimizer_offload=True", "layered_summon=True"):
        assert key in text


A = "actor_rollout_ref"
UNSUPPORTED_CASES = [
    (f"{A}.rollout.tensor_model_parallel_size=2", f"{A}.rollout.tensor_model_parallel_size"),
    (f"{A}.rollout.data_parallel_size=2", f"{A}.rollout.data_parallel_size"),
    (f"{A}.rollout.checkpoint_engine.backend=mooncake", f"{A}.rollout.checkpoint_engine.backend"),
    (f"{A}.rollout.checkpoint_engine.custom_backend_module=my.mod", "custom_backend_module"),
    (f"{A}.rollout.pipeline.video_flow_shift=12", f"{A}.rollout.pipeline.video_flow_shift"),
    (f"{A}.rollout.pipeline.aspect_ratio=16:9", f"{A}.rollout.pipeline.aspect_ratio"),
    (f"{A}.rollout.pipeline.output_type=latent", f"{A}.rollout.pipeline.output_type"),
    ("algorithm.adv_estimator=grpo_guard", "algorithm.adv_estimator"),
    (f"{A}.actor.diffusion_loss.loss_mode=flow_dppo", f"{A}.actor.diffusion_loss.loss_mode"),
    ("trainer.device=npu", "trainer.device"),
    (f"{A}.rollout.nnodes=1", f"{A}.rollout.nnodes"),  # colocated: standalone rollout GPUs need disaggregated
    ("reward.reward_model.enable=true", "reward.reward_model.enable"),
    ("trainer.use_v1=true", "trainer.use_v1"),
    (f"{A}.rollout.name=vllm_omni", f"{A}.rollout.name"),
]


@pytest.mark.parametrize("override,key", UNSUPPORTED_CASES, ids=[c[0] for c in UNSUPPORTED_CASES])
def test_unsupported_feature_fails_naming_the_key(override, key, tiny_dirs):
    cfg = compose([TINY_CPU, f"{A}.model.path={tiny_dirs['FluxPipeline']}", override])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_run(cfg)


def test_verl_omni_pipeline_keys_are_accepted_at_their_defaults(tiny_dirs):
    spec = build_run(compose([TINY_CPU, f"{A}.model.path={tiny_dirs['WanPipeline']}",
                              f"{A}.rollout.pipeline.frame_rate=16",
                              f"{A}.rollout.pipeline.output_type=video", f"{A}.rollout.nnodes=1", DIGENRL_FLAG]))
    assert spec.policy.pipeline.num_inference_steps == 6  # PipelineConfig built without the verl-omni-only keys


# ---------------------------------------------------------------------------------------- one real step
def _fit_one_step(trainer):
    import ray

    try:
        summary = trainer.fit()
        stats = ray.get([w.checksum.remote() for w in trainer.workers.values()])
    finally:
        trainer.shutdown()
    return summary, stats


def _check_step(summary, stats, recipe):
    assert summary["mode"] == "disaggregated" and summary["steps"] == 1
    assert summary["samples"] == 4 and torch.isfinite(torch.tensor(summary["reward_first"]))
    assert [s["version"] for s in stats] == [1, 1]  # the trainer stepped, the generator received version 1
    assert len({s["checksum"] for s in stats}) == 1, f"{recipe.name}: generator and trainer weights differ"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen_image_flowgrpo_lora", "wan22_dancegrpo"])
def test_tiny_recipe_runs_one_real_step_on_cpu(name, ray_session, tiny_dirs, reward_dir, data_dir, tmp_path):
    from digenrl_verl.trainer.runner import DigenRLTrainer

    recipe = RECIPES[name]
    cfg = compose(recipe.render(tiny_dirs[recipe.architecture], reward_dir, data_dir, switch_off=True, extra=[
        DIGENRL_FLAG, *recipe.tiny, f"trainer.digenrl.output_dir={tmp_path / name}", "trainer.logger=[console]",
        f"trainer.default_local_dir={tmp_path / name / 'checkpoints'}"]))
    summary, stats = _fit_one_step(DigenRLTrainer(_quiet_build(cfg)))
    _check_step(summary, stats, recipe)


@pytest.mark.slow
def test_tiny_v1_recipe_runs_one_step_through_the_verl_omni_trainer_mode(ray_session, tiny_dirs, reward_dir, data_dir,
                                                                         tmp_path):
    """The SD3.5 v1 recipe as verl-omni's task runner would drive it: `trainer.use_v1=true
    trainer.v1.trainer_mode=digenrl`, the config handed to the `digenrl` trainer-mode class, init, fit."""
    from digenrl_verl.integrations.verl_omni import (NOOP_AGENT_LOOP_MANAGER, DigenRLDiffusionTrainer,
                                                     NoopAgentLoopManager)

    recipe = RECIPES["sd35_flowgrpo_lora_v1_separate_async"]
    blockers = [k for k in recipe.blockers if k != "trainer.use_v1"]
    source = compose(recipe.render(tiny_dirs[recipe.architecture], reward_dir, data_dir, switch_off=blockers, extra=[
        "trainer.v1.trainer_mode=digenrl", *recipe.tiny, f"trainer.digenrl.output_dir={tmp_path / 'v1'}",
        f"trainer.default_local_dir={tmp_path / 'v1' / 'checkpoints'}",
        "trainer.logger=[console]"]))
    assert source.trainer.use_v1 is True
    # as verl-omni composes it: no trainer.digenrl.mode (verl-omni has no section; `+trainer.digenrl.<key>` adds keys)
    source = OmegaConf.create(OmegaConf.to_container(source))
    del source.trainer.digenrl.mode
    mode = DigenRLDiffusionTrainer(config=source)
    assert source.actor_rollout_ref.rollout.agent.agent_loop_manager_class == NOOP_AGENT_LOOP_MANAGER
    assert mode.get_llm_client() is None and mode.get_reward_handles() is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mode.init()  # translates (our run config; no worker yet)
        assert mode.run_config.trainer.digenrl.mode == "disaggregated"
        assert mode.run_config.actor_rollout_ref.rollout.algo.sde_type == "cps"
        mode.fit(NoopAgentLoopManager.create(source))  # digenrl_verl.main.run: the plan, the step, shutdown
    written = json.loads((tmp_path / "v1" / "summary.json").read_text())
    summary, workers = written["summary"], written["workers"]
    assert summary["mode"] == "disaggregated" and summary["steps"] == 1 and summary["samples"] == 4
    assert (tmp_path / "v1" / "plan.json").is_file()
    assert sorted(w["worker"] for w in workers) == ["gen:0", "trn:0"] and {w["version"] for w in workers} == {1}
