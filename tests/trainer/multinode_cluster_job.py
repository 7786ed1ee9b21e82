"""Run as a script (by test_trainer_multinode_on_cpu.py) in its own process: a 3-node Ray cluster on this machine
(Ray's own `ray.cluster_utils.Cluster`: a head node for the driver with no CPU, a generator node advertising
`digenrl_gen`, a trainer node advertising `digenrl_trn`, each on its own loopback address so the nodes are told
apart by address too), then two tiny disaggregated runs on it (1 generator, 1 trainer, 2 global steps, a checkpoint
after each step) placed by `trainer.digenrl.pools.<role>.custom_resource`:

1. ``healthy``: the run as it is (BTS on);
2. ``node_lost``: TAG off, and the whole generator node is removed (`Cluster.remove_node`) right after the first
   GEN of step 1 was submitted (step 0 is done and checkpointed by then).

Prints one JSON report on stdout (last line): nodes, where each worker ran, the trainer group's rendezvous
address, checksums, the trace's completions and decisions, the checkpoints. Its own process because the test
session's shared Ray instance is single-node (and a second Ray instance cannot start in one process).

    python multinode_cluster_job.py <tiny model dir> <output dir>
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

# before Ray is imported: keep every node on the loopback addresses given below (Ray would otherwise swap
# 127.0.0.1 for the machine's routable address), in the driver and in every process the nodes start
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
for _key, _value in {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCH_COMPILE_DISABLE": "1",
                     "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0"}.items():
    os.environ.setdefault(_key, _value)

import psutil  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from digenrl_verl.main import TINY_CPU, compose  # noqa: E402
from digenrl_verl.schedule.types import Task, TaskKind  # noqa: E402
from digenrl_verl.trainer.checkpoint import read_meta  # noqa: E402
from digenrl_verl.trainer.config import build_run  # noqa: E402
from digenrl_verl.trainer.ray_runtime import connect_ray  # noqa: E402
from digenrl_verl.trainer.runner import DigenRLTrainer  # noqa: E402

HEAD_IP, GEN_IP, TRN_IP = "127.0.0.1", "127.0.0.2", "127.0.0.3"
NODE_DEAD_WAIT_S = 120.0
PROCESS_GONE_WAIT_S = 60.0
COMMON = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.optim.lr=3e-3",
          "trainer.digenrl.mode=disaggregated", "trainer.total_training_steps=2", "trainer.save_freq=1",
          "trainer.digenrl.final_eval_prompts=0", "trainer.logger=[console]",
          "trainer.digenrl.pools.generator.custom_resource=digenrl_gen",
          "trainer.digenrl.pools.trainer.custom_resource=digenrl_trn"]


class NodeLoss:
    """Removes the generator node right after the first GEN of step 1 is submitted, and returns once the generator's
    process is gone (so every later call to it fails; the GEN in flight may or may not have finished first)."""

    def __init__(self, lose: Callable[[], None], submit: Callable[[Task], None], gen_pid: int, now) -> None:
        self.lose = lose
        self.submit_task = submit
        self.gen_pid = gen_pid
        self.now = now
        self.lost_at: float | None = None
        self.gone_after_s: float | None = None

    def submit(self, task: Task) -> None:
        self.submit_task(task)
        if task.kind == TaskKind.GEN and task.step == 1 and self.lost_at is None:
            self.lost_at = self.now()
            self.lose()
            self.gone_after_s = _wait_gone(self.gen_pid, PROCESS_GONE_WAIT_S)
            if self.gone_after_s is None:
                raise RuntimeError(f"the generator process {self.gen_pid} outlived its node by {PROCESS_GONE_WAIT_S}s")


class NodeLossTrainer(DigenRLTrainer):
    """The runner's own executor (the elastic one in disaggregated mode), its `submit` wrapped by `NodeLoss`."""

    lose: Callable[[], None] | None = None

    def __init__(self, run) -> None:
        super().__init__(run)
        self.node_loss: NodeLoss | None = None

    def make_executor(self):
        executor = super().make_executor()
        pid = ray.get(self.workers["gen:0"].__ray_call__.remote(lambda _: os.getpid()))
        self.node_loss = NodeLoss(type(self).lose, executor.submit, pid, executor.now)
        executor.submit = self.node_loss.submit  # the driver calls this instance's submit
        return executor


def _wait_gone(pid: int, limit_s: float) -> float | None:
    """Seconds until process `pid` no longer runs (gone or a zombie), or None after `limit_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return time.monotonic() - t0
        except psutil.NoSuchProcess:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def _wait_node_dead(address: str, limit_s: float) -> float | None:
    """Seconds until Ray's GCS lists the node at `address` as dead (its health checks fail first), or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if not any(n["Alive"] for n in ray.nodes() if n["NodeManagerAddress"] == address):
            return time.monotonic() - t0
        time.sleep(0.5)
    return None


