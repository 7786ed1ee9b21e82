"""verl-omni's default advantages (`algorithm.global_std=true`) on CPU: what the step barrier costs and what the
deferred scaling recovers, on the same work.

`python -m digenrl_verl.bench global_std --json [--rounds 3] [--steps 8] [--mini-batches 1] [--prompts 4] [--n 4]`

Three arms, run in turn within each round (so a load change on a shared machine hits all of them): ``per-group``
(``algorithm.global_std=false``: each group's own std, GAP pipelining), ``barrier`` (``global_std=true`` with
``trainer.digenrl.pipeline=false``: the step's updates wait for its last reward, what the plan did before issue 32)
and ``deferred`` (``global_std=true``, the default plan: updates as groups are scored, the std applied at the
optimizer step). Settings as `recipes/run_tiny_cpu.sh` (tiny FLUX, 1 generator + 1 trainer, GAP + TSP + TAG BTS,
brightness reward). Per run: the median step time after `--warmup` steps, the samples trained late (deferred) and the
fraction of UPDATE time that ran while the step still had samples to score. Per arm: the median over the rounds;
ratios name their baseline (``barrier_over_per_group`` = barrier / per-group step time). This measures speed; the
arms' learning is the same by construction (per-group differs in its advantages, barrier and deferred do not).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from digenrl_verl.bench.e2e import load_average
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.models.tiny import build_tiny_model_dir
from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.ray_runtime import init_local_ray
from digenrl_verl.trainer.runner import DigenRLTrainer

COMMON = ("actor_rollout_ref.model.algorithm=flow_grpo", "actor_rollout_ref.rollout.algo.sde_type=sde",
          "actor_rollout_ref.rollout.algo.noise_level=0.7", "actor_rollout_ref.actor.optim.lr=3e-3",
          "reward.reward_functions={brightness: 1.0}", "trainer.digenrl.mode=disaggregated",
          "trainer.digenrl.final_eval_prompts=0", "trainer.logger=[console]")
ARMS = {"per-group": ("algorithm.global_std=false",),
        "barrier": ("algorithm.global_std=true", "trainer.digenrl.pipeline=false"),
        "deferred": ("algorithm.global_std=true",)}


def overlap(trainer: DigenRLTrainer) -> float:
    """The share of UPDATE seconds that ran before their step's last SCORE ended (0: a barrier)."""
    done = [c for c in trainer.driver.trace.sorted_completions() if c.ok]
    last = {}
    for c in done:
        if c.task.kind == TaskKind.SCORE:
            last[c.task.step] = max(last.get(c.task.step, 0.0), c.end)
    updates = [c for c in done if c.task.kind == TaskKind.UPDATE]
    total = sum(c.end - c.start for c in updates)
    early = sum(max(0.0, min(c.end, last.get(c.task.step, 0.0)) - c.start) for c in updates)
    return early / total if total else 0.0


def run_arm(model: str, out_dir: Path, arm: str, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    shape = (f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
             f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // args.mini_batches}",
             f"trainer.total_training_steps={args.steps}")
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={model}", f"trainer.digenrl.output_dir={out_dir}",
                   *COMMON, *shape, *ARMS[arm]])
    trainer = DigenRLTrainer(build_run(cfg))
    try:
        trainer.fit()
        times = [float(h[M["time_per_step"]]) for h in trainer.reporter.history]
        late, share = trainer.executor.late_samples, overlap(trainer)
    finally:
        trainer.shutdown()
    kept = times[args.warmup:]
    return {"arm": arm, "step_s_median": statistics.median(kept), "step_s": [round(t, 3) for t in times],
            "late_samples": late, "update_overlap": round(share, 3), "wall_s": round(time.perf_counter() - t0, 1)}


def summarise(runs: list[dict]) -> dict:
    per = {arm: statistics.median(r["step_s_median"] for r in runs if r["arm"] == arm)
           for arm in ARMS if any(r["arm"] == arm for r in runs)}
    out: dict = {"step_s_median": per}
    if {"per-group", "barrier", "deferred"} <= set(per):
        out.update(barrier_over_per_group=per["barrier"] / per["per-group"],
                   deferred_over_per_group=per["deferred"] / per["per-group"],
                   barrier_over_deferred=per["barrier"] / per["deferred"])
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m digenrl_verl.bench global_std", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--rounds", type=int, default=3, help="runs of every arm, interleaved")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of each run's median")
    p.add_argument("--prompts", type=int, default=4, help="prompt groups per global step")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--mini-batches", type=int, default=1, help="optimizer steps per global step")
    args = p.parse_args(argv)
    if args.steps <= args.warmup or args.rounds < 1 or args.prompts % args.mini_batches:
        p.error("need --steps > --warmup, --rounds >= 1 and --mini-batches dividing --prompts")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = Path(tempfile.mkdtemp(prefix="digenrl_bench_global_std_"))
    out: dict = {"bench": "global_std", "config": vars(args), "load_average_start": load_average()}
    model = str(build_tiny_model_dir("FluxPipeline", tmp / "tiny_flux", seed=0))
    init_local_ray(num_cpus=8)
    runs = []
    for r in range(args.rounds):
        for arm in ARMS:
            run = run_arm(model, tmp / f"{arm}_{r}", arm, args)
            runs.append(run)
            print(f"round {r} {arm}: median step {run['step_s_median']:.3f} s, late samples {run['late_samples']}, "
                  f"update overlap {run['update_overlap']:.2f} ({run['wall_s']} s)", flush=True)
    out.update(runs=runs, summary=summarise(runs), load_average_end=load_average())
    s = out["summary"]
    print("median step s: " + ", ".join(f"{a} {v:.3f}" for a, v in s["step_s_median"].items()))
    if "barrier_over_deferred" in s:
        print(f"barrier / per-group {s['barrier_over_per_group']:.3f}x, deferred / per-group "
              f"{s['deferred_over_per_group']:.3f}x, barrier / deferred {s['barrier_over_deferred']:.3f}x")
    if args.json:
        print(json.dumps(out))
    return 0
