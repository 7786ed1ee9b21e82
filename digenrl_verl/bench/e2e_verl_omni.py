"""`python -m digenrl_verl.bench e2e --baseline verl_omni`: the flag against verl-omni's own trainer (issue 30).

The same command line, the same seeds, float32 everywhere, `--steps` steps with a checkpoint after each, run as two
subprocesses, (a) then (b), `--repeat` times:

(a) verl-omni's STOCK v0 trainer, `python -m verl_omni.trainer.main_diffusion`, no flag (colocated hybrid: its
    vLLM-Omni replica generates, its actor worker trains), with its validation at the last step as the recipe runs
    it (`STOCK_ONLY`);
(b) the same with the flag, `trainer.trainer_class=digenrl` (the Qwen-Image twin's command line of
    tests/verl_omni/test_verl_omni_entry_points.py, `flag_argv`: 1 generator + 1 trainer worker, staleness 0, GAP,
    TSP, TAG of one micro-batch on the trainer's copy of the pipeline; generators on verl-omni's Qwen-Image rollout
    pipeline in-process, trainers on verl-omni's actor worker with the TSP engine).

Reported (medians over the repeats): each run's step time, verl's `timing_s/step` that both log (verl-omni: its
`marked_timer("step")`, generation to the weight update of the rollout, its checkpoint save included, its validation
(`timing_s/testing`) not; the flag: the step's first task start to the end of its weight SYNC), the median over a
run's steps; the whole process's wall time (interpreter start to exit: imports, Ray, model loads, every step and each
run's own end-of-run evaluation: (a)'s validation, (b)'s final evaluation); `speedup` = a / b of both, also pass by
pass; `max_weight_rel_err`: every step's LoRA weights of (b) against (a)'s, from each run's own checkpoint
(`global_step_N/actor/model_world_size_1_rank_0.pt`), max |Δ| / max |w| of the worst tensor (`worst`); the step
metrics of `METRICS` likewise (`max_metric_rel_err`); both runs' reward curves (`CURVE_METRIC` by step).
`--staleness 1` runs (b) with TCSS one version ahead: its weights differ by design (`within_tolerance` null), and the
reward curves are the comparison.

`--with-separate-async` adds a third run to every pass, after (b):

(c) verl-omni's OWN disaggregated mode, v1 `separate_async`: `python -m verl_omni.trainer.main_diffusion_v1` on
    (a)'s command line plus `SEPARATE_ASYNC` (`separate_async_argv`): `trainer.use_v1=true
    trainer.v1.trainer_mode=separate_async` with the on-policy settings of verl-omni's SD3.5 example
    (`run_sd35_medium_ocr_lora_v1_separate_async.sh`: `sync_compatible=1`, `parameter_sync_step=1`,
    `max_off_policy_threshold=1`, no warm-up batch), one standalone rollout replica (`rollout.nnodes=1`,
    `rollout.n_gpus_per_node=1`: on CPU one of Ray's logical GPUs, so `ray_init.num_gpus=2`, the actor's pool holding
    the other) beside the actor's colocated one, and the standalone replica's weights over the package's gloo
    checkpoint engine (`digenrl_verl.weights.gloo_checkpoint_engine`, loaded by verl's own `custom_backend_module`
    key: verl-omni asserts a non-`naive` backend there, `trainer_separate_async.py:98`, and verl's `nccl` needs
    CUDA). Nothing of verl-omni is patched for it. Its `timing_s/step` covers what (a)'s does (generation on the
    standalone replica to its weight update, the checkpoint save), its validation not. Its weights are compared
    with (a)'s (`separate_async_vs_stock`; metrics that either does not log are listed, not compared) and the JSON
    adds `speedup_vs_separate_async` = c / b. v1 orders a step's batch as its trajectories reach verl-omni's
    TransferQueue (verl's `ReplayBuffer.sample`), not in the dataloader's order as v0 does, so its sums over the batch
    round differently (docs/benchmarks.md has what that measured).

The tiny Qwen-Image OCR LoRA recipe (`write_inputs`: its override list, verl-omni's data layout with the negative
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
environment `VERL_PLATFORM=cpu` (verl never auto-detects it) and, for (a), `DIGENRL_CPU_RAY_GPUS=1` (the replica's
device slot is one of Ray's logical GPUs: `+ray_kwargs.ray_init.num_gpus=1`), and on the command line `CPU`:
`rollout.rollout_attn_backend=TORCH_SDPA`, `actor.strategy=fsdp2`, `model.attn_backend=native`; and, for the tiny
model, `rollout.dtype=float32` (its text encoder is saved in float32, which vLLM-Omni keeps, Qwen-Image's own is
bfloat16). The prompts are in verl-omni's `examples/flowgrpo_trainer/data_process/qwenimage_ocr.py` layout (system
and user turns, a `negative_prompt` chat).

Needs verl-omni a1139baf with the v0 hook of patches/verl-omni-a1139baf/ (`bash scripts/test_verl_omni.sh` builds
`.venv-verl-omni` and applies it); run it with that venv's interpreter:
`source scripts/verl_omni_venv.sh && $VERL_OMNI_PY -m digenrl_verl.bench e2e --baseline verl_omni --json`.
Everything verl-omni-specific is imported inside the functions, so this module imports without it.
`--keep DIR` keeps every run's folder (`DIR/data`: the model, prompts and reward; `DIR/pass<k>/{stock,flag}`: each
run's `console.log`, `run.json` with its command line and wall time, checkpoints); `load_run` reads one back.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from digenrl_verl.integrations.verl_omni_recipes import RECIPES, STAND_IN_REWARD, _key, _set

A = "actor_rollout_ref"
RECIPE_NAME = "qwen_image_flowgrpo_lora"
ENTRY = "verl_omni.trainer.main_diffusion"  # both runs: verl-omni's v0 entry point, as the recipe's script calls it
BASELINE = "verl-omni a1139baf stock main_diffusion (v0, colocated hybrid)"
CANDIDATE = ("the same command line with trainer.trainer_class=digenrl (disaggregated: 1 generator + 1 trainer "
             "worker, staleness 0, GAP, TSP, TAG of one micro-batch)")
#: (c), with `--with-separate-async`: verl-omni's own disaggregated mode, its v1 entry point as the SD3.5 example
#: calls it (`run_sd35_medium_ocr_lora_v1_separate_async.sh`)
V1_ENTRY = "verl_omni.trainer.main_diffusion_v1"
SEPARATE_ASYNC_BASELINE = ("verl-omni a1139baf stock main_diffusion_v1 (v1 separate_async: its standalone vLLM-Omni "
                           "rollout replica on a device of its own, on-policy as its SD3.5 example: sync_compatible, "
                           "parameter_sync_step 1, max_off_policy_threshold 1, no warm-up)")
V1_SEPARATE_ASYNC = f"run as (c) with --with-separate-async: {SEPARATE_ASYNC_BASELINE}"
#: (c)'s overrides on (a)'s command line (module docstring): verl-omni's v1 selection and the SD3.5 example's own
#: on-policy settings, its standalone replica (one node of one device: on CPU one of Ray's logical GPUs, the actor's
#: pool holding the other), its weights to that replica over the package's gloo checkpoint engine (verl-omni refuses
#: `naive` there and verl's `nccl` needs CUDA), and verl-omni's TransferQueue with one storage unit
SEPARATE_ASYNC = ("trainer.use_v1=true", "trainer.v1.trainer_mode=separate_async",
                  "trainer.v1.separate_async.num_warmup_batches=0", "trainer.v1.separate_async.parameter_sync_step=1",
                  "trainer.v1.separate_async.sync_compatible=1", "trainer.v1.sampler.max_off_policy_threshold=1",
                  "trainer.v1.sampler.max_off_policy_strategy=drop",
                  f"{A}.rollout.nnodes=1", f"{A}.rollout.n_gpus_per_node=1",
                  f"{A}.rollout.checkpoint_engine.backend=gloo",
                  f"{A}.rollout.checkpoint_engine.custom_backend_module=digenrl_verl.weights.gloo_checkpoint_engine",
                  "+ray_kwargs.ray_init.num_gpus=2", "transfer_queue.backend.SimpleStorage.num_data_storage_units=1")
STEP_METRIC = "timing_s/step"
DEFAULT_STEPS = 3
TOL = 1e-5
#: (a)'s CPU keys (module docstring); (b) takes them from the twin's layout keys
CPU = ("trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1", f"{A}.rollout.nnodes=0",
       f"{A}.actor.strategy=fsdp2", f"{A}.model.attn_backend=native", f"{A}.rollout.rollout_attn_backend=TORCH_SDPA",
       f"{A}.rollout.dtype=float32", "+ray_kwargs.ray_init.num_gpus=1", "ray_kwargs.ray_init.num_cpus=16")
#: both runs (module docstring), after `trainer.total_training_steps` (`same`)
SAME = ("trainer.save_freq=1", "trainer.test_freq=-1",
        f"{A}.rollout.seed=7", "data.seed=1", f"{A}.rollout.dtype=float32", f"{A}.actor.fsdp_config.model_dtype=fp32",
        f"{A}.actor.fsdp_config.dtype=float32", f"+{A}.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        f"{A}.actor.fsdp_config.full_determinism=True",
        f"{A}.model.target_modules=['to_q','to_k','to_v','add_q_proj','add_k_proj','add_v_proj','to_add_out',"
        "'img_mlp.net.0.proj','img_mlp.net.2','txt_mlp.net.0.proj','txt_mlp.net.2']",
        f"+{A}.actor.optim.override_optimizer_config={{eps:1e-3}}",
        f"+{A}.rollout.engine_kwargs.vllm_omni.max_num_seqs=1", f"{A}.rollout.agent.num_workers=1",
        "data.dataloader_num_workers=0")
#: the flag's run: verl-omni's rollout pipeline and actor worker, staleness 0, TAG of one micro-batch (every step's
#: checkpoint is kept by both runs: verl-omni's `trainer.max_actor_ckpt_to_keep: null`, which the flag reads too)
FLAG = (f"{A}.rollout.name=vllm_omni", "trainer.digenrl.trainer_engine=verl_omni", "trainer.digenrl.tcss.staleness=0",
        "trainer.digenrl.gap=true", "trainer.digenrl.tsp.enabled=true", "trainer.digenrl.tag.policy=static",
        "trainer.digenrl.tag.static_k=1")
#: the stock run's files the flag's run reads too (the model, the data, the reward)
SHARED_KEYS = ("data.train_files", "data.val_files", f"{A}.model.path", "reward.custom_reward_function.path")
#: step metrics compared, and the scale their difference is measured against (None: the value itself; a name: that
#: metric's value, for means of ±A terms that nearly cancel; a number: itself)
METRICS = {"critic/rewards/mean": None, "critic/rewards/max": None, "critic/rewards/min": None,
           "critic/advantages/max": None, "critic/advantages/min": None,
           "critic/advantages/mean": "critic/advantages/max", "actor/grad_norm": None,
           "actor/pg_clipfrac": 1.0, "actor/loss": "critic/advantages/max"}
#: both runs' environment: verl's CPU platform (the plugin's verl.plugins entry point registers it, so no
#: VERL_USE_EXTERNAL_MODULES), offline, no compilation
ENV = {"HF_HUB_OFFLINE": "1", "TORCH_COMPILE_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0",
       "TOKENIZERS_PARALLELISM": "false", "VERL_PLATFORM": "cpu"}
#: (a), (c): the replicas' device slots are Ray's logical GPUs; and a Ray instance of their own: verl-omni's
#: `ray.init()` without an address joins the latest Ray instance found on the host (`ray start`'s, another session's),
#: where its `num_cpus` / `num_gpus` are refused ("When connecting to an existing cluster, num_cpus and num_gpus must
#: not be provided"; seen on this shared host). (b)'s entry point starts its own unless RAY_ADDRESS names one.
STOCK_ENV = {"DIGENRL_CPU_RAY_GPUS": "1", "RAY_ADDRESS": "local"}
#: the entry point of each run kind
ENTRIES = {"stock": ENTRY, "flag": ENTRY, "separate_async": V1_ENTRY}
#: each run kind's name in the progress lines, the table and the JSON
NAMES = {"stock": f"(a) {BASELINE}", "flag": "(b) trainer.trainer_class=digenrl",
         "separate_async": f"(c) {SEPARATE_ASYNC_BASELINE}"}
REFUSED = ("--baseline verl_omni needs verl-omni a1139baf with its v0 hook (patches/verl-omni-a1139baf/), which "
           "{why}; build the tier venv once with `bash scripts/test_verl_omni.sh` (or `bash scripts/verl_omni_venv.sh` "
           "and the patches it applies) and run `source scripts/verl_omni_venv.sh && $VERL_OMNI_PY -m "
           "digenrl_verl.bench e2e --baseline verl_omni`")


def same(steps: int) -> tuple[str, ...]:
    """Both runs' overrides for `steps` steps."""
    return (f"trainer.total_training_steps={steps}", *SAME)


