"""Flip the flag on verl-omni's own trainer: the same training (issue 30 item 2, "Equivalence"), and the smoke test
of its bench (item 3, `python -m digenrl_verl.bench e2e --baseline verl_omni`).

The module's fixture runs that bench once, `--steps 3 --repeat 1 --json --keep <tmp>`: the same command line, the same
seeds, float32 everywhere, three steps with a checkpoint after each, run twice (the runs, their command lines and why
each override is there: digenrl_verl/bench/e2e_verl_omni.py, whose constants this module imports):

(a) verl-omni's STOCK v0 trainer, `python -m verl_omni.trainer.main_diffusion`, no flag (colocated hybrid: its
    vLLM-Omni replica generates, its actor worker trains), with its validation at the last step as the recipe runs
    it; `test_verl_omnis_own_trainer_runs_its_recipe_on_cpu` holds what that run shows by itself (issue 30 item 1);
(b) the same with the flag, `trainer.trainer_class=digenrl` (the twin's command line of test_verl_omni_entry_points,
    `test_the_flags_command_line_is_the_qwen_image_twins` holds them equal: 1 generator + 1 trainer worker,
    staleness 0, GAP, TSP, TAG of one micro-batch on the trainer's copy of the pipeline; generators on verl-omni's
    Qwen-Image rollout pipeline in-process, trainers on verl-omni's actor worker with the TSP engine).

Every step's trainable (LoRA) weights, from each run's own checkpoint (`global_step_N/actor`), within 1e-5 (max |Δ| /
max |w| of the worst tensor), and its metrics (rewards, advantages, grad norm, clip fraction, loss) within 1e-5 (the
loss and the advantages' mean against the advantages' scale: means of ±A terms that nearly cancel). Measured
2026-12-07 over two steps: weights 1.9e-6 / 2.0e-6 (steps 1, 2), rewards and advantages bit for bit, grad norm
1.1e-7 / 0, the first gradient (the optimizer's first moment) 1.8e-6; (a) ~200 s, (b) ~100 s on this 2-core host.
The bench's JSON is checked for its shape (each run's medians, `speedup` > 0, `max_weight_rel_err` <= 1e-5, the
baseline named), not for its figures (docs/benchmarks.md has those).

Cross-resume (item 2): each trainer resumes the other's checkpoint of step 1 and trains step 2 as its own
uninterrupted run did (weights and metrics within 1e-5): verl-omni's stock trainer from (b)'s (its actor files, and
the `data.pt` dataloader state the flag writes for it: `test_the_flags_checkpoints_carry_verl_omnis_dataloader_state`
holds it equal to (a)'s own at every step), the flag from (a)'s. Each resumed run is one more process (~2 min).

Mutation: ``DIGENRL_EQUIVALENCE_LOSS_SCALE=1.001`` puts `_loss_scale_hook` on the flag's run's PYTHONPATH (the bench's
`--flag-pythonpath`; its losses times 1.001, `_loss_scale_hook/sitecustomize.py`); the test must then fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# without verl-omni, or without its v0 hook, importing test_verl_omni_entry_points below skips this module with its
# declared reasons
if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import failure_summary  # noqa: E402
from test_verl_omni_entry_points import TWIN_EXTRA, TWIN_RUN_ELSEWHERE, TWINS, _twin_argv, check_twin_run  # noqa: E402

from digenrl_verl.bench.e2e_verl_omni import (  # noqa: E402
    BASELINE,
    DEFAULT_STEPS,
    ENTRY,
    FLAG,
    RECIPE_NAME,
    TOL,
    Run,
    _execute,
    compare,
    first_gradient,
    flag_argv,
    load_run,
    lora,
    metric_errors,
    run_env,
    same,
    shared_files,
    stock_argv,
    with_overrides,
    worst,
)
from digenrl_verl.trainer.data import LOADER_STATE_FILE  # noqa: E402

NAME = RECIPE_NAME
STEPS = DEFAULT_STEPS
MUTATION_VAR = "DIGENRL_EQUIVALENCE_LOSS_SCALE"
HOOK = Path(__file__).resolve().parent / "_loss_scale_hook"


def _failed_runs(root: Path) -> str:
    """The failure summary of each kept run that exited with an error."""
    out = ""
    for meta in sorted(root.glob("pass*/*/run.json")):
        if json.loads(meta.read_text())["returncode"] != 0:
            out += f"\n--- {meta.parent}\n" + failure_summary((meta.parent / "console.log").read_text())
    return out


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[dict, Run, Run]:
    """`python -m digenrl_verl.bench e2e --baseline verl_omni`, one pass of STEPS steps, its runs kept: its JSON,
    (a) and (b)."""
    keep = tmp_path_factory.mktemp("flag_vs_stock") / "bench"
    cmd = [sys.executable, "-m", "digenrl_verl.bench", "e2e", "--baseline", "verl_omni", "--steps", str(STEPS),
           "--repeat", "1", "--json", "--keep", str(keep)]
    if os.environ.get(MUTATION_VAR):
        cmd += ["--flag-pythonpath", str(HOOK)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:] + _failed_runs(keep)
    print("\n" + "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("{")))  # progress, table
    out = json.loads(proc.stdout.splitlines()[-1])
    return out, load_run(keep / "pass1" / "stock"), load_run(keep / "pass1" / "flag")


@pytest.fixture(scope="module")
def runs(bench) -> tuple[Run, Run]:
    return bench[1], bench[2]


@pytest.mark.slow
def test_every_step_trains_what_verl_omnis_trainer_trains(runs):
    """Each step's LoRA weights and metrics within 1e-5 of verl-omni's own trainer's (module docstring)."""
    a, b = runs
    assert sorted(a.steps) == sorted(b.steps) == list(range(1, STEPS + 1))
    failures = []
    for row in compare(a, b, STEPS)["per_step"]:
        step, err, errors = row["step"], row["weight_rel_err"], row["metric_rel_err"]
        both = {k: (a.steps[step][k], b.steps[step][k], f"{e:.1e}") for k, e in errors.items()}
        print(f"step {step}: weights' worst tensor {row['worst_tensor']}: {err:.2e}\n  metrics, verl-omni's / the "
              f"flag's / difference: {both}")
        failures += [f"step {step} weights {row['worst_tensor']} {err:.2e}"] * (not err <= TOL)
        failures += [f"step {step} {k} {e:.2e}" for k, e in errors.items() if not e <= TOL]
    theirs = first_gradient(a)
    ours = first_gradient(b)
    err, name = worst({k: ours[k] for k in theirs}, theirs)
    print(f"step 1 gradient: worst tensor (optimizer state {name}) {err:.2e}")
    assert theirs.keys() == ours.keys() and theirs
    assert not failures and err <= TOL, failures


