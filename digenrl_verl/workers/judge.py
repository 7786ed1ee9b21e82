"""The VLM judge in its own Ray pool (`reward.reward_model.enable_resource_pool=True`), verl-omni's `reward_pool`.

verl-omni declares `reward_pool = [reward_model.n_gpus_per_node] * reward_model.nnodes` next to its training pool
and starts `world_size // tensor_model_parallel_size` vLLM replicas of the reward model there; its reward function
reaches them over HTTP. Here `JudgePool` places one `JudgeWorker` Ray actor per replica (`rewards.vlm_judge.JudgePool`
sizes them): a placement group per node with one bundle per replica (1 CPU, and the replica's GPUs on a GPU pool),
STRICT_PACK like the other pools, each actor holding the backend `reward.reward_model.rollout.name` names
(transformers or vLLM). The scoring workers (generators; trainers and colocated workers where they score) get the
actor handles and judge through `RemoteJudge`, a judge backend that sends the decoded images actor-to-actor and
waits for the answers; the schedule does not change (SCORE still runs on the generators).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from digenrl_verl.rewards.vlm_judge import JudgeConfig, make_judge_backend


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
        self.actors = list(actors)
        self.next = first % len(self.actors)

    def transcribe(self, images: Sequence[Any]) -> list[str]:
        images = list(images)
        if not images:
            return []
        k = min(len(self.actors), len(images))
        bounds = [len(images) * i // k for i in range(k + 1)]
        order = [self.actors[(self.next + i) % len(self.actors)] for i in range(k)]
        self.next = (self.next + 1) % len(self.actors)
        refs = [actor.transcribe.remote(images[a:b]) for actor, a, b in zip(order, bounds, bounds[1:])]
        return [answer for part in ray.get(refs) for answer in part]


class JudgePool:
    """The reward pool's placement groups and judge actors (`start`, `wait_ready`, `release`)."""

    def __init__(self, cfg: JudgeConfig, name: str, torch_threads: int = 1) -> None:
        if cfg.pool is None:
            raise ValueError("JudgePool: the judge config has no pool (reward.reward_model.enable_resource_pool=False)")
        self.cfg = cfg
        self.name = name
        self.torch_threads = torch_threads
        self.placement_groups: list[Any] = []
        self.actors: list[Any] = []

    def check_placeable(self) -> None:
        """Fail fast, naming the keys, when the Ray cluster cannot hold the pool now (placement would wait)."""
        pool = self.cfg.pool
        have = ray.available_resources()
        for resource, amount in pool.bundle().items():
            need = amount * pool.replicas
            if have.get(resource, 0.0) < need:
                raise ValueError(f"reward.reward_model.enable_resource_pool=True: the Ray cluster has "
                                 f"{have.get(resource, 0.0):g} {resource} left, the reward pool needs {need:g} "
                                 f"({pool.describe()}); lower reward.reward_model.n_gpus_per_node / nnodes, or set "
                                 "enable_resource_pool=false (the judge then runs in each scoring worker)")

    def start(self) -> list[Any]:
        """Place the pool and start one judge actor per replica (not waited for: `wait_ready`); the actors."""
        pool = self.cfg.pool
        self.check_placeable()
        remote = ray.remote(JudgeWorker)
        gpus = float(pool.devices_per_replica) if pool.use_gpu else 0.0
        for node in range(pool.nnodes):
            pg = placement_group([pool.bundle() for _ in range(pool.replicas_per_node)], strategy="STRICT_PACK",
                                 name=f"{self.name}{node}")
            self.placement_groups.append(pg)
            for bundle in range(pool.replicas_per_node):
                strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
                self.actors.append(remote.options(num_cpus=1, num_gpus=gpus, scheduling_strategy=strategy,
                                                  name=f"{self.name}{node}_{bundle}").remote(self.cfg,
                                                                                             self.torch_threads))
        return self.actors

    def wait_ready(self, timeout_s: float | None = None) -> list[str]:
        """Block until every replica has loaded its model; their backends' class names."""
        return ray.get([actor.ready.remote() for actor in self.actors], timeout=timeout_s)

    def stats(self) -> list[dict[str, Any]]:
        return ray.get([actor.stats.remote() for actor in self.actors])

    def release(self) -> None:
        """Stop the judge actors and give the pool's resources back."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        for pg in self.placement_groups:
            remove_placement_group(pg)
        self.actors, self.placement_groups = [], []