def stock_only(steps: int) -> tuple[str, ...]:
    """The stock run only: verl-omni's validation at its last step, as the recipe runs it (after the step's update:
    no weight or training metric of the step depends on it; not in `timing_s/step`)."""
    return (f"trainer.test_freq={steps}",)


def missing_verl_omni() -> str | None:
    """Why this interpreter cannot run the baseline (with the fix), else None; imports nothing of verl-omni."""
    spec = importlib.util.find_spec("verl_omni")
    if spec is None or not spec.origin:
        return REFUSED.format(why=f"{sys.executable} cannot import (verl_omni is not installed)")
    hook = Path(spec.origin).parent / "trainer" / "external_trainer.py"
    if not hook.is_file():
        return REFUSED.format(why=f"the verl-omni at {Path(spec.origin).parent} lacks ({hook.name} is missing)")
    return None


@dataclass(frozen=True)
class BenchConfig:
    """The bench's options (`parser`): steps of each run, paired runs, the folder kept (None: a temporary one), a
    folder put first on (b)'s PYTHONPATH only, (b)'s TCSS staleness (1: the weights differ by design; the reward
    curves are the comparison)."""

    steps: int = DEFAULT_STEPS
    repeat: int = 5
    keep: str | None = None
    flag_pythonpath: str | None = None
    json: bool = False
    staleness: int = 0
    with_separate_async: bool = False

    def __post_init__(self):
        if self.steps < 1 or self.repeat < 1:
            raise ValueError(f"--steps {self.steps} / --repeat {self.repeat}: each must be >= 1")
        if self.staleness not in (0, 1):
            raise ValueError(f"--staleness {self.staleness}: trainer.digenrl.tcss.staleness is 0 or 1")


