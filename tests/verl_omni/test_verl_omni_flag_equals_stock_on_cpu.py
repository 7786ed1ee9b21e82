"""Flip the flag on verl-omni's own trainer: the same training (issue 30 item 2, "Equivalence").

The same command line, the same seeds, float32 everywhere, two steps with a checkpoint after each, run twice:

(a) verl-omni's STOCK v0 trainer, `python -m verl_omni.trainer.main_diffusion`, no flag (colocated hybrid: its
    vLLM-Omni replica generates, its actor worker trains), with its validation at the last step as the recipe runs
    it; `test_verl_omnis_own_trainer_runs_its_recipe_on_cpu` holds what that run shows by itself (issue 30 item 1);
(b) the same with the flag, `trainer.trainer_class=digenrl` (the twin's command line of test_verl_omni_entry_points:
    1 generator + 1 trainer worker, staleness 0, GAP, TSP, TAG of one micro-batch on the trainer's copy of the
    pipeline; generators on verl-omni's Qwen-Image rollout pipeline in-process, trainers on verl-omni's actor worker
    with the TSP engine).

Every step's trainable (LoRA) weights, from each run's own checkpoint (`global_step_N/actor`), within 1e-5 (max |Δ| /
max |w| of the worst tensor), and its metrics (rewards, advantages, grad norm, clip fraction, loss) within 1e-5 (the
loss and the advantages' mean against the advantages' scale: means of ±A terms that nearly cancel). Measured
2026-12-07: weights 1.9e-6 / 2.0e-6 (steps 1, 2), rewards and advantages bit for bit, grad norm 1.1e-7 / 0, the
first gradient (the optimizer's first moment) 1.8e-6; (a) ~200 s, (b) ~100 s on this 2-core host.

The tiny Qwen-Image OCR LoRA recipe (`_stock_argv`: its override list, verl-omni's data layout with the negative
prompt column, a stand-in reward: the image's mean intensity), and for both runs (`SAME`):

* `rollout.seed`, `data.seed` (verl-omni samples and shuffles unseeded without them);
* float32: the rollout (`rollout.dtype`), the actor (`model_dtype`, `dtype`, mixed-precision `param_dtype`);
* `fsdp_config.full_determinism=True`: verl-omni seeds its fresh LoRA adapter with `fsdp_config.seed` only then
  (else A is drawn from the actor process's random state), and the flag's trainer keeps the adapter verl-omni drew;
* the LoRA targets of the recipe but `to_out.0`: vLLM-Omni 0.27's LoRA manager does not apply Qwen-Image's
  `attn.to_out.0` factors (`test_verl_omni_rollout_adapters_parity`), so from step 2 on verl-omni's replica samples
  without them while its actor trains them; the flag's generators merge every factor. With `to_out.0` the steps-2
  rewards differed by 3.2e-6 and the advantages by 2.9e-4; without it, bit for bit;
* AdamW's `eps` 1e-3 (`override_optimizer_config`): its step lr·g / (|g| + eps) is then linear in the gradient. At
  the default 1e-8, 2075 of the 24576 gradient entries of the LoRA B factors are below eps and the step turns their
  float differences (1.8e-6 of the tensor's largest gradient, as any rounding-level change gives: TSP off, rows
  sampled one by one, MKL's alignment-strict mode) into weights 8e-4 .. 1.2e-3 apart; verl-omni against itself,
  run with MKL_CBWR=AUTO,STRICT and without, is 1.8e-3 apart there;
* `engine_kwargs.vllm_omni.max_num_seqs=1`: vLLM-Omni 0.27 loses the outputs of a batch of requests on CPU now and
  then: its worker sends COMPUTE_DONE, then OUTPUT_READY from a thread with nothing to copy on CPU, and the
  executor's result pump can take OUTPUT_READY before the calling thread registers the batch's per-request ids
  (`MultiprocDiffusionExecutor.execute_batch`, `_batch_split_map`); the outputs are filed under the batch id and
  `step_streaming` waits 30 s for them (a TimeoutError, then RayTaskError(RuntimeError) from
  `vLLMOmniHttpServer.generate`). One request at a time takes the path that caches either order;
* no validation, `save_freq=1`, one agent-loop worker and no dataloader workers (processes on 2 cores).

What a CPU host needs besides this plugin installed (its platforms come from entry points, in every process): the
environment `VERL_PLATFORM=cpu` (verl never auto-detects it) and `DIGENRL_CPU_RAY_GPUS=1` (the replica's device slot
is one of Ray's logical GPUs: `+ray_kwargs.ray_init.num_gpus=1`), `rollout.rollout_attn_backend=TORCH_SDPA`,
`actor.strategy=fsdp2`, `model.attn_backend=native`; and, for the tiny model, `rollout.dtype=float32` (its text
encoder is saved in float32, which vLLM-Omni keeps, Qwen-Image's own is bfloat16). The prompts are in verl-omni's
`examples/flowgrpo_trainer/data_process/qwenimage_ocr.py` layout (system and user turns, a `negative_prompt` chat).

Mutation: ``DIGENRL_EQUIVALENCE_LOSS_SCALE=1.001`` puts `_loss_scale_hook` on the flag's run's PYTHONPATH (its
losses times 1.001, `_loss_scale_hook/sitecustomize.py`); the test must then fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# without verl-omni, or without its v0 hook, importing test_verl_omni_entry_points below skips this module with its
# declared reasons
if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import STAND_IN_REWARD, cpu_env, failure_summary  # noqa: E402
from test_verl_omni_entry_points import TWIN_EXTRA, TWIN_RUN_ELSEWHERE, TWINS, _twin_argv, check_twin_run  # noqa: E402

from digenrl_verl.integrations.verl_omni_recipes import RECIPES  # noqa: E402
from digenrl_verl.models._tiny_tokenizers import QWEN_IMAGE_SYSTEM as SYSTEM  # noqa: E402

A = "actor_rollout_ref"
RECIPE = RECIPES["qwen_image_flowgrpo_lora"]
CPU = ("trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1", f"{A}.rollout.nnodes=0",
       f"{A}.actor.strategy=fsdp2", f"{A}.model.attn_backend=native", f"{A}.rollout.rollout_attn_backend=TORCH_SDPA",
       f"{A}.rollout.dtype=float32", "+ray_kwargs.ray_init.num_gpus=1", "ray_kwargs.ray_init.num_cpus=16")


def _stock_argv(tmp_path: Path) -> list[str]:
    """The recipe's overrides for verl-omni's own entry point: tiny model, stand-in reward, verl-omni's data layout."""
    import pandas as pd

    from digenrl_verl.models.tiny import build_tiny_model_dir

    model = build_tiny_model_dir(RECIPE.architecture, tmp_path / "model", seed=0)
    for file, fn in RECIPE.reward_files.items():
        (tmp_path / file).write_text(STAND_IN_REWARD.format(name=fn))
    rows = [{"data_source": "flow_grpo/ocr",
             "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f'A sign that reads "{w}"'}],
             "negative_prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": " "}],
             "reward_model": {"ground_truth": w, "style": "rule"}} for w in ("HELLO", "RL", "GPU", "PIPELINE")]
    for split in ("train", "test"):
        pd.DataFrame(rows).to_parquet(tmp_path / f"{split}.parquet")
    blockers = [k for k in RECIPE.blockers if k != f"{A}.rollout.name"]  # verl-omni's own rollout, vLLM-Omni
    return RECIPE.render(str(model), str(tmp_path), str(tmp_path), switch_off=blockers,
                         extra=[*RECIPE.tiny, *CPU, f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
                                # vLLM-Omni 0.27 loses a request batch's outputs on CPU now and then (its result
                                # pump files them before the per-request ids exist: patches/vllm-omni-0.27.0rc1)
                                f"+{A}.rollout.engine_kwargs.vllm_omni.max_num_seqs=1"])


