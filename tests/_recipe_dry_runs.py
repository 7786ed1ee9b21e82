"""The shell recipes' dry runs (`bash recipes/<stem>.sh` with DRY_RUN=1), run once per session for the tests that
read them through tests/integrations' `recipe_dry_runs` fixture: the golden plans (test_integ_plan_golden_on_cpu)
and the recipes' pools lines (test_integ_recipes_dry_run_on_cpu) come from the same runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
#: shell recipe -> the architecture of the tiny model directory it runs against (every recipes/run_*.sh)
SHELL_RECIPES = {
    "run_tiny_cpu": "FluxPipeline",
    "run_tiny_cpu_colocated": "FluxPipeline",
    "run_flowgrpo_qwen_image_32gpu": "QwenImagePipeline",
    "run_flowgrpo_qwen_image_32gpu_colocated": "QwenImagePipeline",
    "run_flowgrpo_flux_32gpu": "FluxPipeline",
    "run_flowgrpo_flux_32gpu_colocated": "FluxPipeline",
    "run_flowgrpo_wan21_14b": "WanPipeline",
    "run_flowgrpo_wan21_14b_colocated": "WanPipeline",
    "run_dancegrpo_hunyuanvideo": "HunyuanVideoPipeline",
    "run_dancegrpo_hunyuanvideo_colocated": "HunyuanVideoPipeline",
    "run_dancegrpo_hunyuanvideo_hetero_16gpu": "HunyuanVideoPipeline",
    "run_dancegrpo_hunyuanvideo_hetero_16gpu_colocated": "HunyuanVideoPipeline",
    "run_flowgrpo_sd35_small": "StableDiffusion3Pipeline",
    "run_flowgrpo_sd35_small_colocated": "StableDiffusion3Pipeline",
}
#: dry runs at once (each one interpreter that composes and validates; the CI machine has 2 cores)
JOBS = 2
#: the recipes' knobs, unset so that each recipe runs with its own defaults
KNOBS = ("MODE", "NGPUS", "GEN_SHARE", "GEN_ACCEL", "TRN_ACCEL")


def wanted(items) -> list[str]:
    """The recipes the selected test items read through `recipe_dry_runs`: an item parametrized by `stem` its own,
    any other all of them."""
    stems: set[str] = set()
    for item in items:
        if "recipe_dry_runs" in getattr(item, "fixturenames", ()):
            params = getattr(getattr(item, "callspec", None), "params", {})
            stems.update([params["stem"]] if "stem" in params else SHELL_RECIPES)
    return sorted(stems)


def _job(stem: str, model: str, cwd: Path) -> tuple[list[str], dict[str, str], str]:
    """argv, environment and prompt file of one recipe's dry run in `cwd` on the tiny `model`."""
    prompts = cwd / "prompts.txt"  # verl-omni's epoch rule: a batch needs as many prompts (the GPU recipes' 32)
    prompts.write_text("".join(f"a sign that reads {i}\n" for i in range(64)))
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env.update(VENV_PY=sys.executable, MODEL_PATH=model, MODEL=model, DRY_RUN="1")
    tiny = stem.startswith("run_tiny_cpu")  # the tiny CPU recipes train unless told to dry-run
    if not tiny:
        env["TRAIN_FILES"] = str(prompts)
    return ["bash", str(RECIPES / f"{stem}.sh"), *(["trainer.digenrl.dry_run=true"] if tiny else [])], env, str(prompts)


def run(stems: list[str], tiny_dirs: dict[str, str], mktemp) -> dict[str, tuple[subprocess.CompletedProcess, str, str]]:
    """stem -> (CompletedProcess, model dir, prompt file) of each recipe's dry run, JOBS at once, each in its own
    directory from `mktemp(stem)`."""
    done = {}
    for i in range(0, len(stems), JOBS):
        batch = []
        for stem in stems[i:i + JOBS]:
            model = tiny_dirs[SHELL_RECIPES[stem]]
            args, env, prompts = _job(stem, model, mktemp(stem))
            p = subprocess.Popen(args, env=env, cwd=Path(prompts).parent, text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
            batch.append((stem, args, model, prompts, p))
        for stem, args, model, prompts, p in batch:
            out, err = p.communicate(timeout=180)
            done[stem] = (subprocess.CompletedProcess(args, p.returncode, out, err), model, prompts)
    return done