def _node_of(actor) -> str | None:
    """The address of the node an actor runs on (None if it is gone)."""
    try:
        node_id = ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=60)
    except Exception:
        return None
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)


def _checksums(trainer) -> dict:
    out = {}
    for w, a in trainer.workers.items():
        try:
            out[w] = ray.get(a.checksum.remote(), timeout=60)
        except Exception as e:  # a worker on a removed node
            out[w] = {"error": type(e).__name__}
    return out


def _report(trainer, t0: float) -> dict:
    trace = trainer.driver.trace
    trainers = trainer.worker_groups["trainer"]
    root = Path(trainer.run.checkpoint.root)
    return {
        "wall_s": time.monotonic() - t0,
        "placement": {w: _node_of(a) for w, a in trainer.workers.items()},
        "rendezvous": {"master_addr": str(trainers.master_address), "master_port": int(trainers.master_port),
                       "collective_master_addr": trainer.collective_spec.master_addr,
                       "trainer0_env_master_addr": ray.get(trainer.workers["trn:0"].__ray_call__.remote(
                           lambda _: os.environ.get("MASTER_ADDR")), timeout=60)},
        "supervisor": None if trainer.supervisor is None else {
            "pending": trainer.supervisor.pending(), "restarts": dict(trainer.supervisor.restarts),
            "dropped": sorted(trainer.supervisor.dropped), "messages": list(trainer.supervisor.messages)},
        "checksums": _checksums(trainer),
        "completions": [{"id": c.task.task_id, "kind": c.task.kind.value, "step": c.task.step,
                         "mb": c.task.microbatch, "workers": list(c.task.workers), "samples": list(c.task.samples),
                         "ok": c.ok, "start": c.start, "end": c.end,
                         "info": {k: (list(v) if isinstance(v, tuple) else v) for k, v in c.info.items()}}
                        for c in trace.sorted_completions()],
        "decisions": [{"t": d.time, "action": d.action, "step": d.step, "detail": d.detail} for d in trace.decisions],
        "dead": sorted(trainer.driver.dead),
        "steps": [r.step for r in trainer.results],
        "history": trainer.reporter.history,
        "checkpoints": {p.name: {"global_step": read_meta(p)["global_step"], "mtime": p.stat().st_mtime}
                        for p in sorted(root.glob("global_step_*")) if (p / "meta.json").is_file()},
    }


def _run(trainer_cls, model: str, out: Path, name: str, *extra: str) -> dict:
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={model}", f"trainer.digenrl.output_dir={out / name}",
                   f"trainer.default_local_dir={out / name / 'ckpt'}", *COMMON, *extra])
    trainer = trainer_cls(build_run(cfg))
    t0 = time.monotonic()
    try:
        trainer.fit()
        report = _report(trainer, t0)
        if isinstance(trainer, NodeLossTrainer):
            report["lost_at"] = trainer.node_loss.lost_at
            report["process_gone_after_s"] = trainer.node_loss.gone_after_s
        return report
    finally:
        trainer.shutdown()


def main(argv: list[str]) -> int:
    model, out = argv[0], Path(argv[1])
    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": HEAD_IP,
                                                            "include_dashboard": False})
    gen_node = cluster.add_node(num_cpus=1, resources={"digenrl_gen": 1}, node_ip_address=GEN_IP)
    cluster.add_node(num_cpus=1, resources={"digenrl_trn": 1}, node_ip_address=TRN_IP)
    connect_ray(cluster.address)  # what the entry point does with RAY_ADDRESS set
    nodes = [{"address": n["NodeManagerAddress"], "alive": n["Alive"],
              "resources": {k: v for k, v in n["Resources"].items() if k.startswith(("digenrl", "CPU"))}}
             for n in ray.nodes()]
    report: dict = {"cluster_start_s": time.monotonic() - t0, "driver_node": HEAD_IP, "nodes": nodes}
    try:
        report["healthy"] = _run(DigenRLTrainer, model, out, "healthy")
        NodeLossTrainer.lose = lambda: cluster.remove_node(gen_node, allow_graceful=False)
        report["node_lost"] = _run(NodeLossTrainer, model, out, "node_lost", "trainer.digenrl.tag.policy=off")
        report["node_dead_after_s"] = _wait_node_dead(GEN_IP, NODE_DEAD_WAIT_S)
        report["nodes_after"] = [{"address": n["NodeManagerAddress"], "alive": n["Alive"]} for n in ray.nodes()]
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
