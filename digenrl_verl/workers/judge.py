"""The VLM judge in its own Ray pool (`reward.reward_model.enable_resource_pool=True`), verl-omni's `reward_pool`.

verl-omni declares `reward_pool = [reward_model.n_gpus_per_node] * reward_model.nnodes` next to its training pool
and starts `world_size // tensor_model_parallel_size` vLLM replicas of the reward model there; its reward function
reaches them over HTTP. Here `JudgePool` places one `JudgeWorker` Ray actor per replica
(`rewards.vlm_judge.JudgePoolSpec` sizes them): a placement group per node with one bundle per replica (1 CPU, and
the replica's GPUs on a GPU pool), STRICT_PACK like the other pools, placed before any actor starts (waited for,
bounded), each actor holding the backend `reward.reward_model.rollout.name` names (transformers or vLLM). The
scoring workers (generators; trainers and colocated workers where they score) get the actor handles and judge
through `RemoteJudge`, a judge backend that sends the decoded images actor-to-actor and waits for the answers; the
schedule does not change (SCORE still runs on the generators). A judge replica that died fails the scoring task with
a RuntimeError naming the replica and the reward pool, never a Ray actor error: the executor reads an actor error in
a task's result as the death of the worker that ran the task.

Without a reward pool, a vLLM judge whose replica spans several GPUs (`tensor_model_parallel_size` > 1, verl-omni's
Qwen-Image OCR recipes: `REWARD_TP=4` on the training GPUs) is placed the way verl-omni places it on its
`global_pool`: `JudgePool.start_colocated` puts `devices // tensor_model_parallel_size` replicas on the nodes of the
worker pools, each reserving nothing from Ray (no CPU, no GPU: it shares its node's workers' devices) and seeing the
GPUs of `tensor_model_parallel_size` workers of its node (`CUDA_VISIBLE_DEVICES`, which Ray is told to leave alone).
It starts once the workers have joined and reported where they run (their models loaded, so vLLM's memory check
sees them; memory they take later, such as optimizer state, it does not); the scoring workers are given the replicas'
actor names, resolved at their first score. A colocated replica lives and dies with its node (not restarted).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from digenrl_verl.rewards.vlm_judge import KEY_POOL, KEY_TP, JudgeConfig, make_judge_backend
from digenrl_verl.workers.pools import PoolSpec, missing_resources, pool_needs

#: seconds `JudgePool.start` waits for the reward pool's placement groups to be placed
PLACE_TIMEOUT_S = 120.0
#: seconds `JudgePool.wait_ready` waits, by default, for every replica to load its model
READY_TIMEOUT_S = 600.0
#: the keys that size the reward pool, for its errors
SIZE_KEYS = "reward.reward_model.n_gpus_per_node / reward.reward_model.nnodes"
#: a colocated replica's environment on GPUs: Ray leaves the CUDA_VISIBLE_DEVICES given here as it is
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def colocated_replicas(placements: Sequence[tuple[str, Sequence[str]]], per_replica: int
                       ) -> list[tuple[str, tuple[str, ...]]]:
    """(node id, device ids) of each colocated judge replica, from the workers' (node id, device ids): each node's
    distinct devices in the order first seen, cut into groups of `per_replica` (the remainder stays unused), nodes
    in the order first seen."""
    nodes: dict[str, list[str]] = {}
    for node, devices in placements:
        seen = nodes.setdefault(node, [])
        seen.extend(d for d in devices if d not in seen)
    return [(node, tuple(devices[i:i + per_replica])) for node, devices in nodes.items()
            for i in range(0, len(devices) - per_replica + 1, per_replica)]


def colocated_options(name: str, node: str, gpus: Sequence[str] | None) -> dict[str, Any]:
    """Ray actor options of a colocated replica: named, pinned to `node`, reserving no CPU and no GPU; on GPUs
    (`gpus`) it sees those (`CUDA_VISIBLE_DEVICES`, which Ray is told to leave as given)."""
    options: dict[str, Any] = {"num_cpus": 0, "num_gpus": 0, "name": name,
                               "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
    if gpus is not None:
        options["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": ",".join(gpus), NOSET_CUDA: "1"}}
    return options


class JudgeWorker:
    """One judge replica (a Ray actor): the in-process backend of `cfg`, answering `transcribe` calls in order."""

    def __init__(self, cfg: JudgeConfig, torch_threads: int = 1) -> None:
        torch.set_num_threads(torch_threads)
        self.cfg = cfg
        self.backend = make_judge_backend(cfg)
        self.calls = 0
        self.images = 0

    def ready(self) -> str:
        """The backend's class name, once the model is loaded (start-up barrier)."""
        return type(self.backend).__name__

    def transcribe(self, images: Sequence[Any]) -> list[str]:
        self.calls += 1
        self.images += len(images)
        return self.backend.transcribe(images)

    def stats(self) -> dict[str, Any]:
        """Calls and images judged so far, the backend's class and this process's pid."""
        return {"calls": self.calls, "images": self.images, "backend": type(self.backend).__name__,
                "pid": os.getpid()}


