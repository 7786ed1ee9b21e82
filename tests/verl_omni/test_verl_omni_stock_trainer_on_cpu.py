"""verl-omni's OWN trainer, no flag, on the host CPU (issue 30 item 1): `python -m verl_omni.trainer.main_diffusion`
with verl-omni's Qwen-Image OCR LoRA recipe (`run_qwen_image_ocr_lora.sh`'s override list, `integrations.
verl_omni_recipes`), its blockers for a CPU switched off but `rollout.name=vllm_omni` kept, tiny sizes: v0, colocated,
verl-omni's hybrid vLLM-Omni replica on the actor's Ray slot. One training step, the validation at the last step
and the checkpoint, as the recipe runs them.

What a CPU host needs besides this plugin installed (its platforms come from entry points, in every process): the
environment `VERL_PLATFORM=cpu` (verl never auto-detects it) and `DIGENRL_CPU_RAY_GPUS=1` (the replica's device slot
is one of Ray's logical GPUs: `+ray_kwargs.ray_init.num_gpus=1`), `rollout.rollout_attn_backend=TORCH_SDPA`,
`actor.strategy=fsdp2`, `model.attn_backend=native`; and, for the tiny model, `rollout.dtype=float32` (its text
encoder is saved in float32, which vLLM-Omni keeps, Qwen-Image's own is bfloat16). The prompts are in verl-omni's
`examples/flowgrpo_trainer/data_process/qwenimage_ocr.py` layout (system and user turns, a `negative_prompt` chat).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import STAND_IN_REWARD, cpu_env, failure_summary  # noqa: E402

from digenrl_verl.integrations.verl_omni_recipes import RECIPES  # noqa: E402
from digenrl_verl.models._tiny_tokenizers import QWEN_IMAGE_SYSTEM as SYSTEM  # noqa: E402

RECIPE = RECIPES["qwen_image_flowgrpo_lora"]
A = "actor_rollout_ref"
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


def _step_metrics(console: str) -> dict[str, float]:
    """verl's console logger line of step 1 (`step:1 - name:value - ...`) as numbers."""
    line = next(line for line in console.splitlines() if re.search(r"\bstep:1 - ", line))
    values = {}
    for name, value in re.findall(r"([\w/@.-]+):(?:np\.float64\()?(-?[\d.e+-]+)", line.split("step:1 - ", 1)[1]):
        values[name] = float(value)
    return values


@pytest.mark.slow
def test_verl_omnis_own_trainer_runs_its_qwen_image_lora_recipe_on_cpu(tmp_path):
    argv = _stock_argv(tmp_path)
    assert f"{A}.rollout.name=vllm_omni" in argv and not [a for a in argv if "digenrl" in a]  # no flag
    env = cpu_env(HF_HUB_OFFLINE="1", TORCH_COMPILE_DISABLE="1", RAY_USAGE_STATS_ENABLED="0",
                  TOKENIZERS_PARALLELISM="false", DIGENRL_CPU_RAY_GPUS="1")
    env.pop("VERL_USE_EXTERNAL_MODULES", None)  # the plugin's verl.plugins entry point registers the platform
    proc = subprocess.run([sys.executable, "-m", "verl_omni.trainer.main_diffusion", *argv,
                           f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1500)
    console = proc.stdout + proc.stderr
    (tmp_path / "console.log").write_text(console)
    assert proc.returncode == 0, failure_summary(console)
    metrics = _step_metrics(console)
    print({k: metrics[k] for k in sorted(metrics) if k.startswith(("actor/", "critic/rewards", "val-core"))})
    assert metrics["actor/grad_norm"] > 0  # a real update of the LoRA weights
    assert 0 < metrics["critic/rewards/mean"] < 1  # the stand-in reward scored the replica's images
    assert metrics["critic/rewards/group_size"] == 2  # tiny: rollout.n=2
    assert (tmp_path / "checkpoints" / "global_step_1" / "actor").is_dir()  # verl-omni's own checkpoint
