"""`python -m digenrl_verl.bench e2e [--json] [--repeat R]`: colocated baselines and the DigenRL ladder on Ray (CPU).

`--baseline verl_omni` runs another bench instead: verl-omni's own stock trainer against the same command line
with the flag (`digenrl_verl.bench.e2e_verl_omni`; its options: `e2e --baseline verl_omni --help`). Without
`--baseline` (or `--baseline ladder`) it runs the ladder below.

Same tiny FLUX model ("bench" size: 2+2 blocks, 64 latent tokens at 128 px), same batch, the same two CPU worker
processes (colocated: 2 workers that generate, score, then train; disaggregated: 1 generator + 1 trainer), the same
`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` in every row. Each row runs `--steps` global steps, R times
(`--repeat`, default 3; the ladder is run R times over, so every row sees the same spread of load) on one shared Ray
instance; a run is measured over the steps after `--warmup` (the first
steps pay one-off costs). The row reports the **median** run by throughput; every run is kept in the JSON.

The rows, one change at a time:

| row | mode | GAP | TSP | TAG | TCSS | old log-probs |
|---|---|---|---|---|---|---|
| `colocated-verl-omni` | colocated | - | per-timestep loop | - | - | recomputed |
| `colocated-best` | colocated | - | TSP | - | - | from the rollout |
| `naive-disaggregation` | disaggregated, full-batch barrier | no | no | off | 0 | recomputed |
| `+gap` | disaggregated, pipelined | yes | no | off | 0 | recomputed |
| `+tsp` | disaggregated | yes | yes | off | 0 | recomputed |
| `-recompute` | disaggregated | yes | yes | off | 0 | from the rollout |
| `digenrl-on-policy` | disaggregated | yes | yes | BTS | 0 | from the rollout |
| `digenrl` | disaggregated | yes | yes | BTS | staleness 1, <= 50 % stale | from the rollout |

The DigenRL rows (`digenrl-on-policy`, `digenrl`) use the same old-log-prob setting as `colocated-best`.

Per run: `samples_per_s` (samples of the measured steps / window, the window running from the end of the last
warm-up step to the end of the last step); `busy_utilisation` = the workers' in-call busy seconds in the window (each
worker times its own calls: `busy_s`) / (workers x window), read as the difference of two snapshots: one asked at the
end of the warm-up (it runs after the calls the worker already had queued) and one after the run;
`trace_utilisation` (time with a task outstanding, submit -> the driver notices completion, charged to every worker
of the task: it counts idle lock-step ranks and Ray latency as busy, kept for comparison only);
`samples_per_worker_s` (samples / (workers x window)); `reward_mean` (mean reward of the measured steps). Top-level
`vs_colocated_best` and `vs_verl_omni_like`: `digenrl`'s median throughput over those rows' medians; next to each,
`<key>_per_pass` (digenrl's run over the baseline's run of the same pass, minutes apart) and `<key>_paired_median`:
on a machine whose speed drifts between passes, the paired ratios are steadier than the ratio of medians. Each run
carries the 1-minute load average at its start and end, each row their min and max: on a shared machine the
figures are only comparable between rows run under the same load.

`startup` (unless `--no-startup`): where the start-up of the tiny demo (`recipes/run_tiny_cpu.sh`'s settings, one
global step) goes, from a fresh process (`trainer.runner.DigenRLTrainer.startup_phases`), next to a one-process
reference: a fresh Python process that loads the same tiny model with this package's worker code and runs one
rollout, one score and one update in-process (no Ray), timed from its process start. Each of the
`--startup-repeat` (default 3) rounds runs the reference, then the demo, back to back; the medians are reported with
every run and its load average. `--startup-only` measures the start-up alone (no ladder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from digenrl_verl.metric_names import METRICS as M

COLOCATED = ["trainer.digenrl.mode=colocated"]
DISAGG = ["trainer.digenrl.mode=disaggregated"]
RECOMPUTE = "actor_rollout_ref.rollout.recompute_old_log_probs=true"
NO_RECOMPUTE = "actor_rollout_ref.rollout.recompute_old_log_probs=false"
PIPE = ["trainer.digenrl.gap=true", "trainer.digenrl.pipeline=true"]
ON_POLICY = ["trainer.digenrl.tcss.staleness=0"]
#: `--baseline`: this module's ladder, or verl-omni's own trainer (`digenrl_verl.bench.e2e_verl_omni`)
BASELINES = ("ladder", "verl_omni")

LADDER: list[tuple[str, list[str]]] = [
    ("colocated-verl-omni", [*COLOCATED, "trainer.digenrl.tsp.enabled=false", RECOMPUTE]),
    ("colocated-best", [*COLOCATED, "trainer.digenrl.tsp.enabled=true", NO_RECOMPUTE]),
    ("naive-disaggregation", [*DISAGG, "trainer.digenrl.gap=false", "trainer.digenrl.pipeline=false",
                              "trainer.digenrl.tsp.enabled=false", "trainer.digenrl.tag.policy=off", *ON_POLICY,
                              RECOMPUTE]),
    ("+gap", [*DISAGG, *PIPE, "trainer.digenrl.tsp.enabled=false", "trainer.digenrl.tag.policy=off", *ON_POLICY,
              RECOMPUTE]),
    ("+tsp", [*DISAGG, *PIPE, "trainer.digenrl.tsp.enabled=true", "trainer.digenrl.tag.policy=off", *ON_POLICY,
              RECOMPUTE]),
    ("-recompute", [*DISAGG, *PIPE, "trainer.digenrl.tsp.enabled=true", "trainer.digenrl.tag.policy=off", *ON_POLICY,
                    NO_RECOMPUTE]),
    ("digenrl-on-policy", [*DISAGG, *PIPE, "trainer.digenrl.tsp.enabled=true", "trainer.digenrl.tag.policy=bts",
                           *ON_POLICY, NO_RECOMPUTE]),
    ("digenrl", [*DISAGG, *PIPE, "trainer.digenrl.tsp.enabled=true", "trainer.digenrl.tag.policy=bts",
                 "trainer.digenrl.tcss.staleness=1", "trainer.digenrl.tcss.max_stale_fraction=0.5", NO_RECOMPUTE]),
]

#: the tiny demo of `recipes/run_tiny_cpu.sh` (its overrides after `+preset=tiny_cpu`, the model path aside), for the
#: start-up figures (`demo_overrides`)
DEMO = ["actor_rollout_ref.model.algorithm=flow_grpo", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.pipeline.num_inference_steps=6", "actor_rollout_ref.rollout.algo.sde_type=sde",
        "actor_rollout_ref.rollout.algo.noise_level=0.7", "actor_rollout_ref.actor.optim.lr=3e-3",
        "data.train_batch_size=4", "reward.reward_functions={brightness: 1.0}", "trainer.logger=[console]",
        "trainer.digenrl.pools.colocated.workers_per_node=2", "trainer.digenrl.pools.generator.workers_per_node=1",
        "trainer.digenrl.pools.trainer.workers_per_node=1"]


def demo_overrides(model: str | Path) -> list[str]:
    """The start-up demo's command line after `python -m digenrl_verl.main`: `recipes/run_tiny_cpu.sh`'s, the tiny
    preset first (the package's defaults are verl-omni's; the preset passes the tiny values), then `DEMO`."""
    from digenrl_verl.main import TINY_CPU

    return [TINY_CPU, f"actor_rollout_ref.model.path={model}", *DEMO]


def load_average() -> float:
    return float(os.getloadavg()[0])


def _make_trainer_cls(warmup: int):
    """The runner, plus a snapshot of every worker's `busy_s` asked (not waited for) when step `warmup - 1` ends."""
    from digenrl_verl.trainer.runner import DigenRLTrainer

    class BenchTrainer(DigenRLTrainer):
        busy_refs: dict = {}

        def step_log(self, result):
            if len(self.results) == warmup:
                self.busy_refs = {w: a.checksum.remote() for w, a in self.workers.items()}
            return super().step_log(result)

    return BenchTrainer


