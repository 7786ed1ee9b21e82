"""Every GPU recipe in recipes/ composes and validates (DRY_RUN=1) with a tiny local model directory, and
has a colocated twin; the knobs fail clearly."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
DRY_RUN_END = "dry run: config valid, no worker started"
# recipe → (architecture of its model, expected pools line fragments for disaggregated / colocated)
ARCH = {
    "run_flowgrpo_qwen_image_32gpu": ("QwenImagePipeline", "generator: 16 worker(s), trainer: 16 worker(s)",
                                      "colocated: 32 worker(s)"),
    "run_flowgrpo_flux_32gpu": ("FluxPipeline", "generator: 16 worker(s), trainer: 16 worker(s)",
                                "colocated: 32 worker(s)"),
    "run_flowgrpo_wan21_14b": ("WanPipeline", "generator: 8 worker(s), trainer: 8 worker(s)",
                               "colocated: 16 worker(s)"),
    "run_dancegrpo_hunyuanvideo": ("HunyuanVideoPipeline", "generator: 8 worker(s), trainer: 8 worker(s)",
                                   "colocated: 16 worker(s)"),
    "run_dancegrpo_hunyuanvideo_hetero_16gpu": ("HunyuanVideoPipeline",
                                                "generator: 8 worker(s) on A800, trainer: 8 worker(s) on H800",
                                                "colocated: 16 worker(s)"),
    "run_flowgrpo_sd35_small": ("StableDiffusion3Pipeline", "generator: 2 worker(s), trainer: 2 worker(s)",
                                "colocated: 4 worker(s)"),
}


@functools.lru_cache(maxsize=1)
def _prompts() -> str:
    """64 prompts: verl-omni's epoch rule needs a batch's worth (the GPU recipes take up to 32; 8 are built in)."""
    path = Path(tempfile.mkdtemp()) / "prompts.txt"
    path.write_text("".join(f"a sign that reads {i}\n" for i in range(64)))
    return str(path)


def _env(model: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MODE", "NGPUS", "GEN_SHARE", "GEN_ACCEL", "TRN_ACCEL")}
    return {**env, "VENV_PY": sys.executable, "MODEL_PATH": model, "DRY_RUN": "1", "TRAIN_FILES": _prompts(), **extra}


def test_every_gpu_recipe_has_a_colocated_twin_and_is_covered():
    mains = sorted(p.stem for p in RECIPES.glob("run_*.sh")
                   if not p.stem.endswith("_colocated") and not p.stem.startswith("run_tiny_cpu"))
    assert mains == sorted(ARCH)
    for stem in mains:
        twin = (RECIPES / f"{stem}_colocated.sh").read_text()
        assert "MODE=colocated" in twin and f"{stem}.sh" in twin


@pytest.mark.slow
def test_all_recipes_dry_run_with_tiny_models(recipe_dry_runs):
    failures = []
    for stem, (arch, disagg, coloc) in ARCH.items():
        for script, expect in ((stem, f"mode: disaggregated; pools: {disagg}"),
                               (f"{stem}_colocated", f"mode: colocated; pools: {coloc}")):
            # `bash recipes/<script>.sh` with DRY_RUN=1 on a tiny model of `arch` (one run per session, shared with
            # the golden-plan test): each one interpreter that composes and validates
            p, model, _ = recipe_dry_runs[script]
            assert Path(model).name == arch, (script, model)
            if p.returncode != 0 or expect not in p.stdout or DRY_RUN_END not in p.stdout:
                failures.append(f"{script}.sh: rc={p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("script,extra,message", [
    ("run_flowgrpo_flux_32gpu.sh", {"NGPUS": "16"}, "NGPUS=16; this recipe is set up for: 32"),
    ("run_flowgrpo_sd35_small.sh", {"MODE": "overlapped"}, "MODE=overlapped; valid: disaggregated, colocated"),
    ("run_flowgrpo_wan21_14b.sh", {"GEN_SHARE": "16"}, "GEN_SHARE=16 leaves no trainer GPUs of 16"),
    ("run_flowgrpo_qwen_image_32gpu.sh", {"MODEL_PATH": ""}, "set MODEL_PATH to a local diffusers directory"),
])
def test_recipe_knobs_fail_clearly(script, extra, message, tiny_dirs, tmp_path):
    env = _env(tiny_dirs["FluxPipeline"], **extra)
    p = subprocess.run(["bash", str(RECIPES / script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and message in p.stderr


@pytest.mark.slow
def test_a_wrong_model_directory_is_refused_by_name(tiny_dirs, tmp_path):
    p = subprocess.run(["bash", str(RECIPES / "run_flowgrpo_flux_32gpu.sh")], env=_env(tiny_dirs["WanPipeline"]),
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert re.search(r"actor_rollout_ref\.model\.architecture='FluxPipeline' but .*WanPipeline", p.stderr)
