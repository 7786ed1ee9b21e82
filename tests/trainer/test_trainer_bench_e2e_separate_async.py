"""`python -m digenrl_verl.bench e2e --baseline verl_omni --with-separate-async` without verl-omni: (c)'s command line
(verl-omni's v1 separate_async with its SD3.5 example's on-policy settings on (a)'s), the JSON's (c) row, its
speed-up c / b and its weights against (a)'s; and `python -m digenrl_verl.bench.verl_omni_matrix`'s command lines
(issue 30 items 1 and 3 (c)). The runs: tests/verl_omni/test_verl_omni_flag_equals_stock_on_cpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from digenrl_verl.bench import e2e_verl_omni as bench
from digenrl_verl.bench import verl_omni_matrix as matrix
from digenrl_verl.integrations.verl_omni_recipes import RECIPES

A = "actor_rollout_ref"
STOCK = ["data.train_files=/d/train.parquet", "data.val_files=/d/test.parquet", "data.train_batch_size=2",
         f"{A}.rollout.n=2", f"{A}.model.path=/d/model", "trainer.test_freq=30", "trainer.total_training_steps=1",
         "reward.custom_reward_function.path=/d/genrm_ocr.py", *bench.CPU]


def test_separate_async_is_the_stock_command_line_with_verl_omnis_on_policy_settings(tmp_path):
    argv = bench.separate_async_argv(STOCK, tmp_path, 3)
    a = bench.stock_argv(STOCK, tmp_path, 3)
    assert bench.ENTRIES["separate_async"] == "verl_omni.trainer.main_diffusion_v1" == bench.V1_ENTRY
    for key, want in (("trainer.v1.trainer_mode", "separate_async"), ("trainer.use_v1", "true"),
                      ("trainer.v1.separate_async.sync_compatible", "1"),
                      ("trainer.v1.separate_async.parameter_sync_step", "1"),
                      ("trainer.v1.separate_async.num_warmup_batches", "0"),
                      ("trainer.v1.sampler.max_off_policy_threshold", "1"), (f"{A}.rollout.nnodes", "1"),
                      (f"{A}.rollout.checkpoint_engine.backend", "gloo"), ("ray_kwargs.ray_init.num_gpus", "2")):
        assert bench.value(argv, key) == want, key
    # everything else is (a)'s: the same model, data, seeds, dtypes, checkpoints
    changed = {o.split("=", 1)[0].lstrip("+") for o in bench.SEPARATE_ASYNC}
    assert [o for o in argv if o.split("=", 1)[0].lstrip("+") not in changed] == \
        [o for o in a if o.split("=", 1)[0].lstrip("+") not in changed]
    assert bench.run_env("separate_async")["DIGENRL_CPU_RAY_GPUS"] == "1"


def _timed(step_s: float) -> dict:
    return {"out": "/x", "argv": bench.stock_argv(STOCK, Path("/x"), 3), "wall_s": 10 * step_s,
            "step_s": [step_s] * 3, "step_s_median": step_s, "testing_s": 0.0}


def _pass(stock_s: float, flag_s: float, c_s: float, c_err: float) -> dict:
    return {"stock": _timed(stock_s), "flag": _timed(flag_s), "separate_async": _timed(c_s),
            "max_weight_rel_err": 1e-6, "max_metric_rel_err": 0.0, "per_step": [],
            "separate_async_vs_stock": {"per_step": [], "max_weight_rel_err": c_err, "max_metric_rel_err": 0.0,
                                        "missing_metrics": ["actor/pg_clipfrac"]},
            "reward_curves": {"stock": [0.4] * 3, "flag": [0.4] * 3, "separate_async": [0.4] * 3}}


def test_the_json_adds_c_its_speedup_over_b_and_its_weights_against_a():
    cfg = bench.BenchConfig(steps=3, repeat=3, with_separate_async=True)
    out = bench.summarise([_pass(4.0, 2.0, 8.0, 1e-6), _pass(6.0, 2.0, 9.0, 3e-5), _pass(5.0, 4.0, 10.0, 2e-6)], cfg)
    assert [r["run"] for r in out["rows"]] == ["stock", "flag", "separate_async"]
    assert out["rows"][2]["name"].startswith("(c) verl-omni a1139baf stock main_diffusion_v1 (v1 separate_async")
    assert out["speedup"] == {"step_s": 2.5, "wall_s": 2.5}
    assert out["speedup_vs_separate_async"] == {"step_s": 4.5, "wall_s": 4.5}
    assert out["speedup_per_pass_vs_separate_async"]["step_s"] == [4.0, 4.5, 2.5]
    assert out["separate_async"]["max_weight_rel_err_vs_stock"] == 3e-5
    assert out["separate_async"]["within_tolerance_of_stock"] is False
    assert out["separate_async"]["missing_metrics"] == ["actor/pg_clipfrac"]
    assert out["v1_separate_async"].startswith("run as (c)")
    text = bench.table(out)
    assert "speedup c/b: step 4.50x" in text and "(c) verl-omni a1139baf" in text
    plain = bench.summarise([{k: v for k, v in _pass(4.0, 2.0, 8.0, 0).items()
                              if not k.startswith("separate_async")}], bench.BenchConfig(steps=3, repeat=1))
    assert "speedup_vs_separate_async" not in plain and plain["v1_separate_async"].startswith("not run")


def test_the_option_is_on_the_command_line(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    assert "--with-separate-async" in capsys.readouterr().out
    assert bench.BenchConfig(**vars(bench.parser().parse_args(["--with-separate-async"]))).with_separate_async


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_matrix_runs_each_recipe_in_each_of_verl_omnis_modes(name, tmp_path):
    recipe = RECIPES[name]
    stock = recipe.render("/m", "/d", "/d", switch_off=[k for k in recipe.blockers if k != f"{A}.rollout.name"],
                          extra=[*recipe.tiny, *bench.CPU])
    seen = {}
    for mode in matrix.MODES:
        entry, argv = matrix.argv_for(stock, mode, tmp_path, 2)
        backend = bench.value(argv, f"{A}.rollout.checkpoint_engine.backend")
        seen[mode] = (entry, bench.value(argv, "trainer.use_v1"), backend)
        assert bench.value(argv, "trainer.total_training_steps") == bench.value(argv, "trainer.test_freq") == "2"
        assert bench.value(argv, f"{A}.rollout.name") == "vllm_omni" and bench.value(argv, "trainer.device") == "cpu"
        if "rollout.seed=42" in " ".join(recipe.overrides):  # the script's own seeds stay
            assert bench.value(argv, f"{A}.rollout.seed") == "42"
    assert seen == {"v0": (bench.ENTRY, "false", "naive"), "sync": (bench.V1_ENTRY, "true", "naive"),
                    "separate_async": (bench.V1_ENTRY, "true", "gloo")}
    assert "| qwen | v0 | failed | 5 s | - | x / y |" in matrix.table(
        [{"recipe": "qwen", "mode": "v0", "passed": False, "seconds": 5.0, "steps_trained": [], "step_s": [],
          "validated": False, "reason": "x | y"}])


def test_the_matrix_switches_the_reward_models_pool_off_with_it(tmp_path):
    """SD3.5's script gives its (switched off) VLM reward model a pool of its own, which v0 would reserve anyway."""
    recipe = RECIPES["sd35_flowgrpo_lora_v1_separate_async"]
    stock = recipe.render("/m", "/d", "/d", switch_off=["reward.reward_model.enable"], extra=bench.CPU)
    assert bench.value(stock, "reward.reward_model.enable_resource_pool") == "True"
    for mode in matrix.MODES:
        assert bench.value(matrix.argv_for(stock, mode, tmp_path, 1)[1], "reward.reward_model.enable_resource_pool") \
            == "False"