# ------------------------------------------------------------------------------------------ the command lines
def with_overrides(argv: list[str], extra) -> list[str]:
    """`argv` with each override of `extra` replacing the one of its key in place, else appended."""
    out = list(argv)
    for o in extra:
        out = _set(out, o)
    return out


#: architecture -> the prompt rows' layout of verl-omni's data script for it: data_source, the system turn (None: no
#: system turn), a negative-prompt chat (user turn " ") beside the prompt. Qwen-Image:
#: `flowgrpo_trainer/data_process/qwenimage_ocr.py`; SD3.5: `flowgrpo_trainer/data_process/sd3_ocr.py` (user turn
#: only); Wan2.2: `dancegrpo_trainer/data_process/wan22_hpsv3.py` (an empty system turn and the negative prompt, which
#: its CFG encodes: without the column its rollout fails in `encode_prompt`, `prompt_ids.ndim` of None)
LAYOUTS = {"QwenImagePipeline": ("flow_grpo/ocr", "QWEN_IMAGE_SYSTEM", True),
           "StableDiffusion3Pipeline": ("flow_grpo/ocr", None, False),
           "WanPipeline": ("dance_grpo/hpsv3", "", True)}


def layout(architecture: str) -> tuple[str, str | None, bool]:
    """`LAYOUTS[architecture]` with Qwen-Image's system prompt (the tiny tokenizer's) filled in."""
    from digenrl_verl.models._tiny_tokenizers import QWEN_IMAGE_SYSTEM

    source, system, negative = LAYOUTS[architecture]
    return source, QWEN_IMAGE_SYSTEM if system == "QWEN_IMAGE_SYSTEM" else system, negative


