"""`python -m digenrl_verl.bench.verl_omni_matrix`: verl-omni's OWN trainer on this CPU, each tiny recipe in each of
its modes, one try each (issue 30 item 1).

Runs, for each recipe of `integrations.verl_omni_recipes.RECIPES` (tiny SD3.5 FlowGRPO LoRA, Qwen-Image FlowGRPO
LoRA, Wan2.2 DanceGRPO) and each of verl-omni a1139baf's trainers (`MODES`): v0 `python -m
verl_omni.trainer.main_diffusion` (colocated hybrid), v1 `python -m verl_omni.trainer.main_diffusion_v1
trainer.use_v1=true` with `trainer.v1.trainer_mode=sync` (colocated) and `separate_async` (a standalone rollout
replica), no flag of ours: the example script's own override list with its tiny sizes and the CPU keys of
`bench.e2e_verl_omni` (`write_inputs`: `trainer.device=cpu`, fsdp2, native attention, TORCH_SDPA, float32 rollout,
one request per vLLM-Omni batch, Ray's logical GPUs), `--steps` steps with verl-omni's validation at the last one
as the scripts run it, and records for each: passed or failed, the wall time, the steps verl's console logged, and
for a failure the lines that name why (`reason`). What each mode adds to the list (`MODE_OVERRIDES`):

* every mode: the reward model's resource pool off where the script sets one (SD3.5: its VLM reward model's
  device, switched off with the reward model in tiny runs; v0 would reserve it anyway and find no device for it);
* v0: nothing but `trainer.use_v1=false` (the SD3.5 script is a v1 script) and the colocated replica's checkpoint
  engine `naive` (SD3.5's `nccl` is for its standalone replicas; verl's default);
* v1 `sync`: `trainer.use_v1=true trainer.v1.trainer_mode=sync`, `naive`, TransferQueue with one storage unit;
* v1 `separate_async`: `bench.e2e_verl_omni.SEPARATE_ASYNC` (the SD3.5 script's on-policy settings, one standalone
  replica on one of Ray's logical GPUs, the package's gloo checkpoint engine for its weights).

    source scripts/verl_omni_venv.sh
    $VERL_OMNI_PY -m digenrl_verl.bench.verl_omni_matrix --keep DIR --json [--only qwen_image_flowgrpo_lora:sync ...]

`DIR/<recipe>/<mode>/`: the run's `console.log` and `run.json`; `DIR/<recipe>/data`: its model, prompts and reward.
The closing table is markdown (docs/benchmarks.md carries it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from digenrl_verl.bench.e2e_verl_omni import (
    A, ENTRY, SAME, SEPARATE_ASYNC, V1_ENTRY, console_steps, missing_verl_omni, run_env, with_overrides,
    write_inputs)
from digenrl_verl.integrations.verl_omni_recipes import RECIPES

V1_TQ = "transfer_queue.backend.SimpleStorage.num_data_storage_units=1"  # one storage unit (8 CPU actors otherwise)
NAIVE = f"{A}.rollout.checkpoint_engine.backend=naive"
NO_REWARD_POOL = "reward.reward_model.enable_resource_pool=False"
#: mode -> (entry point, what it adds to the recipe's command line)
MODE_OVERRIDES = {
    "v0": (ENTRY, ("trainer.use_v1=false", NAIVE)),
    "sync": (V1_ENTRY, ("trainer.use_v1=true", "trainer.v1.trainer_mode=sync", NAIVE, V1_TQ)),
    "separate_async": (V1_ENTRY, SEPARATE_ASYNC),
}
MODES = tuple(MODE_OVERRIDES)
#: every run takes these of the bench's `SAME` (seeded where the script is not, one agent-loop worker, no dataloader
#: workers); the scripts' own seeds, dtypes, LoRA targets and optimizer stay
KEPT = tuple(o for o in SAME if o.split("=", 1)[0].lstrip("+").endswith(
    ("rollout.seed", "data.seed", "agent.num_workers", "dataloader_num_workers")))
#: a failure's lines that name it: exceptions as Python prints them (Ray's prefix allowed), else any line that says
#: why (the last of them are kept; command-line echoes, longer than `LONG`, are not reasons)
RAISED = re.compile(r"^(\(.*?\)\s*)?[\w.]*(Error|Exception|Interrupt|Timeout)\b\s*[:(]")
REASON = re.compile(r"(Error|Exception|assert|refus|not supported|Unknown|No module|Killed|Timeout)")
LONG = 600


def argv_for(stock: list[str], mode: str, out: Path, steps: int) -> tuple[str, list[str]]:
    """The entry point and command line of `mode` on the recipe's `stock` list (from `write_inputs`), its output
    under `out`, `steps` steps (validation at the last, as the scripts validate)."""
    entry, extra = MODE_OVERRIDES[mode]
    keys = {o.split("=", 1)[0].lstrip("+~") for o in stock}
    kept = [o for o in KEPT if not (o.split("=", 1)[0].endswith("seed") and o.split("=", 1)[0] in keys)]
    # the reward model's own pool (SD3.5's script) goes with the reward model the tiny runs switch off: v0 reserves it
    # whether or not a reward model runs (`main_diffusion.py:190-197`), one device no process uses
    pool = [NO_REWARD_POOL] if f"{NO_REWARD_POOL.split('=')[0]}=True" in stock else []
    argv = with_overrides(stock, [f"trainer.total_training_steps={steps}", *kept, *extra, *pool,
                                  f"trainer.default_local_dir={out / 'checkpoints'}", f"trainer.test_freq={steps}"])
    return entry, argv


def reason(console: str, keep: int = 6) -> str:
    """The console's last lines that name a failure (`RAISED`, else `REASON`), else its last lines."""
    lines = [line.strip() for line in console.splitlines() if line.strip() and len(line) < LONG]
    raised = list(dict.fromkeys(line for line in lines if RAISED.search(line)))  # once each, in order
    named = raised or [line for line in lines if REASON.search(line)]
    return " | ".join((named or lines)[-keep:])[-1500:]