def _measure(trainer, warmup: int) -> dict:
    import ray

    results = trainer.results
    first, last = results[warmup - 1], results[-1]
    window = last.end - first.end
    steps = len(results) - warmup
    samples = steps * trainer.run.prompts_per_step * trainer.run.n
    workers = list(trainer.workers)
    before = {w: float(s["busy_s"]) for w, s in zip(trainer.busy_refs, ray.get(list(trainer.busy_refs.values())))}
    after = {w: float(s["busy_s"]) for w, s in trainer.worker_stats().items()}
    busy = {w: after[w] - before[w] for w in workers}
    events = [e for e in trainer.driver.trace.events if e.end > first.end and e.start < last.end]
    outstanding = {w: 0.0 for w in workers}
    for e in events:
        outstanding[e.worker] = outstanding.get(e.worker, 0.0) + (min(e.end, last.end) - max(e.start, first.end))
    rewards = [h[M["reward_mean"]] for h in trainer.reporter.history[warmup:]]
    return {"samples_per_s": samples / window, "window_s": window, "steps_measured": steps,
            "busy_utilisation": sum(busy.values()) / (len(workers) * window),
            "busy_s": busy, "samples_per_worker_s": samples / (len(workers) * window),
            "trace_utilisation": sum(outstanding.values()) / (len(workers) * window),
            "reward_mean": statistics.fmean(rewards),
            "tag_microbatches": sum(r.tag_microbatches for r in results[warmup:]),
            "stale_samples": sum(r.stale_samples for r in results[warmup:]),
            "startup": {k: v for k, v in trainer.startup_phases().items() if isinstance(v, float)}}