def write_inputs(data: Path, recipe_name: str = RECIPE_NAME) -> list[str]:
    """The recipe's overrides for verl-omni's own entry point, the files they name written under `data`: the tiny
    model, the stand-in reward, the prompts in the layout of the recipe's own data script (`LAYOUTS`). Any recipe of
    `RECIPES` (`verl_omni_matrix` runs each); the bench's is `RECIPE_NAME`."""
    import pandas as pd

    from digenrl_verl.models.tiny import build_tiny_model_dir

    recipe = RECIPES[recipe_name]
    model = build_tiny_model_dir(recipe.architecture, data / "model", seed=0)
    for file, fn in recipe.reward_files.items():
        (data / file).write_text(STAND_IN_REWARD.format(name=fn))
    source, system, negative = layout(recipe.architecture)
    turns = [{"role": "system", "content": system}] if system is not None else []
    rows = [{"data_source": source, "prompt": [*turns, {"role": "user", "content": f'A sign that reads "{w}"'}],
             **({"negative_prompt": [*turns, {"role": "user", "content": " "}]} if negative else {}),
             "reward_model": {"ground_truth": w, "style": "rule"}} for w in ("HELLO", "RL", "GPU", "PIPELINE")]
    for split in ("train", "test"):
        pd.DataFrame(rows).to_parquet(data / f"{split}.parquet")
    blockers = [k for k in recipe.blockers if k != f"{A}.rollout.name"]  # verl-omni's own rollout, vLLM-Omni
    return recipe.render(str(model), str(data), str(data), switch_off=blockers,
                         extra=[*recipe.tiny, *CPU, f"trainer.default_local_dir={data / 'checkpoints'}",
                                # vLLM-Omni 0.27 loses a request batch's outputs on CPU now and then (its result
                                # pump files them before the per-request ids exist: patches/vllm-omni-0.27.0rc1)
                                f"+{A}.rollout.engine_kwargs.vllm_omni.max_num_seqs=1"])


def stock_argv(stock: list[str], out: Path, steps: int) -> list[str]:
    """(a)'s command line: the recipe's, `same`, its checkpoints and rollout dumps under `out`, `stock_only`."""
    return with_overrides(stock, [*same(steps), f"trainer.default_local_dir={out / 'checkpoints'}",
                                  f"trainer.rollout_data_dir={out / 'rollout_data'}", *stock_only(steps)])


def shared_files(stock: list[str]) -> list[str]:
    """The overrides of `stock` that name its files (`SHARED_KEYS`), in its order."""
    return [a for a in stock if _key(a) in SHARED_KEYS]


def flag_argv(stock: list[str], out: Path, steps: int, staleness: int = 0) -> list[str]:
    """(b)'s command line: the Qwen-Image twin's of test_verl_omni_entry_points (`_twin_argv(RECIPE_NAME, out,
    extra=...)`, a test holds them equal), reading (a)'s model, data and reward (`SHARED_KEYS`), plus `FLAG` and
    `same`; its output in `out/run`, checkpoints in `out/run/checkpoints`; `staleness` 1: TCSS one version ahead.
    Writes nothing."""
    from digenrl_verl.integrations.verl_omni import ENTRY_POINT_NAME

    recipe, run = RECIPES[RECIPE_NAME], out / "run"
    return recipe.render(str(out / "model"), str(out), str(out),
                         switch_off=[k for k in recipe.blockers if k != "trainer.use_v1"],
                         extra=[*recipe.tiny, "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=2",
                                f"{A}.rollout.nnodes=0", f"trainer.digenrl.output_dir={run}",
                                f"{A}.actor.strategy=fsdp2", f"{A}.model.attn_backend=native",
                                f"trainer.default_local_dir={run}/checkpoints",
                                f"trainer.trainer_class={ENTRY_POINT_NAME}", *FLAG, *shared_files(stock), *same(steps),
                                *([f"trainer.digenrl.tcss.staleness={staleness}"] if staleness else [])])


def separate_async_argv(stock: list[str], out: Path, steps: int) -> list[str]:
    """(c)'s command line: (a)'s (`stock_argv`, its checkpoints under `out`) with `SEPARATE_ASYNC`, for `V1_ENTRY`."""
    return with_overrides(stock_argv(stock, out, steps), SEPARATE_ASYNC)