@pytest.mark.slow
def test_the_bench_reports_the_speed_against_verl_omnis_trainer(bench):
    """The bench's JSON (its smoke test): both runs' medians, `speedup` a / b of step and wall time, the weights'
    error within the tolerance, the baseline named; its figures are the kept runs'."""
    out, a, b = bench
    assert out["bench"] == "e2e" and out["baseline"] == "verl_omni" and out["baseline_name"] == BASELINE
    assert "verl-omni" in BASELINE and "main_diffusion" in BASELINE and "colocated" in BASELINE
    assert [r["run"] for r in out["rows"]] == ["stock", "flag"]
    for row, run in zip(out["rows"], (a, b)):
        assert row["wall_s"] == row["wall_s_runs"][0] == pytest.approx(run.seconds) and row["step_s"] > 0
    assert set(out["speedup"]) == {"step_s", "wall_s"} and min(out["speedup"].values()) > 0
    assert out["speedup_per_pass"] == {k: [v] for k, v in out["speedup"].items()}
    assert out["config"]["steps"] == STEPS and out["config"]["repeat"] == len(out["passes"]) == 1
    assert [s["step"] for s in out["passes"][0]["per_step"]] == list(range(1, STEPS + 1))
    assert out["max_weight_rel_err"] == compare(a, b, STEPS)["max_weight_rel_err"] <= TOL
    assert out["max_metric_rel_err"] <= TOL and out["within_tolerance"] is True
    assert out["v1_separate_async"].startswith("not run (pass --with-separate-async)")  # (c): ~4 min more