RATIOS = (("vs_colocated_best", "digenrl", "colocated-best"), ("vs_verl_omni_like", "digenrl", "colocated-verl-omni"),
          ("on_policy_vs_colocated_best", "digenrl-on-policy", "colocated-best"))
"""(key, row, baseline): the ratio of the rows' median throughputs; `<key>_per_pass` pairs the rows' runs of the same
pass over the ladder (minutes apart, so under the same load) and `<key>_paired_median` is their median."""


def paired_ratios(runs: list[dict], baseline: list[dict]) -> list[float]:
    """Throughput of each run of a row over the baseline's run of the same pass (the k-th runs of both)."""
    return [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(runs, baseline, strict=True)]


def _median_run(runs: list[dict]) -> dict:
    """The run of median throughput (the lower middle one for an even count)."""
    ranked = sorted(runs, key=lambda r: r["samples_per_s"])
    return ranked[(len(ranked) - 1) // 2]


def one_process_reference(model: str, overrides: list[str]) -> dict:
    """In this (fresh) process: load the tiny model with this package's worker code, then one rollout of a step's
    samples, their scores and one TSP update with an optimizer step, no Ray. Seconds from the process start."""
    import psutil

    t_proc = float(psutil.Process().create_time())
    t_imp0 = time.time()
    from digenrl_verl.main import TINY_CPU, compose  # noqa: I001 (the imports are timed)
    from digenrl_verl.trainer.config import build_run
    from digenrl_verl.trainer.data import make_step_batch
    from digenrl_verl.trainer.ray_executor import RayExecutor
    from digenrl_verl.weights.sync import CollectiveSpec, free_port
    from digenrl_verl.workers import roles

    addr = "127.0.0.1"
    port = free_port(addr)
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": addr, "MASTER_PORT": str(port),
                       "LOCAL_RANK": "0"})

    t_imported = time.time()
    run = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model}", *overrides,
                             "trainer.total_training_steps=1",
                             "trainer.digenrl.mode=colocated", "trainer.digenrl.pools.colocated.workers_per_node=1",
                             "trainer.digenrl.tsp.enabled=true", NO_RECOMPUTE]))
    worker = roles.ColocatedWorker(run.policy, run.train, run.reward, 1)
    worker.join(CollectiveSpec(addr, port, 1, 0, backend="gloo"))
    t_loaded = time.time()
    batch = make_step_batch(["a photo of a cat"] * run.prompts_per_step, ["t"] * run.prompts_per_step,
                            list(range(run.prompts_per_step)), run.n, 0)
    ids = list(range(len(batch)))
    traj, images, _ = worker.generate(batch, ids, 0)
    scores = worker.score(ids, images)["scores"]
    ex = RayExecutor({}, lambda step: batch, run.advantage, run.policy.rollout.num_train_steps)
    ex._scores[0] = dict(zip(ids, scores))
    adv = ex.advantages(0, ids)
    worker.update(ids, adv, float(len(ids) * run.policy.rollout.num_train_steps), True, 0, len(ids), traj)
    worker.opt_step(1)
    t_done = time.time()
    return {"time_to_first_step_s": t_done - t_proc, "python_start_s": t_imp0 - t_proc,
            "imports_s": t_imported - t_imp0, "config_and_model_load_s": t_loaded - t_imported,
            "first_step_s": t_done - t_loaded, "samples": len(ids)}


