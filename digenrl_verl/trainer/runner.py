"""A training run as a set of overridable steps (torchtitan style), shared by every mode.

    validate (build_run) → start_ray → build_workers → make_executor → make_driver → train → finish

At every step boundary of a disaggregated run (`at_step_end`), the generator pool may change size: from
`resize_generators(n)` or the control file ``<output_dir>/pools.json`` (``{"generator": n}``); dead generators
are replaced while the run goes on (`trainer.elastic`, docs/elastic.md).

Colocated and disaggregated runs differ only in the worker roles built (`build_workers`) and in the
schedule the driver follows; the loop itself is the scheduling engine's driver (`schedule.driver`), which
the Ray executor interprets. Nothing here decides what runs when: periodic checkpoints too are tasks of the
schedule (CHECKPOINT at `trainer.save_freq` barriers), which the executor runs through `on_checkpoint`; so are
validation runs (verl-omni's `trainer.test_freq`: the same barrier, `validate`).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.exceptions import RayActorError
from ray.util.placement_group import remove_placement_group
from verl.single_controller.ray.base import RayClassWithInitArgs
from verl.trainer.ppo.metric_utils import process_validation_metrics

from digenrl_verl.diffusion.loss import LossStats
from digenrl_verl.diffusion.rollout import RolloutConfig
from digenrl_verl.engines.base import VERL_OMNI_REPLICA
from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.platform import process_env, select_cpu_platform
from digenrl_verl.schedule.cost import CostProfiler
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.trace import Decision, Trace
from digenrl_verl.schedule.types import Task, TaskKind, worker_pool, worker_rank
from digenrl_verl.trainer.checkpoint import CheckpointWriter, checkpoint_dir, read_meta
from digenrl_verl.trainer.config import SCHEDULE_POOL_NAMES, RunSpec
from digenrl_verl.trainer.data import LOADER_STATE_FILE, PromptStream, load_prompts, make_step_batch, verl_loader_state
from digenrl_verl.trainer.elastic import ElasticRayExecutor, GeneratorSupervisor
from digenrl_verl.trainer.ray_executor import RayExecutor
from digenrl_verl.trainer.ray_runtime import LOCAL_NODE_IP, init_local_ray
from digenrl_verl.trainer.reporting import RunReporter, data_metrics, perf_metrics, staleness_metrics
from digenrl_verl.viz.gantt import save_gantt
from digenrl_verl.weights.sync import CollectiveSpec, free_port
from digenrl_verl.workers import roles
from digenrl_verl.workers.training import TRAINING_ENGINES
from digenrl_verl.workers.judge import JudgePool
from digenrl_verl.workers.pools import (
    BUNDLE_VAR, PoolManager, PoolSpec, check_placeable, make_ray_pool, make_worker_group)

POOL_ROLE = {pool: role for role, pool in SCHEDULE_POOL_NAMES.items()}  # schedule pool name -> role


@dataclass
class StepMetrics:
    """Per-step accumulators fed by completed tasks."""

    rewards: dict[int, float] = field(default_factory=dict)
    loss: LossStats = field(default_factory=LossStats)
    opts: list[dict[str, float]] = field(default_factory=list)  # one per optimizer step (mini-batch) of the step


INTERRUPT_SAVE_TIMEOUT_S = 120.0
POOLS_FILE = "pools.json"
"""The control file of a running job, in its output directory: ``{"generator": <count>}``, read at step ends."""


def _is_generator_count(value: Any) -> bool:
    """A generator count a running job can be resized to: an integer >= 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with NaN/inf rewards or gradients."""


def validation_metrics(sources: list[str], uids: list[str], rewards: list[float], n: int) -> dict[str, float]:
    """verl-omni's validation metrics (`_val_metrics_update`) of `n` samples per prompt (uid), under names that do
    not depend on how many rewards came out finite: verl's `process_validation_metrics` of the prompts whose `n`
    rewards are all finite (mean, best and majority figures at n under `val-core/<data_source>/reward/`, the others
    (std@n, worst@k, smaller k) under `val-aux/`); `val-core/<data_source>/reward/mean@n` is the mean of the source's
    finite rewards (verl-omni's mean@n when all are finite; NaN when none is), and `val-aux/reward/nonfinite_samples`
    counts the NaN/inf rewards. A prompt with a non-finite reward thus counts in mean@n with its finite samples and
    is left out of std@n, best@k and worst@k (verl would file it under @(n - 1), a different series)."""
    finite = np.isfinite(np.asarray(rewards, dtype=np.float64))
    broken = {u for u, ok in zip(uids, finite) if not ok}
    whole = [i for i, u in enumerate(uids) if u not in broken]
    out: dict[str, float] = {}
    stats = process_validation_metrics([sources[i] for i in whole], [uids[i] for i in whole],
                                       {"reward": [rewards[i] for i in whole]})
    for source, variables in stats.items():
        for name, value in variables["reward"].items():
            core = name.startswith(("mean", "maj", "best")) and _at(name) == n
            out[f"{'val-core' if core else 'val-aux'}/{source}/reward/{name}"] = float(value)
    for source in sorted(set(sources)):
        kept = [r for r, s, ok in zip(rewards, sources, finite) if ok and s == source]
        out[f"val-core/{source}/reward/mean@{n}"] = float(np.mean(kept)) if kept else float("nan")
    out["val-aux/reward/nonfinite_samples"] = float(len(rewards) - int(finite.sum()))
    return out


def _at(metric: str) -> int:
    """The sample count of a validation metric name (`best@4/mean` -> 4)."""
    return int(metric.split("@")[-1].split("/")[0])


def replica_devices(run: RunSpec) -> int:
    """Ray's logical GPUs the generators of a CPU run hold for verl-omni's replicas on their bundles
    (`trainer.digenrl.generator_replicas`: rollout engine ``verl_omni_replica``, one replica of TP 1 per generator
    rank, `hosts_replicas`); 0 for every other run."""
    role = run.digenrl.generator_role
    return run.digenrl.pools[role].size if hosts_replicas(run, role) and run.policy.device == "cpu" else 0


def hosts_replicas(run: RunSpec, role: str) -> bool:
    """Whether `role`'s ranks each start one of verl-omni's rollout replicas (rollout engine ``verl_omni_replica``,
    one replica of TP 1 per generator rank), on their own bundle (`PoolSpec.hosts_replica`)."""
    return run.policy.engine.name == VERL_OMNI_REPLICA.name and role == run.digenrl.generator_role


def pool_spec(run: RunSpec, role: str, name: str, nodes: tuple[int, ...] | None = None) -> PoolSpec:
    """The Ray resource pool of `role` (`trainer.digenrl.pools.<role>`), named `name`; `nodes`: workers per node
    (default the pool's shape; a grown generator rank's own pool: (1,))."""
    cfg = run.digenrl.pools[role]
    return PoolSpec(name, nodes or (cfg.workers_per_node,) * cfg.nnodes, use_gpu=cfg.use_gpu,
                    accelerator_type=cfg.accelerator_type, custom_resource=cfg.custom_resource,
                    gpu_fraction=cfg.gpu_fraction, hosts_replica=hosts_replicas(run, role))


def local_ray_resources(run: RunSpec) -> tuple[int, int | None]:
    """(num_cpus, num_gpus) of the run's own local Ray instance: the CPUs of the pools' bundles and one per replica
    of a judge on its own pool (colocated replicas reserve none), at least 2; with verl-omni's replicas as the
    generators on a CPU host (`replica_devices`), the generator bundles' logical GPUs and one CPU more, which each
    replica's server takes while Ray places it (it holds none once placed). num_gpus None: Ray counts the host's
    GPUs."""
    d = run.digenrl
    cpus = sum(pool_spec(run, r, r).bundle()["CPU"] * d.pools[r].size for r in d.roles)
    judge = run.reward.reward_model
    if judge is not None and judge.pool is not None and not judge.pool.colocated:
        cpus += judge.pool.replicas
    devices = replica_devices(run)
    if not devices:
        return max(int(cpus), 2), None
    return max(int(cpus), 2) + 1, devices


def worker_env(run: RunSpec, role: str) -> dict[str, str]:
    """Environment of a pool's worker processes: verl's platform for their device (`process_env`); the generators
    of `replica_devices` also in Ray's logical-GPU mode (`platform.cpu.LOGICAL_GPUS_VAR`), which the replica actors
    they start inherit (Ray merges a parent's ``env_vars`` into its children's): verl's CPU platform then names
    ``GPU`` as the replicas' Ray resource."""
    env = process_env(cpu=not run.digenrl.pools[role].use_gpu)
    if role == run.digenrl.generator_role and replica_devices(run):
        from digenrl_verl.platform.cpu import LOGICAL_GPUS_VAR  # registers verl's CPU platform: CPU runs only

        env[LOGICAL_GPUS_VAR] = "1"
    return env


class DigenRLTrainer:
    """One run of `python -m digenrl_verl.main`. Subclass and override a step to change one behaviour."""

    def __init__(self, run: RunSpec) -> None:
        self.run = run
        self.output_dir = run.output_dir
        self.output_dir.mkdir(parents=True, exist_ok=True)
        prompts, sources, extras = load_prompts(run.data.train_files, run.data.prompt_key, with_extras=True,
                                                source_key=run.data.source_key)
        self._prompts, self._sources, self._extras = prompts, sources, extras
        self._val: tuple[list, list, list] = ([], [], [])  # validation prompts, data sources, extras
        if run.validation.enabled:
            val = load_prompts(run.data.val_files, run.data.prompt_key, with_extras=True, key="data.val_files",
                               source_key=run.data.source_key) if run.data.val_files is not None \
                else (prompts, sources, extras)
            k = len(val[0]) if run.data.val_max_samples < 0 else run.data.val_max_samples
            self._val = (val[0][:k], val[1][:k], val[2][:k])
        self.validations: dict[int, dict[str, float]] = {}  # policy version -> its validation metrics
        self._batches: dict[int, Any] = {}
        self.metrics: dict[int, StepMetrics] = defaultdict(StepMetrics)
        self.worker_groups: dict[str, Any] = {}
        self.workers: dict[str, Any] = {}
        self.results: list = []
        self.driver = None
        self.executor = None
        self.last_checkpoint: Path | None = None
        self.interrupted = False
        self.pool_manager: PoolManager | None = None
        self.reporter: RunReporter | None = None
        self.t_start = self.t_end = 0.0
        self.nonfinite_run = 0  # consecutive steps with NaN/inf rewards or gradients
        self.cost_profile: dict[str, Any] = {}  # restored cost estimates (resume)
        self.summary: dict[str, Any] = {}
        self.summary_text = ""
        self.marks: dict[str, float] = {}  # wall-clock (time.time) start-up marks of the driver
        self.worker_startup: dict[str, dict[str, float]] = {}  # worker id -> its start-up marks
        self.startup: dict[str, Any] = {}  # start-up phases in seconds (`startup_phases`)
        self.run_id = ""  # names this run's placement groups and actors (they are global in a Ray cluster)
        self.collective_spec: CollectiveSpec | None = None
        self.supervisor: GeneratorSupervisor | None = None  # disaggregated runs: the elastic generator pool
        self.own_pools: dict[int, Any] = {}  # generator rank beyond the pool's -> its own placement (grown)
        self.generator_target: int | None = None  # asked generator count not applied yet (`resize_generators`)
        self._pools_file_seen: float | None = None  # mtime of the control file last read
        self.judge_pool: JudgePool | None = None  # the judge's replicas: its own pool, or colocated

    def mark(self, name: str) -> None:
        """Record a wall-clock start-up mark (kept: the first one of a name)."""
        self.marks.setdefault(name, time.time())

    # ------------------------------------------------------------------------------------- data
    def step_batch(self, step: int):
        """The step's DataProto (deterministic in the step: prompts from cursor step × batch size)."""
        if step not in self._batches:
            n_prompts = self.run.prompts_per_step
            stream = PromptStream(self._prompts, self._sources, n_prompts, seed=self.run.data.seed,
                                  shuffle=self.run.data.shuffle, cursor=step * n_prompts)
            picked = stream.next_indices()
            self._batches[step] = make_step_batch(
                [self._prompts[j] for _, j in picked], [self._sources[j] for _, j in picked], [c for c, _ in picked],
                self.run.n, step, extras=[self._extras[j] for _, j in picked])
        return self._batches[step]

    # ----------------------------------------------------------------------------------- workers
    def start_ray(self) -> None:
        if not ray.is_initialized():
            num_cpus, num_gpus = local_ray_resources(self.run)
            init_local_ray(num_cpus=num_cpus, num_gpus=num_gpus, torch_threads=self.run.digenrl.torch_threads,
                           cpu_only=self.cpu_only())
        if self.cpu_only():  # this driver's verl asks its platform for the pools' placement groups
            select_cpu_platform()

    def cpu_only(self) -> bool:
        """Every worker process of the run is a CPU one (no pool, the judge's included, uses a GPU): verl's CPU
        platform in the driver and the workers (`digenrl_verl.platform`)."""
        judge = self.run.reward.reward_model
        judge_gpu = judge is not None and judge.pool is not None and judge.pool.use_gpu
        return not judge_gpu and not any(self.run.digenrl.pools[r].use_gpu for r in self.run.digenrl.roles)

    def rendezvous(self) -> tuple[str, str] | None:
        """(master_addr, master_port) for a worker group, or None to let verl find them (a Ray task on the group's
        first bundle: one more worker process and round trip per pool at start-up). On a one-node cluster on this
        machine's loopback (every CPU run here) the driver picks a free loopback port itself."""
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) != 1 or nodes[0].get("NodeManagerAddress") != LOCAL_NODE_IP:
            return None
        return LOCAL_NODE_IP, str(free_port(LOCAL_NODE_IP))

    def worker_class(self, role: str):
        """The verl Worker class of a pool (one generator worker serves every `actor_rollout_ref.rollout.name`); the
        trainer ranks' from the training engine `trainer.digenrl.trainer_engine` resolved to (`workers.training`)."""
        if role == "generator":
            return roles.GeneratorWorker
        return TRAINING_ENGINES.worker_class(self.run.train.engine, role)

    def worker_args(self, role: str) -> dict[str, Any]:
        threads = self.run.digenrl.torch_threads
        judges = self.judge_pool.handles() if self.judge_pool is not None else None  # the judge's replicas, if any
        if role == "generator":
            return {"policy": self.run.policy, "reward": self.run.reward, "torch_threads": threads, "judges": judges}
        return {"policy": self.run.policy, "train": self.run.train, "reward": self.run.reward,
                "torch_threads": threads, "judges": judges}

    def build_workers(self) -> None:
        """One verl RayWorkerGroup per role on its own resource pool; then the shared process group."""
        d = self.run.digenrl
        self.run_id = run_id = uuid.uuid4().hex[:6]  # placement-group names are global in a Ray cluster
        specs = {f"{r}_pool": pool_spec(self.run, r, f"{r}_pool_{run_id}_") for r in d.roles}
        names = {("trainer" if r == "colocated" else r): f"{r}_pool" for r in d.roles}
        self.pool_manager = manager = PoolManager(specs, names)
        self.start_judge_pool(tuple(specs.values()))
        for role in d.roles:
            cls = RayClassWithInitArgs(cls=ray.remote(self.worker_class(role)), **self.worker_args(role))
            wg = make_worker_group(manager.pool_for("trainer" if role == "colocated" else role, role), cls,
                                   name_prefix=f"digenrl_{role}_{run_id}",
                                   device_name="cuda" if d.pools[role].use_gpu else "cpu", rendezvous=self.rendezvous(),
                                   worker_env=worker_env(self.run, role))
            self.worker_groups[role] = wg
            self.mark(f"submitted_{role}")
            for i, actor in enumerate(wg.workers):
                self.workers[f"{SCHEDULE_POOL_NAMES[role]}:{i}"] = actor
        self.mark("workers_submitted")
        trainers = self.worker_groups.get("trainer") or self.worker_groups["colocated"]
        gens = self.worker_groups.get("generator")
        # NCCL needs one device per rank: pools that share GPUs (gpu_fraction < 1) sync over gloo
        shared = any(d.pools[r].shares_a_device for r in d.roles)
        backend = "nccl" if self.run.policy.device == "cuda" and not shared else "gloo"
        # rendezvous on trainer rank 0's node, at the free port verl picked there for this worker group (the
        # workers never start verl's own process group, so the port is ours)
        spec = CollectiveSpec(str(trainers.master_address), int(trainers.master_port), trainers.world_size,
                              gens.world_size if gens else 0, backend=backend)
        self.collective_spec = spec
        refs = [w.join.remote(spec) for w in trainers.workers] + ([w.join.remote(spec) for w in gens.workers]
                                                                  if gens else [])
        # the start-up marks come back with the join (actor calls run in order: after the join), one round trip
        timing_refs = {w: a.startup_timings.remote() for w, a in self.workers.items()}
        ray.get(refs)
        self.start_colocated_judge()  # after the join: the workers' models and process groups hold their memory
        if self.judge_pool is not None:
            self.judge_pool.wait_ready()
        self.mark("joined")
        self.worker_startup = dict(zip(timing_refs, ray.get(list(timing_refs.values()))))

    def start_judge_pool(self, worker_pools: tuple[PoolSpec, ...] = ()) -> None:
        """The judge's replicas, when it has any. `reward.reward_model.enable_resource_pool=True`: place the judge's
        own pool and start its replicas before the scoring workers, which get their handles (`worker_args`);
        `worker_pools`, placed next, are counted in its fail-fast check (an error then names the reward pool's keys).
        Colocated replicas start after the workers (`start_colocated_judge`); the workers get their names."""
        judge = self.run.reward.reward_model
        if judge is not None and judge.pool is not None:
            self.judge_pool = JudgePool(judge, f"reward_pool_{self.run_id}_", self.run.digenrl.torch_threads)
            if not judge.pool.colocated:
                self.judge_pool.start(worker_pools)

    def start_colocated_judge(self) -> None:
        """Colocated judge replicas: on the nodes and GPUs the workers report (`placement`), started once the workers
        have joined (their models and process groups hold their memory, which vLLM's start-up check then sees; what
        they take later, such as optimizer state, it does not); on CPU each worker stands for one device."""
        if self.judge_pool is None or not self.judge_pool.cfg.pool.colocated:
            return
        names = list(self.workers)
        found = ray.get([self.workers[name].placement.remote() for name in names])
        use_gpu = self.judge_pool.cfg.pool.use_gpu
        self.judge_pool.start_colocated([(node, gpus if use_gpu else [name])
                                         for name, (node, gpus) in zip(names, found)])

    # ---------------------------------------------------------------------------------- schedule
    def make_executor(self):
        """The Ray executor; disaggregated: the elastic one (replacements for dead generators, resizes)."""
        args = (self.step_batch, self.run.advantage, self.run.policy.rollout.num_train_steps)
        kwargs = {"on_result": self.on_result, "on_checkpoint": self.on_checkpoint,
                  "mini_batches_per_step": self.run.schedule.mini_batches_per_step}
        if "generator" not in self.worker_groups:
            return RayExecutor(self.workers, *args, **kwargs)
        self.supervisor = GeneratorSupervisor(self.workers, self.start_generator, self.workers["trn:0"],
                                              self.collective_spec, self.run.digenrl.pools.generator.max_restarts,
                                              self.stop_generator)
        return ElasticRayExecutor(self.workers, *args, supervisor=self.supervisor, **kwargs)

    # ------------------------------------------------------------------------- elastic generator pool
    def start_generator(self, rank: int):
        """A new generator actor of `rank` (the supervisor has it join): in the pool's placement-group bundle of
        that rank (free again once its actor died or left), or, past the pool's size, in a placement group of its
        own (one bundle of the pool's shape)."""
        pool_cfg = self.run.digenrl.pools.generator
        wg = self.worker_groups["generator"]
        device = "cuda" if pool_cfg.use_gpu else "cpu"
        spec = pool_spec(self.run, "generator", f"generator_pool_{self.run_id}_r{rank}_", nodes=(1,))
        if rank < pool_cfg.size:
            pg, bundle = self.pool_manager.pool_for("generator").pgs[rank // pool_cfg.workers_per_node], \
                rank % pool_cfg.workers_per_node
        else:
            if rank not in self.own_pools:
                check_placeable(spec, "generator")
                self.own_pools[rank] = make_ray_pool(spec)
            pg, bundle = self.own_pools[rank].get_placement_groups(device_name=device)[0], 0
        cls = RayClassWithInitArgs(cls=ray.remote(self.worker_class("generator")), **self.worker_args("generator"))
        env = {"WORLD_SIZE": str(max(wg.world_size, rank + 1)), "RANK": str(rank), "WG_BACKEND": "ray",
               "WG_PREFIX": f"digenrl_generator_{self.run_id}", "RAY_LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": str(wg.master_address), "MASTER_PORT": str(wg.master_port), BUNDLE_VAR: str(bundle),
               **worker_env(self.run, "generator")}
        cls.update_options({"runtime_env": {"env_vars": env},
                            "name": f"digenrl_generator_{self.run_id}_r{rank}_{uuid.uuid4().hex[:4]}"})
        return cls(placement_group=pg, placement_group_bundle_idx=bundle, use_gpu=pool_cfg.use_gpu,
                   num_gpus=spec.worker_gpus, device_name=device)

    def stop_generator(self, rank: int, actor) -> None:
        """Stop a generator actor; a grown rank's own placement group goes back to the cluster."""
        ray.kill(actor, no_restart=True)
        self.release_own_pools([rank])

    def release_own_pools(self, ranks=None) -> None:
        """Remove the placement groups of grown ranks (`ranks`; None: all)."""
        for rank in list(self.own_pools) if ranks is None else ranks:
            pool = self.own_pools.pop(rank, None)
            for pg in (pool.pgs or []) if pool is not None else []:
                remove_placement_group(pg)

    def resize_generators(self, count: int) -> None:
        """Ask for `count` generators (>= 1); applied at the next step end (`at_step_end`)."""
        if not _is_generator_count(count):
            raise ValueError(f"resize_generators({count!r}): use an integer >= 1 (generators of the running job)")
        if self.supervisor is None and self.executor is not None:
            raise ValueError("resize_generators: only a disaggregated run has a generator pool to resize")
        self.generator_target = count

    def read_pools_file(self) -> int | None:
        """The generator count the control file ``<output_dir>/pools.json`` asks for, when it changed since the last
        read (None otherwise); a malformed file is reported (warning) and ignored."""
        path = self.output_dir / POOLS_FILE
        if not path.is_file() or path.stat().st_mtime == self._pools_file_seen:
            return None
        self._pools_file_seen = path.stat().st_mtime
        try:
            count = json.loads(path.read_text())["generator"]
            if not _is_generator_count(count):
                raise ValueError(f"generator={count!r} is not an integer >= 1")
        except (ValueError, KeyError, TypeError) as e:
            print(f"digenrl: ignoring {path}: {type(e).__name__}: {e}; write {{\"generator\": <count >= 1>}}",
                  file=sys.stderr)
            return None
        return int(count)

    def at_step_end(self, result) -> None:
        """A step boundary: stop generators the driver removed, then apply an asked resize (API or control file)."""
        if self.supervisor is None or self.driver is None:
            return
        self.supervisor.release(self.driver.removed)
        asked = self.read_pools_file()
        target = asked if asked is not None else self.generator_target
        self.generator_target = None
        if target is None:
            return
        members = self.driver.live_generators + self.driver.joining
        try:
            events = self.supervisor.resize(target, members)
        except ValueError as e:  # no room in the cluster for a grown rank: the run goes on with what it has
            print(f"digenrl: cannot grow the generator pool to {target}: {e}", file=sys.stderr)
            return
        for event in events:
            self.driver.post(event)
        self.driver.trace.decide(Decision(self.executor.now(), "resize", result.step, None, None,
                                          f"generators {len(members)} -> {target} at the end of step {result.step}"))

    def make_driver(self, executor):
        """The driver of the whole run (its schedule has a checkpoint barrier every `trainer.save_freq` steps,
        `ScheduleConfig.checkpoint_every`); a resumed run starts with the cost profile its checkpoint saved."""
        profiler = CostProfiler()
        for key, unit in self.cost_profile.items():  # resumed: warm estimates
            kind, _, cls = key.partition("@")
            profiler.seed(TaskKind(kind), cls, float(unit))
        return Driver(self.run.schedule, executor, profiler=profiler, trace=Trace())

    def on_checkpoint(self, task: Task) -> dict[str, Any]:
        """The executor's CHECKPOINT, at a drained barrier (nothing of the next step in flight, every worker holds
        `task.version` = the step the barrier closed + 1): save the trainer state at `trainer.save_freq` steps (and
        the last step, as verl), bounded by the task timeout like any other task; validate at `trainer.test_freq`
        steps (and the last step)."""
        cfg, out = self.run.schedule, {}
        if cfg.is_save_step(task.step) or (cfg.checkpoint_every > 0 and task.step == cfg.end_step - 1):
            out["path"] = str(self.save_checkpoint(task.version, timeout_s=cfg.task_timeout_s))
        if cfg.is_validate_step(task.step):
            out.update(self.validate(task.version))
        return out

    def on_result(self, task: Task, values: list) -> None:
        m = self.metrics[task.step]
        if task.kind == TaskKind.SCORE:
            for v in values:
                m.rewards.update({int(s): float(r) for s, r in zip(v["sample_ids"], v["scores"])})
        elif task.kind == TaskKind.UPDATE:
            for v in values:
                m.loss = m.loss + LossStats(**v)
        elif task.kind == TaskKind.OPT_STEP:
            m.opts.append(dict(values[0]))

    def step_log(self, result) -> dict[str, float]:
        """The step's metrics, under the names of `metric_names.METRICS` (verl-omni's where it logs the quantity)."""
        m = self.metrics.pop(result.step)
        samples = self.run.prompts_per_step * self.run.n
        uids = self.step_batch(result.step).non_tensor_batch["uid"]
        opts = m.opts
        out = {
            **data_metrics(m.rewards, uids, self.run.advantage),
            **m.loss.metrics(),
            # verl-omni: the mean over the step's mini-batches of each one's loss (ours sums them: one per OPT_STEP)
            M["loss"]: m.loss.loss_sum / max(len(opts), 1),
            # several mini-batches: the mean of their norms (verl's mean over mini-batches), the skipped ones counted
            M["grad_norm"]: float(np.mean([o["grad_norm"] for o in opts])) if opts else float("nan"),
            M["skipped_step"]: float(sum(o.get("skipped", 0.0) for o in opts)),
            M["lr"]: float(opts[-1]["lr"]) if opts else float("nan"),  # the step's rate (verl's schedule)
            **({M["kl_coef"]: self.run.train.loss.kl_coef} if self.run.train.loss.kl_coef > 0 else {}),
            **perf_metrics(result.step, samples, result.end - result.start, self.devices()),
            **staleness_metrics(result.gen_versions, result.version),
            M["microbatches"]: result.microbatches, M["tag_microbatches"]: result.tag_microbatches,
            M["stale_samples"]: result.stale_samples, M["stale_fraction"]: result.stale_samples / samples,
            M["policy_version"]: result.version,
            M["workers_dead"]: len(self.driver.dead) if self.driver is not None else 0,
            M["workers_generators"]: len(self.driver.live_generators) if self.driver is not None else 0,
            M["generators_used"]: len(result.gen_tasks),
        }
        return out

    def devices(self) -> int:
        """verl-omni's `n_gpus` of `perf/throughput` (every resource pool's devices): one per live worker process
        (trainers, colocated workers, live generators) plus the judge's own reward pool."""
        live = set(self.driver.live_generators) if self.driver is not None else set()
        n = sum(1 for w in self.workers if worker_pool(w) != "gen" or w in live or self.driver is None)
        pool = self.judge_pool.cfg.pool if self.judge_pool is not None else None
        return n + (pool.nnodes * pool.per_node if pool is not None and not pool.colocated else 0)

    # ------------------------------------------------------------------------------------- train
    def train(self) -> None:
        """The driver runs the whole run in one piece. Checkpoints: the schedule drains and saves at every step s
        with (s + 1) % save_freq == 0 (CHECKPOINT tasks, see `on_checkpoint`), so the state saved has no
        micro-batch of a later step generated or queued (the TCSS queue is empty); like verl, the last step is
        saved too (after the run, when it is not a barrier step itself)."""
        self.reporter = RunReporter(self.output_dir, self.run.logging.project_name, self.run.logging.experiment_name,
                                    loggers=list(self.run.logging.loggers), total_steps=self.run.num_steps)
        self.t_start = self.executor.now()
        self.nonfinite_run = 0
        self.driver = self.make_driver(self.executor)
        if self.run.validation.before_train:
            self.validate(self.run.start_step)
        self.mark("train_start")
        for result in self.driver.iter_steps():
            self.results.append(result)
            self.mark("first_step")
            log = self.step_log(result)
            self.reporter.log_step(result.step, log)
            self._batches.pop(result.step, None)  # finished: no task reads it again
            self.check_finite(result.step, log)
            self.at_step_end(result)
        last = self.driver.config.end_step - 1
        if self.driver.config.checkpoint_every > 0 and not self.driver.config.is_checkpoint_step(last):
            self.save_checkpoint(last + 1)
        self.t_end = self.executor.now()

    def check_finite(self, step: int, log: dict[str, float]) -> None:
        """Count consecutive steps with non-finite rewards or a skipped (non-finite) update; stop on a run."""
        bad = log.get(M["reward_nonfinite"], 0) > 0 or log.get(M["skipped_step"], 0) > 0
        self.nonfinite_run = self.nonfinite_run + 1 if bad else 0
        limit = self.run.digenrl.max_nonfinite_steps
        if self.nonfinite_run >= limit:
            raise NonFiniteError(
                f"{self.nonfinite_run} consecutive steps (up to step {step}) had NaN/inf rewards or gradients "
                f"(limit trainer.digenrl.max_nonfinite_steps={limit}); the weights stay finite (those samples were "
                "dropped and non-finite updates skipped), but the run is not learning: check the reward function "
                "and the learning rate")

    # ------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, step: int | None = None, timeout_s: float | None = None) -> Path:
        """Checkpoint the trainer state of `step`; None = the version the trainer holds now (interrupts).

        The trainer actor runs calls in order, so once it answers, every task the driver submitted before is
        done and its weights, optimizer and version are consistent. An interrupt right after a periodic save
        finds that checkpoint already complete and keeps it instead of writing it again."""
        root = self.run.checkpoint.root
        writer = CheckpointWriter(root, keep=self.run.checkpoint.max_to_keep)
        trainers = [a for w, a in self.workers.items() if w.startswith(("trn:", "col:"))]
        if step is None:
            step = int(ray.get(trainers[0].current_version.remote(), timeout=timeout_s))
            existing = checkpoint_dir(root, step)
            if (existing / "meta.json").is_file():
                self.last_checkpoint = existing
                return existing
        tmp = writer.begin(step)
        # every trainer rank is called (sharded ranks gather whole tensors together); rank 0 writes
        version = ray.get([a.save_checkpoint.remote(str(tmp)) for a in trainers], timeout=timeout_s)[0]
        if version != step:
            raise RuntimeError(f"checkpoint of step {step} found the trainer at version {version}")
        self._save_loader_state(tmp, version)
        meta = {
            "global_step": version, "policy_version": version,
            "data_cursor": version * self.run.prompts_per_step,
            "prompts_per_step": self.run.prompts_per_step, "n": self.run.n,
            "tcss": {"staleness": self.run.schedule.tcss.staleness, "queued_microbatches": []},
            "cost_profile": self.driver.profiler.snapshot() if self.driver is not None else {},
            "generators": len(self.generator_ids()),
            "architecture": self.run.architecture,
            # the seeds the run used (drawn at start for keys left null): a resume with null seeds takes these
            "seeds": {"data.seed": self.run.data.seed, "actor_rollout_ref.rollout.seed": self.run.policy.rollout.seed},
        }
        path = writer.commit(tmp, version, meta)
        self.last_checkpoint = path
        return path

    def _save_loader_state(self, folder: Path, step: int) -> None:
        """verl-omni's dataloader state after `step` steps into `folder` (verl's `data.pt`, `verl_loader_state`), where
        verl-omni's dataset read the prompts: verl-omni's own trainer then resumes this checkpoint at the next step's
        prompts. This run resumes from its step count (`step_batch`) and never reads it."""
        data = self.run.data
        state = verl_loader_state(self._prompts, self.run.prompts_per_step, data.seed, data.shuffle,
                                  data.loader_workers, step)
        if state is not None:
            torch.save(state, Path(folder) / LOADER_STATE_FILE)

    def load_checkpoint(self, path: Path) -> int:
        """Restore every worker from `path` (trainers: weights + optimizer + RNG; generators: weights)."""
        meta = read_meta(path)
        if meta.get("host_checkpoint"):
            return self._load_host_checkpoint(path, int(meta["policy_version"]))
        for key in ("prompts_per_step", "n"):
            want = getattr(self.run, key)
            if meta[key] != want:
                raise ValueError(f"checkpoint {path} was written with {key}={meta[key]}, this run uses {want}; "
                                 "resume with the same data.train_batch_size and rollout.n "
                                 "(or trainer.resume_mode=disable)")
        version = int(meta["policy_version"])
        refs = [a.load_checkpoint.remote(str(path), version) if w.startswith(("trn:", "col:"))
                else a.load_weights.remote(str(path), version) for w, a in self.workers.items()]
        ray.get(refs)
        self.cost_profile = dict(meta.get("cost_profile", {}))
        saved, now = meta.get("generators"), len(self.generator_ids())
        if saved is not None and saved != now:
            print(f"digenrl: resuming with {now} generator(s), the checkpoint was written with {saved}: the lanes are "
                  "re-planned; the cost estimates (per worker class and unit of work) are kept", file=sys.stderr)
        return version

    def _load_host_checkpoint(self, path: Path, version: int) -> int:
        """verl-omni's checkpoint (`trainer.checkpoint.is_host_checkpoint`): the trainers load its `actor/`, then
        trainer rank 0 sends the weights to every generator, as a SYNC does (a verl-omni checkpoint has no weights
        file the generators could read)."""
        trainers = {w: a for w, a in self.workers.items() if w.startswith(("trn:", "col:"))}
        ray.get([a.load_checkpoint.remote(str(path), version) for a in trainers.values()])
        self.sync_generators(version)
        print(f"digenrl: resumed verl-omni's checkpoint {path} (step {version}): the trainers loaded its actor/, "
              "the generators received the weights; the prompt order goes on from the step", file=sys.stderr)
        return version

    def sync_generators(self, version: int) -> None:
        """Trainer rank 0 sends the trainers' weights (of `version`) to every generator, as a SYNC does."""
        trainers = [a for w, a in self.workers.items() if w.startswith(("trn:", "col:"))]
        generators = {w: a for w, a in self.workers.items() if worker_pool(w) == "gen"}
        if generators:
            ranks = [worker_rank(w) for w in generators]
            ray.get([a.send_weights.remote(version, ranks) for a in trainers]
                    + [a.receive_weights.remote(version) for a in generators.values()])

    def generator_ids(self) -> list[str]:
        """The generators taking part now (the driver's live ones once it runs; else every generator worker)."""
        if self.driver is not None and self.supervisor is not None:
            return self.driver.live_generators
        return [w for w in self.workers if worker_pool(w) == "gen"]

    def ode_rewards(self, prompts: list[str], sources: list[str], extras: list[dict], *, n: int = 1,
                    sampling: RolloutConfig | None = None) -> torch.Tensor:
        """`n` samples of each of `prompts` with the weights the trainer holds, deterministic (ODE, per-sample
        seeded noise) unless `sampling` says otherwise (validation's `val_kwargs`), scored on the trainer group
        through the DIGENRL_ASSIGNED dispatch mode (rows dealt round-robin over the ranks); the rewards in row order
        (prompt i's j-th sample at i * n + j). No worker's global RNG is drawn from: training is not perturbed."""
        wg = self.worker_groups.get("trainer") or self.worker_groups["colocated"]
        rows = len(prompts) * n
        batch = make_step_batch(prompts, sources, list(range(len(prompts))), n=n, step=-1, extras=extras)
        if sampling is not None:
            batch.meta_info[roles.SAMPLING_KEY] = sampling
        assignment = [list(range(r, rows, wg.world_size)) for r in range(wg.world_size)]
        return wg.evaluate(batch, assignment).batch["eval_reward"]

    def evaluate(self, num_prompts: int) -> dict[str, float]:
        """Deterministic (ODE) samples of the first training prompts with the final weights, scored."""
        if num_prompts <= 0:
            return {}
        k = min(num_prompts, len(self._prompts))
        rewards = self.ode_rewards(self._prompts[:k], self._sources[:k], self._extras[:k])
        return {"eval/reward_ode": float(rewards[torch.isfinite(rewards)].mean()) if len(rewards) else float("nan")}

    def validate(self, step: int) -> dict[str, float]:
        """verl-omni's `_validate` at its global step `step` (= the policy version the workers hold: 0 before
        training, s + 1 after step s): `val_kwargs.n` samples of each validation prompt drawn as `val_kwargs` says
        (`RunSpec.validation`), scored; verl-omni's metrics (`validation_metrics`: mean@n and, for n > 1, std@n,
        best@k / worst@k per data source, named @n whatever the non-finite rewards) and
        `val-aux/reward/nonfinite_samples`, logged at `step`."""
        prompts, sources, extras = self._val
        n = self.run.validation.n
        rewards = self.ode_rewards(prompts, sources, extras, n=n, sampling=self.run.validation.rollout).tolist()
        rows = range(len(rewards))  # prompt i's j-th sample at i * n + j
        out = validation_metrics([sources[i // n] for i in rows], [f"p{i // n}" for i in rows], rewards, n)
        self.validations[step] = out
        self.reporter.log_metrics(step, out)
        return out

    def finish(self) -> dict[str, Any]:
        """Trace, timeline, summary table; returns the summary."""
        trace = self.driver.trace
        trace.write_chrome(str(self.output_dir / "trace.json"))
        (self.output_dir / "schedule.txt").write_text(trace.to_text())
        metrics = trace.metrics(workers=list(self.workers))
        save_gantt(trace, str(self.output_dir / "timeline.png"), title=f"{self.run.schedule.mode} run")
        stats = self.worker_stats()
        wall = self.t_end - self.t_start
        samples = self.run.num_steps * self.run.prompts_per_step * self.run.n
        rewards = [h[M["reward_mean"]] for h in self.reporter.history]
        final_eval = {} if self.interrupted else self.evaluate(int(self.run.digenrl.final_eval_prompts))
        self.startup = self.startup_phases()
        summary = {
            "mode": self.run.schedule.mode, "steps": self.run.num_steps, "samples": samples, "wall_s": wall,
            "samples_per_s": samples / wall if wall > 0 else float("nan"),
            "utilisation": metrics.utilisation, "bubble_fraction": metrics.bubble_fraction,
            "reward_first": rewards[0] if rewards else float("nan"),
            "reward_last": rewards[-1] if rewards else float("nan"),
            **LossStats.run_clip_metrics(self.reporter.history),
            **final_eval,
            **(self.validations[max(self.validations)] if self.validations else {}),
            **{f"startup/{k}": v for k, v in self.startup.items() if isinstance(v, float)},
            "output_dir": str(self.output_dir),
        }
        workers = [{"worker": w, "busy_s": metrics.per_worker[w].busy if w in metrics.per_worker else 0.0,
                    "bubble_%": 100.0 * (metrics.per_worker[w].idle / max(metrics.makespan, 1e-9))
                    if w in metrics.per_worker else 100.0,
                    "peak_rss_mb": stats[w]["rss_mb"], "version": stats[w]["version"]} for w in self.workers]
        self.summary_text = self.reporter.close(summary, workers)
        self.summary = summary
        (self.output_dir / "summary.json").write_text(json.dumps({"summary": summary, "workers": workers,
                                                                  "startup": self.startup}, indent=1))
        return summary

    def startup_phases(self) -> dict[str, Any]:
        """Where start-up went, in seconds, from the driver's marks and each worker's (`startup_timings`).

        Driver phases, in order: `driver_start_s` (process start -> fit(): Python, imports, config), `ray_init_s`,
        `pools_s` (placement groups, verl's master-port task, actor submission), `workers_ready_s` (submission ->
        every worker initialised and joined), `first_step_s` (train start -> first global step done);
        `time_to_first_step_s` = process start -> first step, `fit_to_first_step_s` = fit() -> first step.
        Worker phases, the max over workers (they run in parallel): `worker_spawn_s` (its pool's submission ->
        its process started; 0 when Ray reused a prestarted process), `worker_boot_imports_s` (the later of process
        start and submission -> this package's worker module imported:
        Ray's worker boot + torch/verl/diffusers imports), `worker_actor_init_wait_s` (imported -> __init__
        entered), `model_load_s` (policy or engine load), `worker_init_rest_s` (reward, optimizer spec, ...),
        `group_join_s` (process-group join, in the worker). `critical_worker` names the worker that finished
        its start-up last."""
        m = self.marks
        out: dict[str, Any] = {}

        proc = roles.process_start()  # this (driver) process: the command's start
        phases = {"driver_start_s": (proc, m.get("fit_start")), "ray_init_s": (m.get("fit_start"), m.get("ray_ready")),
                  "pools_s": (m.get("ray_ready"), m.get("workers_submitted")),
                  "workers_ready_s": (m.get("workers_submitted"), m.get("joined")),
                  "first_step_s": (m.get("train_start"), m.get("first_step")),
                  "time_to_first_step_s": (proc, m.get("first_step")),
                  "fit_to_first_step_s": (m.get("fit_start"), m.get("first_step"))}
        for k, (a, b) in phases.items():
            if a is not None and b is not None and a == a:
                out[k] = float(b - a)
        per: dict[str, dict[str, float]] = {}
        for w, t in self.worker_startup.items():
            role = POOL_ROLE[worker_pool(w)]
            sub = m.get(f"submitted_{role}", m.get("workers_submitted"))
            start = t.get("process_start")
            # Ray may hand the actor a worker process it started before (prestarted): spawn 0, imports from then
            begun = max(start, sub) if start is not None and sub is not None else start
            keys = {"worker_spawn_s": (sub, begun),
                    "worker_boot_imports_s": (begun, t.get("imported")),
                    "worker_actor_init_wait_s": (t.get("imported"), t.get("init_start")),
                    "model_load_s": (t.get("init_start"), t.get("model_loaded")),
                    "worker_init_rest_s": (t.get("model_loaded"), t.get("init_end")),
                    "group_join_s": (t.get("join_start"), t.get("join_end"))}
            per[w] = {k: float(b - a) for k, (a, b) in keys.items() if a is not None and b is not None}
        for k in ("worker_spawn_s", "worker_boot_imports_s", "worker_actor_init_wait_s", "model_load_s",
                  "worker_init_rest_s", "group_join_s"):
            vals = [p[k] for p in per.values() if k in p]
            if vals:
                out[k] = max(vals)
        if self.worker_startup:
            out["critical_worker"] = max(self.worker_startup, key=lambda w: self.worker_startup[w].get("join_end", 0))
        out["per_worker"] = per
        return out

    def trainable_state(self, worker: str) -> dict[str, torch.Tensor]:
        """The whole trainable weights `worker` holds (CPU tensors). Sharded trainer ranks gather them together,
        so the call goes to every trainer rank and returns the asked one's answer."""
        if worker_pool(worker) == "trn" and self.run.train.sharding.sharded:
            ranks = sorted((w for w in self.workers if worker_pool(w) == "trn"), key=worker_rank)
            states = ray.get([self.workers[w].trainable_state.remote() for w in ranks])
            return states[ranks.index(worker)]
        return ray.get(self.workers[worker].trainable_state.remote())

    def worker_stats(self) -> dict[str, dict[str, Any]]:
        """checksum() of every worker; a dead worker reports version -1 and no memory figure."""
        out = {}
        refs = {w: actor.checksum.remote() for w, actor in self.workers.items()}  # all first: a collective on FSDP2
        for w, ref in refs.items():
            try:
                out[w] = ray.get(ref, timeout=60)
            except (RayActorError, ray.exceptions.GetTimeoutError):
                out[w] = {"version": -1, "checksum": "", "rss_mb": float("nan"), "busy_s": float("nan"), "dead": True}
        return out

    def fit(self, resume_from: Path | None = None) -> dict[str, Any]:
        """Run to the end. On Ctrl-C / SIGTERM (KeyboardInterrupt): flush outputs, checkpoint, re-raise."""
        self.mark("fit_start")
        self.start_ray()
        self.mark("ray_ready")
        self.build_workers()
        if resume_from is not None:
            version = self.load_checkpoint(resume_from)
            if version != self.run.start_step:
                raise ValueError(f"checkpoint {resume_from} holds step {version}, the run was built for step "
                                 f"{self.run.start_step}")
        elif self.run.train.engine == "verl_omni" and self.run.policy.lora.enabled:
            # the trainers took verl-omni's LoRA init at their join (`VerlOmniTrainerWorker.join`); so do the generators
            self.sync_generators(self.run.start_step)
        self.executor = self.make_executor()
        try:
            self.train()
        except KeyboardInterrupt:
            self.interrupted = True
            self.t_end = self.executor.now()
            if self.driver is not None:
                try:  # bounded: if the run hung in a collective, the trainer would never answer
                    self.save_checkpoint(None, timeout_s=INTERRUPT_SAVE_TIMEOUT_S)
                except Exception as e:  # a dead or hung trainer must not replace the interrupt
                    print(f"digenrl: no checkpoint written on interrupt: {type(e).__name__}: {e}", file=sys.stderr)
                self.finish()
            raise
        return self.finish()

    def shutdown(self) -> None:
        for wg in self.worker_groups.values():
            for w in wg.workers:
                ray.kill(w)
        for w in self.workers.values():  # replacements and grown generators
            ray.kill(w)
        for start in self.supervisor.starting.values() if self.supervisor is not None else ():
            ray.kill(start.actor)  # still starting (e.g. waiting for room on a lost node)
        try:  # each release runs even when one before it raised: no placement group keeps its resources
            self.release_own_pools()
        finally:
            try:
                if self.judge_pool is not None:
                    self.judge_pool.release()
            finally:
                self.worker_groups.clear()
                self.workers.clear()
                if self.pool_manager is not None:
                    self.pool_manager.release()