NAME = RECIPE.name
STEPS = 2
TOL = 1e-5
#: both runs (see the module docstring)
SAME = (f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1", "trainer.test_freq=-1",
        f"{A}.rollout.seed=7", "data.seed=1", f"{A}.rollout.dtype=float32", f"{A}.actor.fsdp_config.model_dtype=fp32",
        f"{A}.actor.fsdp_config.dtype=float32", f"+{A}.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        f"{A}.actor.fsdp_config.full_determinism=True",
        f"{A}.model.target_modules=['to_q','to_k','to_v','add_q_proj','add_k_proj','add_v_proj','to_add_out',"
        "'img_mlp.net.0.proj','img_mlp.net.2','txt_mlp.net.0.proj','txt_mlp.net.2']",
        f"+{A}.actor.optim.override_optimizer_config={{eps:1e-3}}",
        f"+{A}.rollout.engine_kwargs.vllm_omni.max_num_seqs=1", f"{A}.rollout.agent.num_workers=1",
        "data.dataloader_num_workers=0")
#: the flag's run: verl-omni's rollout pipeline and actor worker, staleness 0, TAG of one micro-batch
FLAG = (f"{A}.rollout.name=vllm_omni", "trainer.digenrl.trainer_engine=verl_omni", "trainer.digenrl.tcss.staleness=0",
        "trainer.digenrl.gap=true", "trainer.digenrl.tsp.enabled=true", "trainer.digenrl.tag.policy=static",
        "trainer.digenrl.tag.static_k=1")