class RemoteJudge:
    """A judge backend over the judge pool's actors: a call's images are split into contiguous shares, one per
    replica (starting at a replica that rotates per call, so several scoring workers spread their load), judged in
    parallel and put back in order."""

    def __init__(self, actors: Sequence[Any], first: int = 0) -> None:
        if not actors:
            raise ValueError("RemoteJudge needs at least one judge actor")
        # colocated replicas come by name (they start after the scoring workers): looked up at the first call
        self.colocated = all(isinstance(a, str) for a in actors)
        self.given = list(actors)
        self.resolved: list[Any] | None = None if self.colocated else self.given
        self.next = first % len(self.given)

    @property
    def actors(self) -> list[Any]:
        """The replicas' actor handles (named replicas looked up in this job's namespace once)."""
        if self.resolved is None:
            self.resolved = [ray.get_actor(name) for name in self.given]
        return self.resolved

    def transcribe(self, images: Sequence[Any]) -> list[str]:
        images = list(images)
        if not images:
            return []
        k = min(len(self.actors), len(images))
        bounds = [len(images) * i // k for i in range(k + 1)]
        order = [self.actors[(self.next + i) % len(self.actors)] for i in range(k)]
        self.next = (self.next + 1) % len(self.actors)
        refs = [actor.transcribe.remote(images[a:b]) for actor, a, b in zip(order, bounds, bounds[1:])]
        parts = []
        for actor, ref in zip(order, refs):
            try:
                parts.append(ray.get(ref))
            except RayActorError as err:  # the replica died, not this scoring worker (which the executor would drop)
                cause = " ".join([type(err).__name__, *str(err).splitlines()[:1]])
                where, fix = ((f"colocated on the worker pools' devices, {KEY_POOL}=false", f"or set {KEY_POOL}=true "
                               "(the judge's own pool)") if self.colocated else
                              (f"reward pool, {KEY_POOL}=True", f"or set {KEY_POOL}=false (the judge then runs in each "
                               f"scoring worker, or colocated on the workers' GPUs when {KEY_TP} > 1)"))
                raise RuntimeError(f"judge replica {self.actors.index(actor)} of {len(self.actors)} ({where}) died "
                                   f"({cause}); the scoring worker is alive. Judge replicas are not restarted: restart "
                                   f"the run, {fix}") from None
        return [answer for part in parts for answer in part]


class JudgePool:
    """The judge's actors and, in its own pool, the reward pool's placement groups (`start` or `start_colocated`,
    `wait_ready`, `release`)."""

    def __init__(self, cfg: JudgeConfig, name: str, torch_threads: int = 1) -> None:
        if cfg.pool is None:
            raise ValueError("JudgePool: the judge config has no replicas (it runs in each scoring worker)")
        self.cfg = cfg
        self.name = name
        self.torch_threads = torch_threads
        self.placement_groups: list[Any] = []
        self.actors: list[Any] = []

    def check_placeable(self, others: Sequence[PoolSpec] = ()) -> None:
        """Fail fast, naming the keys, when the Ray cluster cannot hold the pool now (placement would wait): the
        reward pool and the worker pools still to be placed (`others`) against what is available, and one node's
        resources for each of the pool's STRICT_PACK placement groups (one per node)."""
        pool = self.cfg.pool
        fix = (f"lower {SIZE_KEYS}, or set {KEY_POOL}=false (the judge then runs in each scoring worker, or colocated "
               f"on the workers' GPUs when {KEY_TP} > 1)")
        needs = {r: amount * pool.replicas for r, amount in pool.bundle().items()}
        for other in others:
            for r, amount in pool_needs(other).items():
                needs[r] = needs.get(r, 0.0) + amount
        workers = f" and the worker pools {sum(o.world_size for o in others)} process(es)" if others else ""
        for resource, have, amount in missing_resources(needs):
            raise ValueError(f"{KEY_POOL}=True: the Ray cluster has {have:g} {resource} left; the reward pool "
                             f"({pool.describe()}){workers} need {amount:g}; {fix}")
        group = {r: amount * pool.replicas_per_node for r, amount in pool.bundle().items()}
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        if not any(all(node.get(r, 0.0) >= amount for r, amount in group.items()) for node in nodes):
            raise ValueError(f"{KEY_POOL}=True: a node of the reward pool needs {group} on one node (STRICT_PACK: "
                             f"{pool.replicas_per_node} replica(s) of {pool.bundle()}), no node of the Ray cluster "
                             f"has that much; {fix}")

    def start(self, others: Sequence[PoolSpec] = ()) -> list[Any]:
        """Place the pool (waited for, `PLACE_TIMEOUT_S`: ValueError naming the sizing keys) and start one judge actor
        per replica (not waited for: `wait_ready`); the actors. `others`: the worker pools placed after this one,
        counted in the fail-fast check so that an error names the reward pool."""
        pool = self.cfg.pool
        if pool.colocated:
            raise ValueError("JudgePool.start: colocated replicas start with start_colocated, once the workers run")
        self.check_placeable(others)
        for node in range(pool.nnodes):
            self.placement_groups.append(placement_group([pool.bundle() for _ in range(pool.replicas_per_node)],
                                                         strategy="STRICT_PACK", name=f"{self.name}{node}"))
        try:
            ray.get([pg.ready() for pg in self.placement_groups], timeout=PLACE_TIMEOUT_S)
        except GetTimeoutError:
            self.release()  # the pending groups would take the resources once they free up
            raise ValueError(f"{KEY_POOL}=True: the reward pool ({pool.describe()}) was not placed within "
                             f"{PLACE_TIMEOUT_S:g} s (each node's group needs its replicas' resources on one node); "
                             f"lower {SIZE_KEYS}, or set {KEY_POOL}=false") from None
        remote = ray.remote(JudgeWorker)
        gpus = float(pool.devices_per_replica) if pool.use_gpu else 0.0
        for node, pg in enumerate(self.placement_groups):
            for bundle in range(pool.replicas_per_node):
                strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
                self.actors.append(remote.options(num_cpus=1, num_gpus=gpus, scheduling_strategy=strategy,
                                                  name=f"{self.name}{node}_{bundle}").remote(self.cfg,
                                                                                             self.torch_threads))
        return self.actors

    def handles(self) -> list[Any]:
        """What the scoring workers are given: the started actors (own pool), or the colocated replicas' names."""
        return self.names() if self.cfg.pool.colocated else self.actors

    def names(self) -> list[str]:
        """The colocated replicas' actor names (known before they start)."""
        return [f"{self.name}{k}" for k in range(self.cfg.pool.replicas)]

    def start_colocated(self, placements: Sequence[tuple[str, Sequence[str]]]) -> list[Any]:
        """Start the colocated replicas (not waited for: `wait_ready`) on the nodes of the workers' `placements`
        ((node id, GPU ids) per worker; on CPU a worker's own name stands for its device); ValueError naming
        `reward.reward_model.rollout.tensor_model_parallel_size` when the workers' devices give another number of
        replicas than the plan's (pools on other nodes than planned, or sharing GPUs)."""
        pool = self.cfg.pool
        replicas = colocated_replicas(placements, pool.devices_per_replica)
        if len(replicas) != pool.replicas:
            per_node = sorted(len({d for n, ds in placements if n == node for d in ds})
                              for node in dict.fromkeys(n for n, _ in placements))
            raise ValueError(f"{KEY_TP}={pool.devices_per_replica} with {KEY_POOL}=false: the plan has "
                             f"{pool.describe()}, but the worker pools run on {len(per_node)} node(s) with {per_node} "
                             f"distinct devices, which hold {len(replicas)} replica(s); lower {KEY_TP}, or set "
                             f"{KEY_POOL}=true")
        remote = ray.remote(JudgeWorker)
        for name, (node, devices) in zip(self.names(), replicas):
            options = colocated_options(name, node, devices if pool.use_gpu else None)
            self.actors.append(remote.options(**options).remote(self.cfg, self.torch_threads))
        return self.actors

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> list[str]:
        """Block until every replica has loaded its model (at most `timeout_s`); their backends' class names."""
        return ray.get([actor.ready.remote() for actor in self.actors], timeout=timeout_s)

    def stats(self) -> list[dict[str, Any]]:
        return ray.get([actor.stats.remote() for actor in self.actors])

    def release(self) -> None:
        """Stop the judge actors and give the pool's resources back."""
        actors, groups = self.actors, self.placement_groups
        self.actors, self.placement_groups = [], []
        try:
            for actor in actors:
                ray.kill(actor, no_restart=True)
        finally:  # the groups go back even if a kill raised
            for pg in groups:
                remove_placement_group(pg)