# ------------------------------------------------------------------------------------------ the runs
@dataclass
class Run:
    """One run's kind ("stock", "flag" or "separate_async"), console, per-step metrics (global step -> name ->
    value), checkpoints, wall time, command line and folder."""

    kind: str
    console: str
    steps: dict[int, dict[str, float]]
    checkpoints: Path
    seconds: float
    argv: list[str]
    out: Path


class RunFailed(RuntimeError):
    """A run exited with an error; its console is in `console` (also `<its folder>/console.log`)."""

    def __init__(self, message: str, console: str):
        super().__init__(message)
        self.console = console


def console_steps(console: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines (`step:N - name:value - ...`) as numbers, by step."""
    steps = {}
    for line in console.splitlines():
        found = re.search(r"\bstep:(\d+) - (.*)$", line)
        if found:
            pairs = re.findall(r"([\w/@.-]+):(?:np\.float64\()?(-?[\d.e+-]+)", found.group(2))
            steps[int(found.group(1))] = {name: float(value) for name, value in pairs}
    return steps


def run_env(kind: str, pythonpath: str | None = None) -> dict:
    """The environment of run `kind`: this one, `ENV` (and `STOCK_ENV` for verl-omni's own runs), `pythonpath` first
    on the flag's run's PYTHONPATH (e.g. a test's sitecustomize mutation)."""
    env = {**os.environ, **ENV, **(STOCK_ENV if kind != "flag" else {})}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)  # the plugin's verl.plugins entry point registers the platform
    if kind == "flag" and pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _execute(kind: str, argv: list[str], out: Path, env: dict) -> None:
    """`python -m <its entry point> argv` (`ENTRIES[kind]`) in `out`; its console in `out/console.log`, `out/run.json`
    its kind, command line and wall time (interpreter start to exit). Raises RunFailed on a non-zero exit."""
    entry = ENTRIES[kind]
    cmd = [sys.executable, "-m", entry, *argv, f"hydra.run.dir={out / 'hydra'}"]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - start
    console = proc.stdout + proc.stderr
    (out / "console.log").write_text(console)
    (out / "run.json").write_text(json.dumps({"kind": kind, "argv": argv, "seconds": seconds,
                                              "returncode": proc.returncode}))
    if proc.returncode != 0:
        raise RunFailed(f"run ({kind}) `python -m {entry}` exited {proc.returncode} after {seconds:.0f} s; its "
                        f"console: {out / 'console.log'}; its last lines:\n{console[-3000:]}", console)


def load_run(out: Path) -> Run:
    """A finished run read back from its folder (`console.log`, `run.json`; the flag's metrics.jsonl)."""
    meta = json.loads((out / "run.json").read_text())
    console = (out / "console.log").read_text()
    if meta["kind"] != "flag":  # verl-omni's own trainers: verl's console logger
        return Run(meta["kind"], console, console_steps(console), out / "checkpoints", meta["seconds"], meta["argv"],
                   out)
    lines = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = {int(m["training/global_step"]): m for m in lines if "actor/grad_norm" in m}
    return Run("flag", console, steps, out / "run" / "checkpoints", meta["seconds"], meta["argv"], out)


def ahead_overrides(steps: int, staleness: int) -> list[str]:
    """Both runs' overrides at (b)'s `staleness` 1: one checkpoint, after the last step (a checkpoint after every
    step is a barrier: TCSS would never run ahead, `trainer.config.warn_barrier_every_step`)."""
    return [f"trainer.save_freq={steps}"] if staleness else []


def run_pair(stock: list[str], root: Path, steps: int, pythonpath: str | None = None,
             label: str = "", staleness: int = 0, separate_async: bool = False) -> tuple[Run, ...]:
    """(a) then (b) (at `staleness`) in `root/stock` and `root/flag`, then, with `separate_async`, (c) in
    `root/separate_async`; a progress line before each (prefixed by `label`)."""
    runs = []
    ahead = ahead_overrides(steps, staleness)
    argvs = {"stock": lambda out: with_overrides(stock_argv(stock, out, steps), ahead),
             "flag": lambda out: with_overrides(flag_argv(stock, out, steps, staleness), ahead),
             "separate_async": lambda out: with_overrides(separate_async_argv(stock, out, steps), ahead)}
    but = f", but TCSS staleness {staleness}" if staleness else ""
    names = [("stock", f"(a) {BASELINE}"), ("flag", f"(b) {CANDIDATE}{but}")]
    names += [("separate_async", NAMES["separate_async"])] if separate_async else []
    for kind, name in names:
        out = root / kind
        out.mkdir(parents=True)
        print(f"{label}: {name}: {steps} step(s) in {out} ...", flush=True)
        _execute(kind, argvs[kind](out), out, run_env(kind, pythonpath))
        runs.append(load_run(out))
    return tuple(runs)


# ------------------------------------------------------------------------------------------ the comparison
def actor_file(root: Path, step: int, kind: str) -> dict:
    """verl's actor checkpoint file `kind` ("model", "optim") of world size 1 at `step` under `root`."""
    import torch
    import torch.distributed.tensor  # noqa: F401  (registers DTensor for the weights-only unpickler)

    path = root / f"global_step_{step}" / "actor" / f"{kind}_world_size_1_rank_0.pt"
    return torch.load(path, map_location="cpu", weights_only=True)


def _local(t):
    return (t.to_local() if hasattr(t, "to_local") else t).detach().float()


def worst(ours: dict, theirs: dict) -> tuple[float, str]:
    """The largest max |ours - theirs| / max |theirs| over the tensors, and its tensor."""
    if ours.keys() != theirs.keys() or not ours:
        raise ValueError(f"the tensors differ: only ours {sorted(set(ours) - set(theirs))[:5]}, only theirs "
                         f"{sorted(set(theirs) - set(ours))[:5]} (of {len(ours)} / {len(theirs)})")
    return max((float((ours[k] - theirs[k]).abs().max() / theirs[k].abs().max().clamp_min(1e-30)), str(k))
               for k in theirs)


def metric_errors(a: dict, b: dict, names=None) -> dict[str, float]:
    """|b - a| / scale for each compared metric (METRICS, or those of them in `names`), a being verl-omni's."""
    out = {}
    for name, scale in METRICS.items():
        if names is not None and name not in names:
            continue
        ref = abs(a[name]) if scale is None else (abs(a[scale]) if isinstance(scale, str) else scale)
        out[name] = abs(b[name] - a[name]) / max(ref, 1e-30)
    return out


def lora(run: Run, step: int) -> dict:
    """The run's trainable (LoRA) weights after `step`, from its own checkpoint."""
    return {k: _local(v) for k, v in actor_file(run.checkpoints, step, "model").items() if "lora_" in k}


def first_gradient(run: Run) -> dict:
    """The optimizer's first moment after its first step (0.1 x the gradient), per parameter with a gradient."""
    moments = {k: _local(s["exp_avg"]) for k, s in actor_file(run.checkpoints, 1, "optim")["state"].items()
               if "exp_avg" in s}
    return {k: m for k, m in moments.items() if bool(m.abs().max() > 0)}


def compare(a: Run, b: Run, steps: int, checkpointed: int = 1, strict: bool = True) -> dict:
    """Every step's metrics (`metric_errors`) of (b) against (a), and the weights (`worst`, with its tensor) of every
    `checkpointed`-th step (the runs' `trainer.save_freq`). `strict` False (another trainer of verl-omni's, (c)): a
    metric of METRICS that either run does not log is left out and listed (`missing_metrics`)."""
    missing = [(r.kind, s) for r in (a, b) for s in range(1, steps + 1) if s not in r.steps]
    if missing:
        raise ValueError(f"steps without metrics (run, step): {missing}; see each run's console.log")
    per_step, absent = [], set()
    for step in range(checkpointed, steps + 1, checkpointed):
        err, name = worst(lora(b, step), lora(a, step))
        names = None
        if not strict:
            names = {k for k in METRICS if all(k in r.steps[step] and (not isinstance(sc := METRICS[k], str)
                                                                         or sc in r.steps[step]) for r in (a, b))}
            absent |= set(METRICS) - names
        per_step.append({"step": step, "weight_rel_err": err, "worst_tensor": name,
                         "metric_rel_err": metric_errors(a.steps[step], b.steps[step], names)})
    out = {"per_step": per_step, "max_weight_rel_err": max(s["weight_rel_err"] for s in per_step),
           "max_metric_rel_err": max((e for s in per_step for e in s["metric_rel_err"].values()), default=0.0)}
    return out if strict else {**out, "missing_metrics": sorted(absent)}


# ------------------------------------------------------------------------------------------ the bench
def value(argv: list[str], key: str) -> str:
    """The value `argv` sets for `key` (the last override of it)."""
    found = [o.split("=", 1)[1] for o in argv if _key(o) == key]
    if not found:
        raise KeyError(f"{key} is not on the command line {argv}")
    return found[-1]


def timing(run: Run, steps: int) -> dict:
    """A run's wall time and per-step `timing_s/step` (their median), with (a)'s validation time apart, and the
    median over the steps of every `timing_s/*` phase the run logs (verl-omni: gen, old_log_prob, update_actor, ...)."""
    step_s = [float(run.steps[s][STEP_METRIC]) for s in range(1, steps + 1)]
    names = sorted({k for s in range(1, steps + 1) for k in run.steps[s] if k.startswith("timing_s/")})
    phases = {k: statistics.median(float(run.steps[s].get(k, 0.0)) for s in range(1, steps + 1)) for k in names}
    return {"out": str(run.out), "argv": run.argv, "wall_s": run.seconds, "step_s": step_s,
            "step_s_median": statistics.median(step_s), "phases_median_s": phases,
            "testing_s": sum(float(m.get("timing_s/testing", 0.0)) for m in run.steps.values())}


#: the reward curve reported step by step for both runs
CURVE_METRIC = "critic/rewards/mean"


def one_pass(stock: list[str], root: Path, steps: int, label: str, pythonpath: str | None,
             staleness: int = 0, separate_async: bool = False) -> dict:
    """(a) then (b) once (and (c) with `separate_async`), timed and compared ((b) and (c) each against (a)), the
    reward curves; progress lines as it goes."""
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    runs = run_pair(stock, root, steps, pythonpath, label, staleness, separate_async)
    a, b = runs[:2]
    checkpointed = steps if staleness else 1
    row = {"stock": timing(a, steps), "flag": timing(b, steps), **compare(a, b, steps, checkpointed),
           "reward_curves": {r.kind: [r.steps[s][CURVE_METRIC] for s in range(1, steps + 1)] for r in runs},
           "load_average_start": load0, "load_average_end": os.getloadavg()[0]}
    line = (f"{label}: (a) {a.seconds:.0f} s, step {row['stock']['step_s_median']:.1f} s; (b) {b.seconds:.0f} s, step "
            f"{row['flag']['step_s_median']:.1f} s; weights within {row['max_weight_rel_err']:.1e}")
    if separate_async:
        c = runs[2]
        row["separate_async"] = timing(c, steps)
        row["separate_async_vs_stock"] = compare(a, c, steps, checkpointed, strict=False)
        line += (f"; (c) {c.seconds:.0f} s, step {row['separate_async']['step_s_median']:.1f} s, weights "
                 f"{row['separate_async_vs_stock']['max_weight_rel_err']:.1e} from (a)'s")
    print(f"{line} ({time.monotonic() - t0:.0f} s)", flush=True)
    return row


def _row(kind: str, name: str, passes: list[dict]) -> dict:
    """One run kind's row: the medians over the passes of its step time (each run's median step) and wall time."""
    runs = {k: [p[kind][key] for p in passes] for k, key in (("step_s", "step_s_median"), ("wall_s", "wall_s"))}
    return {"run": kind, "name": name, **{k: statistics.median(v) for k, v in runs.items()},
            **{f"{k}_runs": v for k, v in runs.items()}}


def summarise(passes: list[dict], cfg: BenchConfig) -> dict:
    """The bench JSON: a row per run kind (medians), the speed-ups (of the medians, and pass by pass), the errors."""
    with_c = "separate_async" in passes[0]
    rows = [_row(kind, NAMES[kind], passes) for kind in ("stock", "flag", *(["separate_async"] if with_c else []))]
    out = {"bench": "e2e", "baseline": "verl_omni", "baseline_name": BASELINE, "candidate": CANDIDATE,
           "v1_separate_async": V1_SEPARATE_ASYNC if with_c else
           f"not run (pass --with-separate-async): {SEPARATE_ASYNC_BASELINE}",
           "step_time": f"median over a run's steps of `{STEP_METRIC}` "
           "(module docstring: what each run's covers)", "wall_time": "the whole process, interpreter start to exit",
           "rows": rows, "speedup": {}, "speedup_per_pass": {}, "speedup_paired_median": {}}
    b = rows[1]
    for key, base in (("", rows[0]), ("_vs_separate_async", rows[2] if with_c else None)):
        if base is None:
            continue
        out[f"speedup{key}"], out[f"speedup_per_pass{key}"], out[f"speedup_paired_median{key}"] = {}, {}, {}
        for k in ("step_s", "wall_s"):
            out[f"speedup{key}"][k] = base[k] / b[k]
            out[f"speedup_per_pass{key}"][k] = [x / y for x, y in zip(base[f"{k}_runs"], b[f"{k}_runs"])]
            out[f"speedup_paired_median{key}"][k] = statistics.median(out[f"speedup_per_pass{key}"][k])
    if with_c:
        errs = [p["separate_async_vs_stock"] for p in passes]
        out["separate_async"] = {
            "baseline_name": SEPARATE_ASYNC_BASELINE, "entry_point": V1_ENTRY, "overrides": list(SEPARATE_ASYNC),
            "max_weight_rel_err_vs_stock": max(e["max_weight_rel_err"] for e in errs),
            "max_metric_rel_err_vs_stock": max(e["max_metric_rel_err"] for e in errs),
            "missing_metrics": sorted({m for e in errs for m in e["missing_metrics"]}),
            "within_tolerance_of_stock": all(e["max_weight_rel_err"] <= TOL and e["max_metric_rel_err"] <= TOL
                                             for e in errs)}
    out["max_weight_rel_err"] = max(p["max_weight_rel_err"] for p in passes)
    out["max_metric_rel_err"] = max(p["max_metric_rel_err"] for p in passes)
    out["tolerance"] = TOL
    out["staleness"] = cfg.staleness  # 1: (b) runs ahead by design; its weights are not held to (a)'s
    out["within_tolerance"] = (out["max_weight_rel_err"] <= TOL and out["max_metric_rel_err"] <= TOL
                               if cfg.staleness == 0 else None)
    argv = passes[0]["stock"]["argv"]
    out["config"] = {"recipe": RECIPE_NAME, "entry_point": ENTRY, "steps": cfg.steps, "repeat": cfg.repeat,
                     "prompts_per_step": int(value(argv, "data.train_batch_size")),
                     "n": int(value(argv, f"{A}.rollout.n")), "statistic": "median over repeats",
                     "cpu_count": os.cpu_count(), "python": sys.executable}
    out["passes"] = passes
    return out


def table(out: dict) -> str:
    """The closing table (rich, rendered to text so it also lands in logs)."""
    import io

    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=140, force_terminal=False, file=io.StringIO())
    t = Table(title=f"{out['config']['steps']} steps, medians of {len(out['passes'])} paired run(s)")
    for column in ("run", "step time (timing_s/step)", "wall time", "runs: step / wall"):
        t.add_column(column)
    for r in out["rows"]:
        t.add_row(r["name"], f"{r['step_s']:.1f} s", f"{r['wall_s']:.0f} s",
                  ", ".join(f"{x:.1f} / {w:.0f}" for x, w in zip(r["step_s_runs"], r["wall_s_runs"])))
    console.print(t)
    s = out["speedup"]
    console.print(f"speedup a/b: step {s['step_s']:.2f}x, wall {s['wall_s']:.2f}x; max_weight_rel_err "
                  f"{out['max_weight_rel_err']:.1e}, max_metric_rel_err {out['max_metric_rel_err']:.1e} (tolerance "
                  f"{TOL:g}); v1 separate_async: {out['v1_separate_async']}")
    if "separate_async" in out:
        c, e = out["speedup_vs_separate_async"], out["separate_async"]
        console.print(f"speedup c/b: step {c['step_s']:.2f}x, wall {c['wall_s']:.2f}x; (c)'s weights against (a)'s: "
                      f"max_weight_rel_err {e['max_weight_rel_err_vs_stock']:.1e}, max_metric_rel_err "
                      f"{e['max_metric_rel_err_vs_stock']:.1e}" + (f" (not logged by both: {e['missing_metrics']})"
                                                                   if e["missing_metrics"] else ""))
    curves = out["passes"][0]["reward_curves"]
    console.print(f"{CURVE_METRIC} by step, pass 1 ((b) at staleness {out['staleness']}): "
                  + "; ".join(f"{k} " + " ".join(f"{v:.4f}" for v in curves[k]) for k in curves))
    return console.export_text()


def parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    p = argparse.ArgumentParser(prog="python -m digenrl_verl.bench e2e --baseline verl_omni",
                                description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--steps", type=int, default=d.steps, help=f"global steps of each run (default {d.steps})")
    p.add_argument("--repeat", type=int, default=d.repeat,
                   help=f"paired runs, (a) then (b) (default {d.repeat}); medians reported, all kept")
    p.add_argument("--keep", metavar="DIR", default=None,
                   help="keep every run's folder under DIR (new or empty); without it they go to a temporary "
                        "folder, removed at the end")
    p.add_argument("--staleness", type=int, default=d.staleness, choices=(0, 1),
                   help="(b)'s trainer.digenrl.tcss.staleness (default 0, on-policy: the same weights as (a); 1: the "
                        "reward curves side by side, the weights differ by design)")
    p.add_argument("--with-separate-async", action="store_true",
                   help=f"each pass runs (c) too, after (b): {SEPARATE_ASYNC_BASELINE} (entry point {V1_ENTRY}); "
                        "the JSON adds its row, speedup_vs_separate_async (c / b) and its weights against (a)'s")
    p.add_argument("--flag-pythonpath", metavar="DIR", default=None,
                   help="put DIR first on run (b)'s PYTHONPATH only (the equivalence test's loss-scale mutation)")
    return p


def _root(keep: str | None) -> Path:
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="digenrl_bench_e2e_verl_omni_"))
    root = Path(keep)
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"--keep {keep}: the folder is not empty; name a new or empty folder")
    root.mkdir(parents=True, exist_ok=True)
    return root