@pytest.mark.slow
def test_the_flags_command_line_is_the_qwen_image_twins(runs, tmp_path):
    """(b) ran what `flag_argv` builds, and that is the Qwen-Image twin's command line of test_verl_omni_entry_points
    (`_twin_argv`) with FLAG, (a)'s files and the shared overrides: the two cannot drift apart."""
    a, b = runs
    assert TWINS[NAME] == ENTRY
    assert b.argv == flag_argv(a.argv, b.out, STEPS)
    extra = (*FLAG, *shared_files(a.argv), *same(STEPS))
    assert flag_argv(a.argv, tmp_path, STEPS) == _twin_argv(NAME, tmp_path, extra=extra)


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
    FLAG's, three steps): it passes the twin's checks (`check_twin_run`), which the twin's own test leaves to it."""
    _, b = runs
    assert NAME == TWIN_RUN_ELSEWHERE and set(TWIN_EXTRA) <= set(b.argv), sorted(set(TWIN_EXTRA) - set(b.argv))
    check_twin_run(NAME, b.console, b.out / "run", b.argv, b.out, steps=STEPS)


def _same_state(ours, theirs) -> bool:
    """Equal nested dicts / lists of plain values and tensors."""
    import torch

    if isinstance(theirs, dict):
        return isinstance(ours, dict) and ours.keys() == theirs.keys() and all(
            _same_state(ours[k], theirs[k]) for k in theirs)
    if isinstance(theirs, (list, tuple)):
        return len(ours) == len(theirs) and all(_same_state(x, y) for x, y in zip(ours, theirs))
    if isinstance(theirs, torch.Tensor):
        return isinstance(ours, torch.Tensor) and torch.equal(ours, theirs)
    return ours == theirs


@pytest.mark.slow
def test_the_flags_checkpoints_carry_verl_omnis_dataloader_state(runs):
    """Each of (b)'s checkpoints holds the `data.pt` verl-omni's trainer writes at that step (its training
    dataloader's state: sampler generator, batches taken, epoch), equal to (a)'s own, so that verl-omni's trainer
    resumes (b) at the next step's prompts (step 3 starts a new epoch of the 5 prompts, 2 per step)."""
    import torch

    a, b = runs
    for step in range(1, STEPS + 1):
        theirs = torch.load(a.checkpoints / f"global_step_{step}" / LOADER_STATE_FILE, weights_only=False)
        ours = torch.load(b.checkpoints / f"global_step_{step}" / LOADER_STATE_FILE, weights_only=False)
        assert _same_state(ours, theirs), (step, ours, theirs)


def _resume(kind: str, source, a, root: Path, step: int = 1):
    """Run `kind` ("stock" or "flag") for `step` + 1 steps from a copy of `source`'s checkpoint of `step`, under
    `root/<kind>_from_<source.kind>`, its command line (a)'s or (b)'s as the bench builds them; validation off."""
    out = root / f"{kind}_from_{source.kind}"
    checkpoints = out / ("checkpoints" if kind == "stock" else "run/checkpoints")
    checkpoints.mkdir(parents=True)
    shutil.copytree(source.checkpoints / f"global_step_{step}", checkpoints / f"global_step_{step}")
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))  # verl's pointer: resume_mode auto
    argv = (stock_argv if kind == "stock" else flag_argv)(a.argv, out, step + 1)
    _execute(kind, with_overrides(argv, ["trainer.test_freq=-1"]), out, run_env(kind))
    return load_run(out)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["stock", "flag"])
def test_each_trainer_resumes_the_others_checkpoint(runs, kind, tmp_path):
    """verl-omni's stock trainer resumes (b)'s checkpoint of step 1, and the flag resumes (a)'s; either trains step 2
    as its own uninterrupted run did: LoRA weights and metrics within 1e-5 (issue 30 item 2, cross-resume)."""
    a, b = runs
    own, other = (a, b) if kind == "stock" else (b, a)
    resumed = _resume(kind, other, a, tmp_path)
    assert sorted(resumed.steps) == [2], (sorted(resumed.steps), resumed.console[-3000:])
    err, name = worst(lora(resumed, 2), lora(own, 2))
    errors = metric_errors(own.steps[2], resumed.steps[2])
    print(f"{kind} resumed from the {other.kind} run's step 1: step 2's worst tensor {name} {err:.2e}; "
          f"metrics {({k: f'{e:.1e}' for k, e in errors.items()})}")
    assert err <= TOL and max(errors.values()) <= TOL, (name, err, errors)
