"""A training run as a set of overridable steps (torchtitan style), shared by every mode.

    validate (build_run) → start_ray → build_workers → make_executor → make_driver → train → finish

Colocated and disaggregated runs differ only in the worker roles built (`build_workers`) and in the
schedule the driver follows; the loop itself is the scheduling engine's driver (`schedule.driver`), which
the Ray executor interprets. Nothing here decides what runs when.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from digenrl_verl.schedule.types import Task, TaskKind
from digenrl_verl.trainer.config import RunSpec
from digenrl_verl.trainer.data import PromptStream, load_prompts, make_step_batch

ROLE_POOL = {"colocated": "col", "generator": "gen", "trainer": "trn"}


@dataclass
class StepMetrics:
    """Per-step accumulators fed by completed tasks."""

    rewards: dict[int, float] = field(default_factory=dict)
    loss: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    ratio_min: float = float("inf")
    ratio_max: float = float("-inf")
    opt: dict[str, float] = field(default_factory=dict)


class DigenRLTrainer:
    """One run of `python -m digenrl_verl.main`. Subclass and override a step to change one behaviour."""

    def __init__(self, run: RunSpec) -> None:
        self.run = run
        self.cfg = run.cfg
        self.output_dir = run.output_dir
        self.output_dir.mkdir(parents=True, exist_ok=True)
        prompts, sources = load_prompts(self.cfg.data.train_files, self.cfg.data.prompt_key)
        self._prompts, self._sources = prompts, sources
        self._batches: dict[int, Any] = {}
        self.metrics: dict[int, StepMetrics] = defaultdict(StepMetrics)
        self.worker_groups: dict[str, Any] = {}
        self.workers: dict[str, Any] = {}
        self.results: list = []
        self.driver = None
        self.executor = None

    # ------------------------------------------------------------------------------------- data
    def step_batch(self, step: int):
        """The step's DataProto (deterministic in the step: prompts from cursor step × batch size)."""
        if step not in self._batches:
            n_prompts = self.run.prompts_per_step
            stream = PromptStream(self._prompts, self._sources, n_prompts, seed=int(self.cfg.data.seed or 0),
                                  shuffle=bool(self.cfg.data.shuffle), cursor=step * n_prompts)
            p, s, ids = stream.next_batch()
            self._batches[step] = make_step_batch(p, s, ids, self.run.n, step)
        return self._batches[step]

    # ----------------------------------------------------------------------------------- workers
    def start_ray(self) -> None:
        import ray

        from digenrl_verl.trainer.ray_runtime import init_local_ray

        if not ray.is_initialized():
            total = sum(self.run.digenrl.pools[r].size for r in self.run.digenrl.roles)
            init_local_ray(num_cpus=max(total, 2), torch_threads=self.run.digenrl.torch_threads)

    def worker_class(self, role: str):
        from digenrl_verl.workers import roles

        return {"colocated": roles.ColocatedWorker, "generator": roles.GeneratorWorker,
                "trainer": roles.TrainerWorker}[role]

    def worker_args(self, role: str) -> dict[str, Any]:
        threads = self.run.digenrl.torch_threads
        if role == "generator":
            return {"policy": self.run.policy, "reward": self.run.reward, "torch_threads": threads}
        return {"policy": self.run.policy, "train": self.run.train, "reward": self.run.reward,
                "torch_threads": threads}

    def build_workers(self) -> None:
        """One verl RayWorkerGroup per role on its own resource pool; then the shared process group."""
        import ray
        from verl.single_controller.ray.base import RayClassWithInitArgs, RayWorkerGroup

        from digenrl_verl.workers.pools import PoolManager, PoolSpec
        from digenrl_verl.workers.weight_sync import CollectiveSpec, free_port

        d = self.run.digenrl
        run_id = uuid.uuid4().hex[:6]  # placement-group names are global in a Ray cluster
        specs = {f"{r}_pool": PoolSpec(f"{r}_pool_{run_id}_", (d.pools[r].workers_per_node,) * d.pools[r].nnodes,
                                       use_gpu=d.pools[r].use_gpu, accelerator_type=d.pools[r].accelerator_type,
                                       custom_resource=d.pools[r].custom_resource) for r in d.roles}
        self.pool_manager = manager = PoolManager(specs, {("trainer" if r == "colocated" else r): f"{r}_pool" for r in d.roles})
        for role in d.roles:
            cls = RayClassWithInitArgs(cls=ray.remote(self.worker_class(role)), **self.worker_args(role))
            wg = RayWorkerGroup(resource_pool=manager.pool_for("trainer" if role == "colocated" else role),
                                ray_cls_with_init=cls, name_prefix=f"digenrl_{role}_{run_id}", device_name="cpu")
            self.worker_groups[role] = wg
            for i, actor in enumerate(wg.workers):
                self.workers[f"{ROLE_POOL[role]}:{i}"] = actor
        trainers = self.worker_groups.get("trainer") or self.worker_groups["colocated"]
        gens = self.worker_groups.get("generator")
        spec = CollectiveSpec("127.0.0.1", free_port(), trainers.world_size, gens.world_size if gens else 0)
        refs = [w.join.remote(spec) for w in trainers.workers] + ([w.join.remote(spec) for w in gens.workers]
                                                                  if gens else [])
        ray.get(refs)

    # ---------------------------------------------------------------------------------- schedule
    def make_executor(self):
        from digenrl_verl.trainer.ray_executor import RayExecutor

        return RayExecutor(self.workers, self.step_batch, self.run.advantage,
                           self.run.policy.rollout.num_train_steps, on_result=self.on_result)

    def make_driver(self, executor):
        from digenrl_verl.schedule.driver import Driver

        return Driver(self.run.schedule, executor)

    def on_result(self, task: Task, values: list) -> None:
        m = self.metrics[task.step]
        if task.kind == TaskKind.SCORE:
            for v in values:
                m.rewards.update({int(s): float(r) for s, r in zip(v["sample_ids"], v["scores"])})
        elif task.kind == TaskKind.UPDATE:
            for v in values:
                for k, x in v.items():
                    if k == "ratio_min":
                        m.ratio_min = min(m.ratio_min, x)
                    elif k == "ratio_max":
                        m.ratio_max = max(m.ratio_max, x)
                    else:
                        m.loss[k] += x
        elif task.kind == TaskKind.OPT_STEP:
            m.opt = dict(values[0])

    def step_log(self, result) -> dict[str, float]:
        m = self.metrics.pop(result.step)
        r = np.array(list(m.rewards.values()), dtype=np.float64)
        rows = max(m.loss.get("rows", 0.0), 1.0)
        samples = self.run.prompts_per_step * self.run.n
        out = {
            "reward/mean": float(r.mean()) if r.size else float("nan"),
            "reward/std": float(r.std()) if r.size else float("nan"),
            "actor/pg_loss": m.loss.get("pg_sum", 0.0) / rows,
            "actor/kl_loss": m.loss.get("kl_sum", 0.0) / rows,
            "actor/pg_clipfrac": m.loss.get("clipped", 0.0) / rows,
            "actor/approx_kl": 0.5 * m.loss.get("sq_log_ratio_sum", 0.0) / rows,
            "actor/ratio_mean": m.loss.get("ratio_sum", 0.0) / rows,
            "actor/ratio_min": m.ratio_min, "actor/ratio_max": m.ratio_max,
            "actor/grad_norm": m.opt.get("grad_norm", float("nan")),
            "actor/skipped_step": m.opt.get("skipped", 0.0),
            "timing/step_s": result.end - result.start,
            "schedule/microbatches": result.microbatches, "schedule/tag_microbatches": result.tag_microbatches,
            "schedule/stale_samples": result.stale_samples, "schedule/stale_fraction": result.stale_samples / samples,
            "policy/version": result.version,
        }
        return out

    # ------------------------------------------------------------------------------------- train
    def train(self) -> None:
        from digenrl_verl.trainer.reporting import RunReporter

        self.reporter = RunReporter(self.output_dir, self.cfg.trainer.project_name, self.cfg.trainer.experiment_name,
                                    loggers=list(self.cfg.trainer.logger), total_steps=self.run.num_steps)
        self.t_start = self.executor.now()
        for result in self.driver.iter_steps():
            self.results.append(result)
            self.reporter.log_step(result.step, self.step_log(result))
        self.t_end = self.executor.now()

    def finish(self) -> dict[str, Any]:
        """Trace, timeline, summary table; returns the summary."""
        import ray

        trace = self.driver.trace
        trace.write_chrome(str(self.output_dir / "trace.json"))
        (self.output_dir / "schedule.txt").write_text(trace.to_text())
        metrics = trace.metrics(workers=list(self.workers))
        from digenrl_verl.sim.gantt import save_gantt

        save_gantt(trace, str(self.output_dir / "timeline.png"), title=f"{self.run.schedule.mode} run")
        stats = dict(zip(self.workers, ray.get([w.checksum.remote() for w in self.workers.values()])))
        wall = self.t_end - self.t_start
        samples = self.run.num_steps * self.run.prompts_per_step * self.run.n
        rewards = [h["reward/mean"] for h in self.reporter.history]
        summary = {
            "mode": self.run.schedule.mode, "steps": self.run.num_steps, "samples": samples, "wall_s": wall,
            "samples_per_s": samples / wall if wall > 0 else float("nan"),
            "utilisation": metrics.utilisation, "bubble_fraction": metrics.bubble_fraction,
            "reward_first": rewards[0] if rewards else float("nan"),
            "reward_last": rewards[-1] if rewards else float("nan"),
            "output_dir": str(self.output_dir),
        }
        workers = [{"worker": w, "busy_s": metrics.per_worker[w].busy if w in metrics.per_worker else 0.0,
                    "bubble_%": 100.0 * (metrics.per_worker[w].idle / max(metrics.makespan, 1e-9))
                    if w in metrics.per_worker else 100.0,
                    "peak_rss_mb": stats[w]["rss_mb"], "version": stats[w]["version"]} for w in self.workers]
        self.summary_text = self.reporter.close(summary, workers)
        self.summary = summary
        (self.output_dir / "summary.json").write_text(json.dumps({"summary": summary, "workers": workers}, indent=1))
        return summary

    def fit(self) -> dict[str, Any]:
        self.start_ray()
        self.build_workers()
        self.executor = self.make_executor()
        self.driver = self.make_driver(self.executor)
        self.train()
        return self.finish()

    def shutdown(self) -> None:
        import ray

        for wg in self.worker_groups.values():
            for w in wg.workers:
                ray.kill(w)
        self.worker_groups.clear()
        self.workers.clear()
        manager = getattr(self, "pool_manager", None)
        if manager is not None:
            manager.release()