def test_a_failures_reason_is_the_exception_it_raised():
    console = ("INFO x\n" + "['trainer.x=1', 'reward.custom_reward_function.name=compute_score_ocr'] " * 20 + "\n"
               "Traceback (most recent call last):\n  File x\n"
               "ray.exceptions.RayTaskError(ValueError): ray::TaskRunner\n"
               "ValueError: Total available GPUs 1.0 is less than total desired GPUs 2\n")
    assert matrix.reason(console) == ("ray.exceptions.RayTaskError(ValueError): ray::TaskRunner | ValueError: Total "
                                      "available GPUs 1.0 is less than total desired GPUs 2")
    assert matrix.reason("a\nb\n") == "a | b"


def test_each_recipes_prompts_take_its_own_data_scripts_layout():
    """verl-omni's data scripts: Qwen-Image's and Wan2.2's rows carry a negative-prompt chat (their CFG encodes it;
    Wan2.2's rollout fails on a row without one), SD3.5's the user turn only."""
    assert {r.architecture for r in RECIPES.values()} == set(bench.LAYOUTS)
    source, system, negative = bench.layout("WanPipeline")
    assert (source, system, negative) == ("dance_grpo/hpsv3", "", True)
    assert bench.layout("StableDiffusion3Pipeline") == ("flow_grpo/ocr", None, False)
    source, system, negative = bench.layout("QwenImagePipeline")
    assert source == "flow_grpo/ocr" and system and negative


def test_a_failed_pass_is_reported_and_the_finished_ones_count(monkeypatch, tmp_path, capsys):
    """A pass whose run fails (e.g. Ray's start timing out on a loaded host) is listed in `failed_passes`; the medians
    are the finished passes'; the command exits 1 with the JSON printed."""
    made = iter([_pass(4.0, 2.0, 8.0, 0.0), None, _pass(6.0, 2.0, 9.0, 0.0)])

    def one_pass(*args):
        row = next(made)
        if row is None:
            raise bench.RunFailed("run (stock) exited 1: The current node timed out during startup", "")
        return row

    monkeypatch.setattr(bench, "write_inputs", lambda data: STOCK)
    monkeypatch.setattr(bench, "one_pass", one_pass)
    monkeypatch.setattr(bench, "missing_verl_omni", lambda: None)
    rc = bench.main(["--repeat", "3", "--with-separate-async", "--json", "--keep", str(tmp_path / "k")])
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert rc == 1 and [f["pass"] for f in out["failed_passes"]] == [2]
    assert "timed out" in out["failed_passes"][0]["error"]
    assert out["rows"][0]["step_s_runs"] == [4.0, 6.0] and out["speedup_vs_separate_async"]["step_s"] == 4.25