def _subprocess_json(args: list[str], env: dict | None = None, timeout: float = 600) -> dict:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{args} failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def startup(tmp: Path, repeat: int) -> dict:
    """Start-up of the tiny demo (disaggregated, 1 step, fresh process each) vs the one-process reference."""
    from digenrl_verl.models.tiny import build_tiny_model_dir

    model = build_tiny_model_dir("FluxPipeline", tmp / "tiny_flux", seed=0)
    demo, ref = [], []
    for rep in range(repeat):
        load = load_average()
        ref.append({**_subprocess_json(["-m", "digenrl_verl.bench.e2e", "--one-process-reference", str(model)]),
                    "load_average": load})
        load = load_average()
        out = tmp / f"startup_demo_{rep}"
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "digenrl_verl.main", *demo_overrides(model),
                               "trainer.total_training_steps=1", "trainer.digenrl.mode=disaggregated",
                               "trainer.digenrl.final_eval_prompts=0", f"trainer.digenrl.output_dir={out}"],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"the demo failed: {proc.stderr[-2000:]}")
        phases = json.loads((out / "summary.json").read_text())["startup"]
        demo.append({**{k: v for k, v in phases.items() if k != "per_worker"}, "command_s": time.time() - t0,
                     "load_average": load})

    def med(rows, key):
        vals = [r[key] for r in rows if isinstance(r.get(key), float)]
        return statistics.median(vals) if vals else float("nan")

    keys = sorted({k for r in demo for k, v in r.items() if isinstance(v, float)})
    return {"demo": "recipes/run_tiny_cpu.sh settings, disaggregated 1+1, one global step, fresh process",
            "reference": "one fresh Python process: this package's ColocatedWorker in-process (no Ray), one "
                         "rollout + score + TSP update + optimizer step of the same 16 samples",
            "demo_median": {k: med(demo, k) for k in keys},
            "reference_median": {k: med(ref, k) for k in sorted({k for r in ref for k, v in r.items()
                                                                   if isinstance(v, float)})},
            "demo_runs": demo, "reference_runs": ref,
            "ratio_demo_vs_reference": med(demo, "time_to_first_step_s") / med(ref, "time_to_first_step_s")}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m digenrl_verl.bench e2e", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--micro-batch", type=int, default=4,
                   help="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, the same in every row")
    p.add_argument("--num-inference-steps", type=int, default=8)
    p.add_argument("--only", nargs="*", default=None, help="subset of the rows to run")
    p.add_argument("--repeat", type=int, default=3, help="runs per row; the median run is reported, all are kept")
    p.add_argument("--startup-repeat", type=int, default=3,
                   help="fresh-process start-up measurements of each kind (medians reported, all kept)")
    p.add_argument("--no-startup", action="store_true", help="skip the start-up measurement")
    p.add_argument("--startup-only", action="store_true", help="only the start-up measurement (no ladder)")
    p.add_argument("--one-process-reference", metavar="MODEL", default=None, help=argparse.SUPPRESS)
    p.add_argument("--baseline", choices=BASELINES, default="ladder",
                   help="ladder (default): the rows of this bench's docstring, on the package's own trainer; "
                        "verl_omni: verl-omni's stock trainer against the flag on its command line (its options: "
                        "e2e --baseline verl_omni --help)")
    return p