#: the stock run only: verl-omni's validation at its last step, as the recipe runs it (after the step's update:
#: no weight or training metric of the step depends on it)
STOCK_ONLY = (f"trainer.test_freq={STEPS}",)
#: the stock run's files the flag's run reads too (the model, the data, the reward)
SHARED_KEYS = ("data.train_files", "data.val_files", f"{A}.model.path", "reward.custom_reward_function.path")
MUTATION_VAR = "DIGENRL_EQUIVALENCE_LOSS_SCALE"
#: step metrics compared, and the scale their difference is measured against (None: the value itself)
METRICS = {"critic/rewards/mean": None, "critic/rewards/max": None, "critic/rewards/min": None,
           "critic/advantages/max": None, "critic/advantages/min": None,
           "critic/advantages/mean": "critic/advantages/max", "actor/grad_norm": None,
           "actor/pg_clipfrac": 1.0, "actor/loss": "critic/advantages/max"}


@dataclass
class Run:
    """One run's console, per-step metrics (global step -> name -> value), checkpoints, wall time, command line and
    folder."""

    console: str
    steps: dict[int, dict[str, float]]
    checkpoints: Path
    seconds: float
    argv: list[str]
    out: Path


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _with(argv: list[str], extra) -> list[str]:
    """`argv` with each override of `extra` replacing the one of its key in place, else appended."""
    out = list(argv)
    for o in extra:
        hits = [i for i, a in enumerate(out) if _key(a) == _key(o)]
        if hits:
            out[hits[0]] = o
        else:
            out.append(o)
    return out


def _console_steps(console: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines (`step:N - name:value - ...`) as numbers, by step."""
    steps = {}
    for line in console.splitlines():
        found = re.search(r"\bstep:(\d+) - (.*)$", line)
        if found:
            pairs = re.findall(r"([\w/@.-]+):(?:np\.float64\()?(-?[\d.e+-]+)", found.group(2))
            steps[int(found.group(1))] = {name: float(value) for name, value in pairs}
    return steps


def _run(cmd: list[str], cwd: Path, env: dict) -> tuple[str, float]:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    console = proc.stdout + proc.stderr
    (cwd / "console.log").write_text(console)
    assert proc.returncode == 0, failure_summary(console)
    return console, time.monotonic() - start


def _stock(out: Path, stock: list[str]) -> Run:
    """(a): verl-omni's own trainer, no flag, validating at its last step."""
    out.mkdir()
    argv = _with(stock, [*SAME, f"trainer.default_local_dir={out / 'checkpoints'}",
                         f"trainer.rollout_data_dir={out / 'rollout_data'}", *STOCK_ONLY])
    assert f"{A}.rollout.name=vllm_omni" in argv and not [a for a in argv if "digenrl" in a]  # no flag
    env = cpu_env(HF_HUB_OFFLINE="1", TORCH_COMPILE_DISABLE="1", RAY_USAGE_STATS_ENABLED="0",
                  TOKENIZERS_PARALLELISM="false", DIGENRL_CPU_RAY_GPUS="1")
    env.pop("VERL_USE_EXTERNAL_MODULES", None)  # the plugin's verl.plugins entry point registers the platform
    console, seconds = _run([sys.executable, "-m", TWINS[NAME], *argv, f"hydra.run.dir={out / 'hydra'}"], out, env)
    return Run(console, _console_steps(console), out / "checkpoints", seconds, argv, out)


def _flag(out: Path, stock: list[str]) -> Run:
    """(b): the same command line through verl-omni's entry point with the flag (the twin's layout keys)."""
    out.mkdir()
    shared = [a for a in stock if _key(a) in SHARED_KEYS]
    argv = _twin_argv(NAME, out, extra=(*FLAG, *shared, *SAME))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCH_COMPILE_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "TOKENIZERS_PARALLELISM": "false", "VERL_PLATFORM": "cpu"}
    if os.environ.get(MUTATION_VAR):
        hook = str(Path(__file__).resolve().parent / "_loss_scale_hook")
        env["PYTHONPATH"] = os.pathsep.join([hook, *filter(None, [env.get("PYTHONPATH")])])
    console, seconds = _run([sys.executable, "-m", TWINS[NAME], *argv, f"hydra.run.dir={out / 'hydra'}"], out, env)
    lines = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = {int(m["training/global_step"]): m for m in lines if "actor/grad_norm" in m}
    return Run(console, steps, out / "run" / "checkpoints", seconds, argv, out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Run, Run]:
    root = tmp_path_factory.mktemp("flag_vs_stock")
    (root / "data").mkdir()
    stock = _stock_argv(root / "data")  # the tiny model, the reward file, the prompts in verl-omni's layout
    a, b = _stock(root / "stock", stock), _flag(root / "flag", stock)
    print(f"\nverl-omni's stock trainer: {a.seconds:.0f} s; the flag: {b.seconds:.0f} s ({STEPS} steps each)")
    return a, b