def run(cfg: BenchConfig, root: Path) -> dict:
    """The inputs once, `cfg.repeat` passes of (a) then (b) (then (c)), the JSON (printed as a table): medians over
    the passes that finished, a failed pass's error in `failed_passes` (the command then exits 1)."""
    third = f"; (c): {SEPARATE_ASYNC_BASELINE}" if cfg.with_separate_async else ""
    print(f"baseline (a): {BASELINE}; (b): {CANDIDATE}{third}; {cfg.steps} steps, {cfg.repeat} pass(es), in {root}",
          flush=True)
    stock = write_inputs(root / "data")
    passes, failed = [], []
    for k in range(1, cfg.repeat + 1):
        try:
            passes.append(one_pass(stock, root / f"pass{k}", cfg.steps, f"pass {k}/{cfg.repeat}", cfg.flag_pythonpath,
                                   cfg.staleness, cfg.with_separate_async))
        except RunFailed as e:  # the finished passes still count (a 2-core host under load: Ray's start can time out)
            print(f"pass {k}/{cfg.repeat} failed: {e}", file=sys.stderr, flush=True)
            failed.append({"pass": k, "error": str(e)[-2000:]})
    if not passes:
        raise RunFailed(f"every pass failed; the last: {failed[-1]['error']}", "")
    out = {**summarise(passes, cfg), "failed_passes": failed, "keep": str(root) if cfg.keep else None}
    print(table(out), flush=True)
    return out


def main(argv: list[str]) -> int:
    p = parser()
    try:
        cfg = BenchConfig(**vars(p.parse_args(argv)))
    except ValueError as e:
        p.error(str(e))
    why = missing_verl_omni()
    if why:
        print(why, file=sys.stderr)
        return 2
    root = _root(cfg.keep)
    try:
        out = run(cfg, root)
    except RunFailed as e:
        print(e, file=sys.stderr)
        return 1
    finally:
        if cfg.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if cfg.json:
        print(json.dumps(out))
    return 1 if out["failed_passes"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