def _ladder_base(model: Path, args: argparse.Namespace) -> list[str]:
    """The overrides every row of the ladder shares (the rows add theirs)."""
    return [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.pipeline.height=128",
            "actor_rollout_ref.rollout.pipeline.width=128",
            f"actor_rollout_ref.rollout.pipeline.num_inference_steps={args.num_inference_steps}",
            f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}",
            f"trainer.total_training_steps={args.steps}", "trainer.logger=[console]",
            "actor_rollout_ref.actor.optim.lr=1e-3", "trainer.digenrl.final_eval_prompts=0",
            "trainer.digenrl.pools.colocated.workers_per_node=2", "trainer.digenrl.pools.generator.workers_per_node=1",
            "trainer.digenrl.pools.trainer.workers_per_node=1"]


def _run_ladder(ladder: list[tuple[str, list[str]]], base: list[str], tmp: Path,
                args: argparse.Namespace) -> dict[str, list[dict]]:
    """Each row `args.repeat` times; the measured runs per row."""
    from digenrl_verl.main import TINY_CPU, compose
    from digenrl_verl.trainer.config import build_run

    trainer_cls = _make_trainer_cls(args.warmup)
    runs: dict[str, list[dict]] = {name: [] for name, _ in ladder}
    # repeats outermost: every row's k-th run comes from the same pass over the ladder, so on a shared machine the
    # rows see the same spread of load (a row run R times in a row would see only the load of its own minutes)
    for rep in range(args.repeat):
        for name, overrides in ladder:
            cfg = compose([TINY_CPU, *base, *overrides, f"trainer.digenrl.output_dir={tmp / name / str(rep)}",
                           f"trainer.experiment_name=bench_{name}"])
            trainer = trainer_cls(build_run(cfg))
            load0, t0 = load_average(), time.perf_counter()
            try:
                trainer.fit()
                runs[name].append({**_measure(trainer, args.warmup), "run_s": time.perf_counter() - t0,
                                   "load_average_start": load0, "load_average_end": load_average()})
            finally:
                trainer.shutdown()
            r = runs[name][-1]
            print(f"pass {rep + 1}/{args.repeat} {name:>22}: {r['samples_per_s']:7.2f} samples/s  busy "
                  f"{r['busy_utilisation']:.1%}  load {load0:.1f}->{r['load_average_end']:.1f}", flush=True)
    return runs


def _row(name: str, runs: list[dict]) -> dict:
    """One row of the report: the median run's figures, every run kept."""
    med = _median_run(runs)
    loads = [x for r in runs for x in (r["load_average_start"], r["load_average_end"])]
    return {"config": name, "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
            **{k: med[k] for k in ("busy_utilisation", "samples_per_worker_s", "reward_mean", "trace_utilisation",
                                   "window_s", "steps_measured", "tag_microbatches", "stale_samples")},
            "samples_per_s_runs": [r["samples_per_s"] for r in runs],
            "reward_mean_runs": [r["reward_mean"] for r in runs],
            "load_average_min": min(loads), "load_average_max": max(loads), "runs": runs}