def try_one(name: str, mode: str, stock: list[str], out: Path, steps: int, timeout: int) -> dict:
    """One run of verl-omni's trainer; its row (and `out/console.log`, `out/run.json`)."""
    out.mkdir(parents=True)
    entry, argv = argv_for(stock, mode, out, steps)
    cmd = [sys.executable, "-m", entry, *argv, f"hydra.run.dir={out / 'hydra'}"]
    load0, t0 = os.getloadavg()[0], time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=out, env=run_env("stock"), capture_output=True, text=True, timeout=timeout)
        code, console = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        console = ((e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
                   + f"\nTimeout: stopped after {timeout} s")
    seconds = time.monotonic() - t0
    (out / "console.log").write_text(console)
    logged = console_steps(console)
    trained = sorted(s for s, m in logged.items() if m.get("actor/grad_norm", 0) > 0)
    ok = code == 0 and trained == list(range(1, steps + 1))
    row = {"recipe": name, "mode": mode, "entry_point": entry, "passed": ok, "returncode": code,
           "seconds": round(seconds, 1), "steps_trained": trained,
           "validated": any(k.startswith("val-core/") for m in logged.values() for k in m),
           "step_s": [logged[s].get("timing_s/step") for s in trained],
           "load_average_start": load0, "load_average_end": os.getloadavg()[0],
           "reason": "" if ok else reason(console), "argv": argv, "out": str(out)}
    (out / "run.json").write_text(json.dumps(row))
    print(f"{name} {mode}: {'passed' if ok else 'FAILED'} in {seconds:.0f} s" + ("" if ok else f": {row['reason']}"),
          flush=True)
    return row


def table(rows: list[dict]) -> str:
    """The rows as a markdown table: recipe by mode."""
    lines = ["| recipe | mode | result | wall | steps trained, `timing_s/step` | reason |", "|---|---|---|---|---|---|"]
    for r in rows:
        steps = ", ".join(f"{s}: {t:.1f} s" for s, t in zip(r["steps_trained"], r["step_s"]) if t is not None)
        lines.append(f"| {r['recipe']} | {r['mode']} | {'passed' if r['passed'] else 'failed'} | {r['seconds']:.0f} s "
                     f"| {steps or '-'}{', validated' if r['validated'] else ''} | "
                     f"{r['reason'].replace('|', '/') or '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m digenrl_verl.bench.verl_omni_matrix",
                                description=__doc__.splitlines()[0])
    p.add_argument("--keep", required=True, metavar="DIR", help="a new or empty folder for the runs")
    p.add_argument("--steps", type=int, default=2, help="global steps of each run (default 2)")
    p.add_argument("--only", nargs="*", default=None, metavar="RECIPE:MODE",
                   help=f"these combinations only (recipes {sorted(RECIPES)}, modes {list(MODES)})")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per run (default 1200)")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON line at the end")
    args = p.parse_args(argv)
    why = missing_verl_omni()
    if why:
        print(why, file=sys.stderr)
        return 2
    combos = [(n, m) for n in RECIPES for m in MODES]
    if args.only:
        wanted = [tuple(o.split(":", 1)) for o in args.only]
        unknown = [w for w in wanted if w not in combos]
        if unknown:
            p.error(f"--only {unknown}: not of {combos}")
        combos = [c for c in combos if c in wanted]
    root = Path(args.keep)
    if root.exists() and any(root.iterdir()):
        p.error(f"--keep {root}: the folder is not empty")
    rows, stocks = [], {}
    for name, mode in combos:
        if name not in stocks:
            (root / name / "data").mkdir(parents=True)
            stocks[name] = write_inputs(root / name / "data", name)
        rows.append(try_one(name, mode, stocks[name], root / name / mode, args.steps, args.timeout))
    print(table(rows), flush=True)
    if args.json:
        print(json.dumps(rows))
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
