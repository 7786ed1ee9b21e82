"""`python -m digenrl_verl.bench e2e [--json]`: colocated vs disaggregated training throughput on Ray (CPU).

Same tiny FLUX model ("bench" size: 2+2 blocks, 64 latent tokens at 128 px), same batch, the same two CPU
worker processes (colocated: 2 workers that generate, score, then train; disaggregated: 1 generator + 1
trainer). Each configuration runs `--steps` global steps on one shared Ray instance; throughput counts the
steps after `--warmup` (the first steps pay one-off costs), utilisation comes from the run's trace over the
same window. With `--repeat R` each configuration runs R times and the best run is reported (on a shared
machine other processes only ever slow a run down); all throughputs are kept in the JSON.

The ladder: colocated (per-timestep loop with verl-omni's old-log-prob recompute pass) → naive
disaggregation (batch-axis split, full-batch barrier, per-timestep, recompute) → +GAP (one prompt group per
micro-batch, pipelined) → +TSP (batched timesteps, rollout log-probs reused) → +TAG (BTS) → +TCSS
(staleness 1, stale fraction 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

LADDER: list[tuple[str, list[str]]] = [
    ("colocated", ["trainer.digenrl.mode=colocated", "trainer.digenrl.tsp.enabled=false",
                   "actor_rollout_ref.rollout.recompute_old_log_probs=true"]),
    ("naive_disaggregation", ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.gap=false",
                              "trainer.digenrl.pipeline=false", "trainer.digenrl.tsp.enabled=false",
                              "trainer.digenrl.tag.policy=off",
                              "actor_rollout_ref.rollout.recompute_old_log_probs=true"]),
    ("+gap", ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.gap=true", "trainer.digenrl.pipeline=true",
              "trainer.digenrl.tsp.enabled=false", "trainer.digenrl.tag.policy=off",
              "actor_rollout_ref.rollout.recompute_old_log_probs=true"]),
    ("+tsp", ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.tsp.enabled=true",
              "trainer.digenrl.tag.policy=off",
              "actor_rollout_ref.rollout.recompute_old_log_probs=false"]),
    ("+tag", ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.tsp.enabled=true",
              "trainer.digenrl.tag.policy=bts",
              "actor_rollout_ref.rollout.recompute_old_log_probs=false"]),
    ("+tcss", ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.tsp.enabled=true",
               "trainer.digenrl.tag.policy=bts",
               "trainer.digenrl.tcss.staleness=1", "trainer.digenrl.tcss.max_stale_fraction=0.5",
               "actor_rollout_ref.rollout.recompute_old_log_probs=false"]),
]


def _measure(trainer, warmup: int) -> dict:
    results = trainer.results
    first, last = results[warmup - 1], results[-1]
    window = last.end - first.end
    steps = len(results) - warmup
    samples = steps * trainer.run.prompts_per_step * trainer.run.n
    metrics = trainer.driver.trace.metrics(workers=list(trainer.workers))
    events = [e for e in trainer.driver.trace.events if e.start >= first.end]
    busy = {w: 0.0 for w in trainer.workers}
    for e in events:
        busy[e.worker] = busy.get(e.worker, 0.0) + (min(e.end, last.end) - e.start)
    util = sum(busy.values()) / (len(busy) * window) if window > 0 else float("nan")
    return {"samples_per_s": samples / window, "window_s": window, "steps_measured": steps,
            "utilisation": util, "utilisation_whole_run": metrics.utilisation,
            "reward_last": trainer.reporter.history[-1]["reward/mean"]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m digenrl_verl.bench e2e", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--num-inference-steps", type=int, default=8)
    p.add_argument("--only", nargs="*", default=None, help="subset of the ladder to run")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per configuration; the best throughput is reported (other processes on a shared "
                        "machine only ever slow a run down), every run is kept in the JSON")
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error("--steps must exceed --warmup")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from digenrl_verl.main import compose
    from digenrl_verl.models.tiny import build_tiny_model_dir
    from digenrl_verl.trainer.config import build_run
    from digenrl_verl.trainer.ray_runtime import init_local_ray
    from digenrl_verl.trainer.runner import DigenRLTrainer

    tmp = Path(tempfile.mkdtemp(prefix="digenrl_bench_e2e_"))
    model = build_tiny_model_dir("FluxPipeline", tmp / "flux_bench", seed=0, size="bench")
    init_local_ray(num_cpus=2, torch_threads=1)
    base = [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.pipeline.height=128",
            "actor_rollout_ref.rollout.pipeline.width=128",
            f"actor_rollout_ref.rollout.pipeline.num_inference_steps={args.num_inference_steps}",
            f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
            f"trainer.total_training_steps={args.steps}", "trainer.logger=[console]",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "trainer.digenrl.pools.colocated.workers_per_node=2", "trainer.digenrl.pools.generator.workers_per_node=1",
            "trainer.digenrl.pools.trainer.workers_per_node=1"]
    rows = []
    for name, overrides in LADDER:
        if args.only and name not in args.only:
            continue
        runs = []
        for rep in range(args.repeat):
            cfg = compose([*base, *overrides, f"trainer.digenrl.output_dir={tmp / name / str(rep)}",
                           f"trainer.experiment_name=bench_{name}"])
            trainer = DigenRLTrainer(build_run(cfg))
            t0 = time.perf_counter()
            try:
                trainer.fit()
                runs.append({**_measure(trainer, args.warmup), "run_s": time.perf_counter() - t0})
            finally:
                trainer.shutdown()
        best = max(runs, key=lambda r: r["samples_per_s"])
        row = {"config": name, **best, "samples_per_s_all": [r["samples_per_s"] for r in runs]}
        rows.append(row)
        print(f"{name:>22}: {row['samples_per_s']:7.2f} samples/s  utilisation {row['utilisation']:.1%}", flush=True)
    by = {r["config"]: r for r in rows}
    out = {"bench": "e2e", "rows": rows,
           "config": {"model": "FluxPipeline bench size (2+2 blocks, 64 tokens)", "workers": 2,
                      "prompts_per_step": args.prompts, "n": args.n, "num_inference_steps": args.num_inference_steps,
                      "steps": args.steps, "warmup": args.warmup, "repeat": args.repeat,
                      "torch_threads_per_worker": 1,
                      "cpu_count": os.cpu_count()}}
    if "colocated" in by and "+tcss" in by:
        out["ratio_full_vs_colocated"] = by["+tcss"]["samples_per_s"] / by["colocated"]["samples_per_s"]
        out["utilisation_full"] = by["+tcss"]["utilisation"]
    if "colocated" in by and "+tag" in by:
        out["ratio_on_policy_vs_colocated"] = by["+tag"]["samples_per_s"] / by["colocated"]["samples_per_s"]
    for r in rows:
        print(f"{r['config']:>22} {r['samples_per_s']:8.2f} samples/s  util {r['utilisation']:6.1%}")
    if args.json:
        print(json.dumps(out))
    return 0