def _actor_file(root: Path, step: int, kind: str) -> dict:
    import torch

    return torch.load(root / f"global_step_{step}" / "actor" / f"{kind}_world_size_1_rank_0.pt", map_location="cpu",
                      weights_only=False)


def _local(t):
    return (t.to_local() if hasattr(t, "to_local") else t).detach().float()


def _worst(ours: dict, theirs: dict) -> tuple[float, str]:
    """The largest max |ours - theirs| / max |theirs| over the tensors, and its tensor."""
    assert ours.keys() == theirs.keys() and ours
    return max((float((ours[k] - theirs[k]).abs().max() / theirs[k].abs().max().clamp_min(1e-30)), str(k))
               for k in theirs)


def _metric_errors(a: dict, b: dict) -> dict[str, float]:
    """|b - a| / scale for each compared metric (METRICS), a being verl-omni's."""
    out = {}
    for name, scale in METRICS.items():
        ref = abs(a[name]) if scale is None else (abs(a[scale]) if isinstance(scale, str) else scale)
        out[name] = abs(b[name] - a[name]) / max(ref, 1e-30)
    return out


def _lora(run: Run, step: int) -> dict:
    return {k: _local(v) for k, v in _actor_file(run.checkpoints, step, "model").items() if "lora_" in k}


def _first_gradient(run: Run) -> dict:
    """The optimizer's first moment after its first step (0.1 x the gradient), per parameter with a gradient."""
    moments = {k: _local(s["exp_avg"]) for k, s in _actor_file(run.checkpoints, 1, "optim")["state"].items()
               if "exp_avg" in s}
    return {k: m for k, m in moments.items() if bool(m.abs().max() > 0)}


@pytest.mark.slow
def test_every_step_trains_what_verl_omnis_trainer_trains(runs):
    """Each step's LoRA weights and metrics within 1e-5 of verl-omni's own trainer's (module docstring)."""
    a, b = runs
    assert sorted(a.steps) == sorted(b.steps) == list(range(1, STEPS + 1))
    failures = []
    for step in range(1, STEPS + 1):
        worst, name = _worst(_lora(b, step), _lora(a, step))
        errors = _metric_errors(a.steps[step], b.steps[step])
        print(f"step {step}: weights' worst tensor {name}: {worst:.2e}\n  metrics, verl-omni's / the flag's / "
              f"difference: { {k: (a.steps[step][k], b.steps[step][k], f'{e:.1e}') for k, e in errors.items()} }")
        failures += [f"step {step} weights {name} {worst:.2e}"] * (not worst <= TOL)
        failures += [f"step {step} {k} {e:.2e}" for k, e in errors.items() if not e <= TOL]
    theirs = _first_gradient(a)
    ours = _first_gradient(b)
    worst, name = _worst({k: ours[k] for k in theirs}, theirs)
    print(f"step 1 gradient: worst tensor (optimizer state {name}) {worst:.2e}")
    assert theirs.keys() == ours.keys() and theirs
    assert not failures and worst <= TOL, failures


@pytest.mark.slow
def test_verl_omnis_own_trainer_runs_its_recipe_on_cpu(runs):
    """Run (a) by itself: verl-omni's own trainer, no flag, `rollout.name=vllm_omni` (its hybrid vLLM-Omni replica
    on the actor's slot, through the package's CPU platforms), trains its Qwen-Image LoRA recipe on CPU: every step
    a real update that the stand-in reward scored, its validation at the last step, its checkpoints."""
    a, _ = runs
    for step, metrics in a.steps.items():
        assert metrics["actor/grad_norm"] > 0, (step, metrics)  # a real update of the LoRA weights
        assert 0 < metrics["critic/rewards/mean"] < 1, (step, metrics)  # the reward scored the replica's images
        assert metrics["critic/rewards/group_size"] == 2, (step, metrics)  # tiny: rollout.n=2
        assert (a.checkpoints / f"global_step_{step}" / "actor").is_dir()  # verl-omni's own checkpoint
    validation = [k for k in a.steps[STEPS] if k.startswith("val-core/")]
    assert validation and not [k for k in a.steps[1] if k.startswith("val-core/")], validation


@pytest.mark.slow
def test_the_flags_run_passes_the_qwen_image_twins_checks(runs):
    """Run (b) is the Qwen-Image twin of test_verl_omni_entry_points (its command line, TWIN_EXTRA's overrides among
    FLAG's, two steps): it passes the twin's checks (`check_twin_run`), which the twin's own test leaves to it."""
    _, b = runs
    assert NAME == TWIN_RUN_ELSEWHERE and set(TWIN_EXTRA) <= set(b.argv), sorted(set(TWIN_EXTRA) - set(b.argv))
    check_twin_run(NAME, b.console, b.out / "run", b.argv, b.out, steps=STEPS)
