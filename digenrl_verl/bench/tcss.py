"""TCSS learning at the recipes' clip: paired on-policy vs TCSS runs on the tiny FLUX model, per stale-row objective.

`python -m digenrl_verl.bench tcss --json [--pairs 2x4:42,4x4:1] [--arms on,clip,decoupled] [--steps 12]`

Each pair (prompts x n : rollout.seed) runs every arm with the same seed, prompts and noise (the method of
`tests/trainer/test_trainer_tcss_learning_on_cpu.py`): `on` (staleness 0), `clip` and `decoupled` (staleness 1,
max_stale_fraction 0.5, `trainer.digenrl.tcss.objective`). Settings as `recipes/run_tiny_cpu.sh` (lr 3e-3, brightness
reward) with clip 1e-4, TAG off and the TCSS guard off (stale GENs whenever the limits allow). Per run: the reward
trajectory, `last3` (mean reward of the last 3 steps), `gain` (last3 − mean of the first 3), the stale share and the
run-level stale-row metrics (`digenrl/actor/stale_clip_frac`, `stale_zero_grad_frac`, `stale_is_weight_mean` / `_max`,
`stale_is_capped_frac`). Per TCSS arm over the pairs: `gain_share` (Σ gains / Σ on-policy gains), the gaps
(on-policy last3 − the arm's) and their mean and largest magnitude. This measures learning, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from digenrl_verl.bench.e2e import load_average
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.models.tiny import build_tiny_model_dir
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.ray_runtime import init_local_ray
from digenrl_verl.trainer.runner import DigenRLTrainer

COMMON = ("actor_rollout_ref.rollout.n={n}", "data.train_batch_size={prompts}",
          "actor_rollout_ref.rollout.seed={seed}", "trainer.total_training_steps={steps}",
          "trainer.digenrl.mode=disaggregated", "trainer.digenrl.tag.policy=off", "trainer.digenrl.tcss.guard=false",
          "actor_rollout_ref.actor.optim.lr=3e-3", "actor_rollout_ref.actor.diffusion_loss.clip_ratio=1e-4",
          "trainer.digenrl.final_eval_prompts=0", "trainer.logger=[console]",
          "reward.reward_functions={{brightness: 1.0}}")  # (str.format: {{ }} is a brace)
STALE = ("trainer.digenrl.tcss.staleness=1", "trainer.digenrl.tcss.max_stale_fraction=0.5")
ARMS = {"on": ("trainer.digenrl.tcss.staleness=0",),
        "clip": (*STALE, "trainer.digenrl.tcss.objective=clip"),
        "decoupled": (*STALE, "trainer.digenrl.tcss.objective=decoupled")}
PAIRS = "2x4:42,2x4:1,2x4:2,4x4:42,4x4:1,4x4:2,4x4:3"
RUN_METRICS = tuple(M[q] for q in ("stale_clip_frac", "stale_zero_grad_frac", "pg_zero_grad_frac",
                                   "stale_is_weight_mean", "stale_is_weight_max", "stale_is_capped_frac"))


def parse_pairs(text: str) -> list[tuple[int, int, int]]:
    """`"2x4:42,4x4:1"` -> [(prompts, n, seed), ...]."""
    out = []
    for item in text.split(","):
        try:
            shape, seed = item.split(":")
            prompts, n = shape.split("x")
            out.append((int(prompts), int(n), int(seed)))
        except ValueError:
            raise ValueError(f"--pairs item {item!r}: use PROMPTSxN:SEED, e.g. 2x4:42") from None
    return out


def run_arm(model: str, out_dir: Path, prompts: int, n: int, seed: int, arm: str, steps: int) -> dict:
    t0 = time.perf_counter()
    overrides = [o.format(prompts=prompts, n=n, seed=seed, steps=steps) for o in COMMON]
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={model}", f"trainer.digenrl.output_dir={out_dir}",
                   *overrides,
                   *ARMS[arm]])
    trainer = DigenRLTrainer(build_run(cfg))
    try:
        trainer.fit()
        history, summary = trainer.reporter.history, trainer.summary
    finally:
        trainer.shutdown()
    rewards = [float(h[M["reward_mean"]]) for h in history]
    stale = [int(h.get(M["stale_samples"], 0)) for h in history]
    return {"prompts": prompts, "n": n, "seed": seed, "arm": arm, "rewards": [round(r, 5) for r in rewards],
            "last3": float(np.mean(rewards[-3:])), "gain": float(np.mean(rewards[-3:]) - np.mean(rewards[:3])),
            "stale_samples": stale, "stale_share": sum(stale) / (prompts * n * len(history)),
            **{k: summary.get(k) for k in RUN_METRICS},
            "step_stale_is_weight_mean": [round(float(h.get(M["stale_is_weight_mean"], 0.0)), 5) for h in history],
            "wall_s": round(time.perf_counter() - t0, 1)}


def compare(runs: list[dict]) -> dict:
    """Per TCSS arm: gain share, gaps to the on-policy run of the same pair, their mean and largest magnitude."""
    by = {(r["prompts"], r["n"], r["seed"], r["arm"]): r for r in runs}
    pairs = sorted({k[:3] for k in by if k[3] == "on"})
    out = {}
    for arm in sorted({k[3] for k in by} - {"on"}):
        both = [(by[p + ("on",)], by[p + (arm,)]) for p in pairs if p + (arm,) in by]
        if not both:
            continue
        gaps = [on["last3"] - r["last3"] for on, r in both]
        on_gain = sum(on["gain"] for on, _ in both)
        out[arm] = {"pairs": len(both), "gaps": [round(g, 5) for g in gaps], "mean_gap": float(np.mean(gaps)),
                    "max_abs_gap": float(max(abs(g) for g in gaps)),
                    "gain_share": sum(r["gain"] for _, r in both) / on_gain if on_gain else None}
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m digenrl_verl.bench tcss", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--pairs", default=PAIRS, help=f"PROMPTSxN:SEED items (default {PAIRS})")
    p.add_argument("--arms", default="on,clip,decoupled", help=f"comma-separated subset of {list(ARMS)}")
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    bad = [a for a in arms if a not in ARMS]
    if bad or "on" not in arms:
        p.error(f"--arms {args.arms!r}: use names of {list(ARMS)}, including on (the reference)")
    if args.steps < 6:
        p.error("--steps must be >= 6 (the first 3 and the last 3 steps are compared)")
    try:
        pairs = parse_pairs(args.pairs)
    except ValueError as e:
        p.error(str(e))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = Path(tempfile.mkdtemp(prefix="digenrl_bench_tcss_"))
    out: dict = {"bench": "tcss", "steps": args.steps, "load_average_start": load_average()}
    model = str(build_tiny_model_dir("FluxPipeline", tmp / "tiny_flux", seed=0))
    init_local_ray(num_cpus=8)
    runs = []
    for prompts, n, seed in pairs:
        for arm in arms:
            run = run_arm(model, tmp / f"{prompts}x{n}_{seed}_{arm}", prompts, n, seed, arm, args.steps)
            runs.append(run)
            print(f"{prompts}x{n} seed {seed} {arm}: last3 {run['last3']:.4f} gain {run['gain']:+.4f} stale share "
                  f"{run['stale_share']:.2f} stale clip {run[M['stale_clip_frac']]:.3f} zero-grad "
                  f"{run[M['stale_zero_grad_frac']]:.3f} w mean {run[M['stale_is_weight_mean']]:.4f} "
                  f"({run['wall_s']} s)", flush=True)
    out.update(runs=runs, compare=compare(runs), load_average_end=load_average())
    for arm, c in out["compare"].items():
        print(f"{arm}: gain share {c['gain_share']:.2f}, mean gap {c['mean_gap']:+.4f}, max |gap| "
              f"{c['max_abs_gap']:.4f} over {c['pairs']} pairs")
    if args.json:
        print(json.dumps(out))
    return 0
