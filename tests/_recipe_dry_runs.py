"""The shell recipes' dry runs (`bash recipes/<stem>.sh` with DRY_RUN=1), run once per session for the tests that
read them through tests/integrations' `recipe_dry_runs` fixture: the golden plans (test_integ_plan_golden_on_cpu)
and the recipes' pools lines (test_integ_recipes_dry_run_on_cpu) come from the same runs.

Each recipe runs under bash as a user runs it, with ``VENV_PY`` (which every recipe honours) pointing at a shim that
records the ``-m digenrl_verl.main`` call it makes (argument list, working directory, environment) instead of
starting it; any other python call runs the real interpreter. The recorded calls then run as `python -m
digenrl_verl.main` would run them, each in a process forked from one interpreter that imported the entry point once
(`python tests/_recipe_dry_runs.py <jobs.json>`, with scripts/replay_verl_omni_recipes.py's `Forked`, JOBS at
once): 14 dry runs no longer pay the import of torch, Ray and verl 14 times. A recipe that stops before its python
call (a knob it refuses) keeps bash's own exit status and output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
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
#: dry runs at once (each one forked process that composes and validates; the CI machine has 2 cores)
JOBS = 2
#: the recipes' knobs, unset so that each recipe runs with its own defaults
KNOBS = ("MODE", "NGPUS", "GEN_SHARE", "GEN_ACCEL", "TRN_ACCEL")
ENTRY = "digenrl_verl.main"
RECORD = ('import json, os, sys; json.dump({"argv": sys.argv[3:], "cwd": os.getcwd(), "env": dict(os.environ)}, '
          'open(os.environ["DRY_RUN_CAPTURE"], "w"))')
SHIM = f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "{ENTRY}" ]; then
  exec "@PYTHON@" -c '{RECORD}' "$@"
fi
exec "@PYTHON@" "$@"
"""


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


def _shim(work: Path) -> Path:
    shim = work / "python"
    shim.write_text(SHIM.replace("@PYTHON@", sys.executable))
    shim.chmod(0o755)
    return shim


def run(stems: list[str], tiny_dirs: dict[str, str], mktemp) -> dict[str, tuple[subprocess.CompletedProcess, str, str]]:
    """stem -> (CompletedProcess, model dir, prompt file) of each recipe's dry run, each in its own directory from
    `mktemp(stem)`: the recipe under bash with the shim, then its recorded call forked (`_forked`)."""
    shim, done, jobs = _shim(mktemp("dry_run_shim")), {}, []
    for stem in stems:
        model = tiny_dirs[SHELL_RECIPES[stem]]
        args, env, prompts = _job(stem, model, mktemp(stem))
        capture = Path(prompts).with_name("call.json")
        bash = subprocess.run(args, env={**env, "VENV_PY": str(shim), "DRY_RUN_CAPTURE": str(capture)},
                              cwd=Path(prompts).parent, text=True, capture_output=True, timeout=120)
        done[stem] = (bash, model, prompts)
        if bash.returncode == 0 and capture.exists():
            jobs.append({"stem": stem, "args": args, **json.loads(capture.read_text()),
                         "logs": str(Path(prompts).with_name("dry_run"))})
    for job, proc in zip(jobs, _forked(jobs, mktemp("dry_run_jobs"))):
        done[job["stem"]] = (proc, *done[job["stem"]][1:])
    return done


def _forked(jobs: list[dict], work: Path) -> list[subprocess.CompletedProcess]:
    """Each job's `python -m digenrl_verl.main` in a process forked from one interpreter (this file as a script)."""
    if not jobs:
        return []
    (work / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, __file__, str(work / "jobs.json"), str(work / "results.json")],
                          cwd=ROOT, text=True, capture_output=True, timeout=180 * len(jobs))
    assert proc.returncode == 0, f"the dry runs' fork runner failed:\n{proc.stderr[-3000:]}"
    return [subprocess.CompletedProcess(j["args"], r["returncode"], r["stdout"], r["stderr"])
            for j, r in zip(jobs, json.loads((work / "results.json").read_text()))]


def _replay_module():
    """scripts/replay_verl_omni_recipes.py (its `Forked`: `python -m` in a forked child)."""
    spec = importlib.util.spec_from_file_location("replay_verl_omni_recipes",
                                                  ROOT / "scripts" / "replay_verl_omni_recipes.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def _outcome(child) -> dict:
    p = child.result()
    return {"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def main(jobs_file: str, results_file: str) -> None:
    """The fork runner: import the entry point once, then each job forked, JOBS at once, in the jobs' order."""
    forked = _replay_module().Forked
    jobs = json.loads(Path(jobs_file).read_text())
    os.environ.update(jobs[0]["env"])  # the recipes' exports (offline hub, no compile) before the import, as bash had
    __import__(ENTRY)
    running, results = [], []
    for job in jobs:
        if len(running) >= JOBS:  # the oldest first, as the replay does: the results keep the jobs' order
            results.append(_outcome(running.pop(0)))
        running.append(forked(ENTRY, job["argv"], Path(job["cwd"]), Path(job["logs"]), env=job["env"]))
    results.extend(_outcome(child) for child in running)
    Path(results_file).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:3])
