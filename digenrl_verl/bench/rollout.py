"""`python -m digenrl_verl.bench rollout`: the rollout engines of a generator on one tiny model (issue 29).

What a generator's engine costs, each engine in a Ray actor on a generator pool's bundle, as a run places it
(`RolloutHost`; with ``verl_omni_replica`` the bundle hosts the replica too, `workers.pools.PoolSpec.hosts_replica`,
in a Ray instance with one logical GPU on CPU, which that bundle holds):

* ``start_s``: the engine built from the policy (`ENGINES.engine_class(name).from_policy`): for the replica, its
  worker, verl-omni's server, vLLM-Omni's `AsyncOmni` and its spawned diffusion worker;
* ``samples_per_s``: `--rounds` calls of `generate` on the same `--samples` rows of successive steps (their seeds
  differ by step), the median round;
* ``update_s``: a hand-over of new weights (`hand_over`: what arrives from a trainer, then into the engine: for the
  replica through verl's server adapter) and the next samples, which must follow them;
* ``recovery_s`` (replica only): its server killed, the next `generate` finds it dead, starts a new replica on the
  same bundle with the weights it holds and draws the rows again (`VerlOmniReplicaEngine.replace_replica`).

Every engine's samples (the first round, and after the update) are compared with the first engine's
(``parity``: max relative error of latents and log-probs, uint8 levels of the images); engines that sample the same
way (``verl_omni`` in-process, ``verl_omni_replica``) must agree within 1e-5. ``speedup`` is each engine against the
first (``baseline``), for start-up and samples/s. Where the replica cannot win on CPU: it serves one request per
vLLM-Omni batch here (``max_num_seqs=1``, vLLM-Omni 0.27's CPU race) and every request crosses two processes
(the server and its diffusion worker); its start-up is a server and a worker process, seconds of imports each.

    python -m digenrl_verl.bench rollout --json                        # verl_omni vs verl_omni_replica (verl-omni)
    python -m digenrl_verl.bench rollout --engines diffusers --json    # the package's own engine (no verl-omni)

`--keep DIR` writes `rollout.pt` (every engine's facts and rollouts) there, for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ARCH = "WanPipeline"
REPLICA = "verl_omni_replica"
TOL = 1e-5
SAME_SAMPLER = {"verl_omni", REPLICA}  # verl-omni's pipeline, in the generator's process or behind its server


class RolloutHost:
    """A Ray actor holding one rollout engine, as a generator worker holds it (on its pool's bundle)."""

    def start(self, spec) -> dict:
        import ray
        from ray.util.placement_group import get_current_placement_group

        from digenrl_verl.engines.base import ENGINES

        t0 = time.perf_counter()
        self.engine = ENGINES.engine_class(spec.engine.name).from_policy(spec)
        out: dict[str, Any] = {"start_s": time.perf_counter() - t0,
                               "harness_here": "digenrl_verl.integrations.vllm_omni_cpu" in sys.modules}
        replica = getattr(self.engine, "replica", None)
        if replica is not None:
            from digenrl_verl.integrations.verl_omni_replica import server_facts

            out.update(replica=type(replica).__qualname__, mode=replica.rollout_mode.value,
                       host_pg=get_current_placement_group().id.hex(),
                       worker_pgs=ray.get([w.__ray_call__.remote(
                           lambda self: ray.get_runtime_context().get_placement_group_id()) for w in replica.workers]),
                       cluster_gpus=ray.cluster_resources().get("GPU", 0.0),
                       server=ray.get(self.engine.server.__ray_call__.remote(lambda self: server_facts())))
        return out

    def step(self, kind: str, *args) -> dict:
        import ray

        t0 = time.perf_counter()
        out = None
        if kind == "kill_server":  # the replica's server dies; the engine finds out at its next call
            from digenrl_verl.integrations.verl_omni_replica import server_facts

            self.killed = ray.get(self.engine.server.__ray_call__.remote(lambda self: server_facts()))["worker_pids"]
            ray.kill(self.engine.server, no_restart=True)
        elif kind == "hand_over":
            self.engine.hand_over(*args)
        else:
            out = self.engine.generate(*args)
        return {"kind": kind, "out": out, "s": time.perf_counter() - t0,
                "replicas_started": getattr(self.engine, "replicas_started", None)}

    def left_behind(self, wait_s: float = 30.0) -> list[int]:
        """The killed server's child processes (vLLM-Omni's diffusion workers) still alive after `wait_s`."""
        import psutil

        deadline = time.monotonic() + wait_s
        while True:
            alive = [pid for pid in getattr(self, "killed", []) if psutil.pid_exists(pid)
                     and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.5)

    def trainable(self) -> dict:
        return {n: p.detach().clone() for n, p in self.engine.trainable().items()}

    def stop(self) -> None:
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()


def policy(arch: str, model: str, engine: str, steps: int):
    """The tiny policy the engines sample (the verl-omni tier's: window SDE, two steps of it, fp32)."""
    from digenrl_verl.diffusion.rollout import RolloutConfig
    from digenrl_verl.engines.spec import PolicySpec, RolloutEngineSpec
    from digenrl_verl.models.config import LoraConfig, PipelineConfig

    sde, noise, guidance = {"WanPipeline": ("dance", 1.2, {"guidance_scale": 4.5, "num_frames": 5}),
                            "QwenImagePipeline": ("sde", 0.7, {"true_cfg_scale": 4.0, "negative_prompt": " "})}[arch]
    rollout = RolloutConfig(num_inference_steps=steps, sde_type=sde, noise_level=noise, timestep_selection="window",
                            sde_window_size=2, sde_window_range=(0, steps - 1), seed=5)
    return PolicySpec(model, LoraConfig(rank=0), PipelineConfig(height=32, width=32, max_sequence_length=16,
                                                                **guidance),
                      rollout, dtype="float32", engine=RolloutEngineSpec(name=engine, dtype="float32"))


def rows(samples: int, step: int):
    from digenrl_verl.engines.base import RolloutRows

    prompts = ["a red cube on a table", "a blue ball", "a green cone", "a yellow ring"]
    return RolloutRows([prompts[i % len(prompts)] for i in range(samples)], [f"u{i // 2}" for i in range(samples)],
                       [i % 2 for i in range(samples)], list(range(samples)), step=step)


def new_weights(state: dict) -> dict:
    """A seeded change of every trainable tensor (what a trainer would hand over), the same for every engine."""
    import torch

    gen = torch.Generator().manual_seed(1)
    return {n: w + 0.05 * torch.randn(w.shape, generator=gen) for n, w in sorted(state.items())}


def host_for(engine: str):
    """A `RolloutHost` actor on a generator bundle: with the replica, one that hosts it (`PoolSpec.hosts_replica`)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from digenrl_verl.integrations.verl_omni_replica import cuda_host
    from digenrl_verl.workers.pools import BUNDLE_VAR, PoolSpec

    spec = PoolSpec(f"bench_{engine}_", (1,), use_gpu=cuda_host(), hosts_replica=engine == REPLICA)
    pg = placement_group([spec.bundle()])
    ray.get(pg.ready())
    return ray.remote(RolloutHost).options(
        num_gpus=spec.worker_gpus if cuda_host() else 0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0),
        runtime_env={"env_vars": {BUNDLE_VAR: "0"}}).remote(), pg


def measure(engine: str, spec, cfg: argparse.Namespace) -> dict:
    """One engine through its phases (module docstring) in its own host actor."""
    import ray
    from ray.util.placement_group import remove_placement_group

    host, pg = host_for(engine)
    try:
        out = {"engine": engine, **ray.get(host.start.remote(replace(spec, engine=replace(spec.engine, name=engine))))}
        rounds = [ray.get(host.step.remote("generate", rows(cfg.samples, step))) for step in range(1, cfg.rounds + 1)]
        out["first"] = rounds[0]["out"]
        out["round_s"] = [r["s"] for r in rounds]
        out["samples_per_s"] = cfg.samples / statistics.median(out["round_s"])
        t0 = time.perf_counter()
        ray.get(host.step.remote("hand_over", new_weights(ray.get(host.trainable.remote())), 1))
        after = ray.get(host.step.remote("generate", rows(cfg.samples, 1)))
        out["update_s"], out["after"] = time.perf_counter() - t0, after["out"]
        if engine == REPLICA:
            ray.get(host.step.remote("kill_server"))
            again = ray.get(host.step.remote("generate", rows(cfg.samples, 1)))
            out.update(recovery_s=again["s"], recovered=again["out"], replicas_started=again["replicas_started"],
                       left_behind=ray.get(host.left_behind.remote()))
        ray.get(host.stop.remote())
        return out
    finally:
        ray.kill(host)
        remove_placement_group(pg)


def errors(got, want) -> dict:
    """Max relative error of latents / log-probs, and the largest image difference in uint8 levels."""
    out = {}
    for k in ("latents", "next_latents", "rollout_log_probs"):
        a, b = got.tensors[k].float(), want.tensors[k].float()
        out[k] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
    out["levels"] = int((got.images.int() - want.images.int()).abs().max())
    return out


def summarise(results: list[dict], cfg: argparse.Namespace) -> dict:
    base = results[0]
    rows_out, parity = [], {}
    for r in results:
        rows_out.append({k: r[k] for k in ("engine", "start_s", "samples_per_s", "round_s", "update_s", "recovery_s",
                                           "replicas_started", "left_behind", "mode") if k in r})
        if r is not base:
            parity[r["engine"]] = {"first": errors(r["first"], base["first"]),
                                   "after_update": errors(r["after"], base["after"])}
            if "recovered" in r:
                parity[r["engine"]]["recovered"] = errors(r["recovered"], base["after"])
    same = [e for e in parity if {e, base["engine"]} <= SAME_SAMPLER]
    within = all(max(v for k, v in p.items() if k != "levels") <= TOL for e in same for p in parity[e].values())
    return {"bench": "rollout", "baseline": base["engine"], "rows": rows_out, "parity": parity,
            "within_tolerance": within if same else None, "tolerance": TOL,
            "speedup": {r["engine"]: {"start_s": base["start_s"] / r["start_s"],
                                      "samples_per_s": r["samples_per_s"] / base["samples_per_s"]}
                        for r in results[1:]},
            "config": {"arch": cfg.arch, "samples": cfg.samples, "rounds": cfg.rounds, "steps": cfg.steps,
                       "engines": cfg.engines, "cpu_count": os.cpu_count()},
            "load_avg": list(os.getloadavg())}


def table(out: dict) -> str:
    lines = [f"rollout engines on tiny {out['config']['arch']} ({out['config']['samples']} samples a round, "
             f"{out['config']['rounds']} rounds; baseline {out['baseline']})",
             f"{'engine':<20}{'start s':>10}{'samples/s':>12}{'update s':>10}{'recovery s':>12}"]
    for r in out["rows"]:
        rec = f"{r['recovery_s']:.2f}" if "recovery_s" in r else "-"
        lines.append(f"{r['engine']:<20}{r['start_s']:>10.2f}{r['samples_per_s']:>12.2f}{r['update_s']:>10.2f}"
                     f"{rec:>12}")
    for engine, p in out["parity"].items():
        lines.append(f"parity {engine} vs {out['baseline']}: " + "; ".join(
            f"{phase} {max(v for k, v in e.items() if k != 'levels'):.2e}" for phase, e in p.items()))
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m digenrl_verl.bench rollout", description=__doc__.split("\n")[0])
    p.add_argument("--engines", default=f"verl_omni,{REPLICA}",
                   help="comma-separated rollout engines; the first is the baseline (default: %(default)s)")
    p.add_argument("--arch", default=ARCH, choices=["WanPipeline", "QwenImagePipeline"])
    p.add_argument("--samples", type=int, default=2, help="rows per generate call")
    p.add_argument("--rounds", type=int, default=3, help="generate calls timed per engine")
    p.add_argument("--steps", type=int, default=4, help="denoising steps")
    p.add_argument("--keep", default=None, help="write rollout.pt (facts and rollouts) into this folder")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    return p


def environment(engines: list[str]) -> dict:
    """This process's and its actors' environment, set before verl is imported: verl's CPU platform on a CPU host,
    and Ray's logical GPUs as the replica's device slots (`platform.cpu.LOGICAL_GPUS_VAR`)."""
    from digenrl_verl.integrations.verl_omni_replica import cuda_host
    from digenrl_verl.platform import process_env
    from digenrl_verl.platform.cpu import LOGICAL_GPUS_VAR

    cuda = cuda_host()
    return {**process_env(cpu=not cuda), **({} if cuda or REPLICA not in engines else {LOGICAL_GPUS_VAR: "1"})}


def main(argv: list[str]) -> int:
    cfg = parser().parse_args(argv)
    cfg.engines = [e.strip() for e in cfg.engines.split(",") if e.strip()]
    from digenrl_verl.engines.base import ENGINES

    for name in cfg.engines:
        why = ENGINES.entry(name).unavailable_reason()  # ValueError naming the valid engines for a wrong name
        if why is not None:
            print(f"bench rollout: engine {name!r} cannot run here: {why}", file=sys.stderr)
            return 2
    if cfg.samples < 1 or cfg.rounds < 1 or cfg.steps < 3:
        print("bench rollout: --samples and --rounds must be >= 1, --steps >= 3", file=sys.stderr)
        return 2
    import tempfile

    import ray

    from digenrl_verl.integrations.verl_omni_replica import cuda_host
    from digenrl_verl.models import build_tiny_model_dir

    env = environment(cfg.engines)
    os.environ.update(env)
    work = Path(cfg.keep) if cfg.keep else Path(tempfile.mkdtemp(prefix="bench_rollout_"))
    model = str(build_tiny_model_dir(cfg.arch, work / "model"))
    spec = policy(cfg.arch, model, cfg.engines[0], cfg.steps)
    ray.init(address="local", num_cpus=8, num_gpus=None if cuda_host() else int(REPLICA in cfg.engines),
             include_dashboard=False, runtime_env={"env_vars": env})
    try:
        results = []
        for name in cfg.engines:
            print(f"bench rollout: {name} ...", file=sys.stderr, flush=True)
            results.append(measure(name, spec, cfg))
    finally:
        ray.shutdown()
    out = summarise(results, cfg)
    if cfg.keep:
        import torch

        torch.save({"results": results, "summary": out}, work / "rollout.pt")
    print(table(out))
    if cfg.json:
        print(json.dumps(out))
    return 0