def _report_ladder(out: dict, runs: dict[str, list[dict]], args: argparse.Namespace) -> None:
    """Rows, the run's settings and the RATIOS into `out`, printed as a table."""
    rows = [_row(name, row_runs) for name, row_runs in runs.items()]
    by = {r["config"]: r for r in rows}
    out.update(rows=rows, config={
        "model": "FluxPipeline bench size (2+2 blocks, 64 tokens)", "workers": 2, "prompts_per_step": args.prompts,
        "n": args.n, "ppo_micro_batch_size_per_gpu": args.micro_batch, "num_inference_steps": args.num_inference_steps,
        "steps": args.steps, "warmup": args.warmup, "repeat": args.repeat, "statistic": "median over repeats",
        "torch_threads_per_worker": 1, "cpu_count": os.cpu_count()})
    for key, row, base in RATIOS:
        if row in by and base in by:
            out[key] = by[row]["samples_per_s"] / by[base]["samples_per_s"]
            out[f"{key}_per_pass"] = per_pass = paired_ratios(runs[row], runs[base])
            out[f"{key}_paired_median"] = statistics.median(per_pass)
    out["load_average_end"] = load_average()
    for r in rows:
        print(f"{r['config']:>22} {r['samples_per_s']:8.2f} samples/s  busy {r['busy_utilisation']:6.1%}  "
              f"{r['samples_per_worker_s']:6.2f} samples/worker-s")
    for k, _, _ in RATIOS:
        if k in out:
            print(f"{k}: {out[k]:.3f} (medians); per pass {', '.join(f'{x:.3f}' for x in out[f'{k}_per_pass'])}, "
                  f"their median {out[f'{k}_paired_median']:.3f}")


def _baseline(argv: list[str]) -> tuple[str, list[str]]:
    """`--baseline` (default "ladder") and the rest of `argv`."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--baseline", choices=BASELINES, default="ladder")
    known, rest = pre.parse_known_args(argv)
    return known.baseline, rest


def main(argv: list[str]) -> int:
    baseline, rest = _baseline(argv)
    if baseline == "verl_omni":  # another bench, its own options (imports nothing of verl-omni until it runs)
        from digenrl_verl.bench import e2e_verl_omni

        return e2e_verl_omni.main(rest)
    p = _parser()
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.one_process_reference:
        print(json.dumps(one_process_reference(args.one_process_reference, DEMO)))
        return 0
    if args.startup_only and args.no_startup:
        p.error("--startup-only and --no-startup exclude each other")
    if args.steps <= args.warmup or args.warmup < 1:
        p.error("--steps must exceed --warmup, and --warmup must be >= 1")

    from digenrl_verl.models.tiny import build_tiny_model_dir
    from digenrl_verl.trainer.ray_runtime import init_local_ray

    tmp = Path(tempfile.mkdtemp(prefix="digenrl_bench_e2e_"))
    out: dict = {"bench": "e2e", "load_average_start": load_average()}
    if not args.no_startup:  # first, before this process starts Ray: the demo starts its own
        out["startup"] = startup(tmp, args.startup_repeat)
        s = out["startup"]
        print(f"start-up: demo {s['demo_median'].get('time_to_first_step_s', float('nan')):.1f} s to the first step, "
              f"one-process reference {s['reference_median']['time_to_first_step_s']:.1f} s", flush=True)
    if not args.startup_only:
        model = build_tiny_model_dir("FluxPipeline", tmp / "flux_bench", seed=0, size="bench")
        import ray

        if not ray.is_initialized():  # (tests run it on their shared Ray instance)
            init_local_ray(num_cpus=2, torch_threads=1)
        ladder = [(name, overrides) for name, overrides in LADDER if not args.only or name in args.only]
        _report_ladder(out, _run_ladder(ladder, _ladder_base(model, args), tmp, args), args)
    else:
        out["load_average_end"] = load_average()
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
