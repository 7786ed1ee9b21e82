"""Resource pools declared the verl way, including on machines without GPUs.

verl's `ResourcePoolManager.create_resource_pool()` hard-codes `use_gpu=True` and counts GPUs, so it
refuses a CPU-only machine. `PoolManager` keeps verl's declaration style — a `resource_pool_spec`
(pool name → processes per node) and a role → pool mapping — and builds `RayResourcePool`s itself, with
`use_gpu=False` and `max_colocate_count=1` on CPU (the default of 10 CPUs per bundle hangs placement).

A GPU pool may take a fraction of a GPU per worker (`gpu_fraction`, e.g. 0.5): both pools of a disaggregated
run then fit on one GPU (each bundle asks for that fraction, each worker `num_gpus=fraction`, and Ray gives
both the same device). Pools that share a device cannot use NCCL between them (NCCL refuses two ranks on
one GPU): their collectives must use gloo.

A generator pool whose ranks each start a rollout replica (`hosts_replica`: verl-omni's replicas as the generators)
shares every bundle between the rank and its replica, as verl's colocated rollout mode shares a hybrid engine's
bundle (`RolloutReplica.init_colocated`): the bundle holds the device (on a CPU host one of Ray's logical GPUs), the
rank's worker takes half of it, the replica's worker the other half (`integrations.verl_omni_replica`), and one more
CPU is there for verl's port-finding task on the bundle. Each worker finds its bundle in ``DIGENRL_PG_BUNDLE``.

A pool may also name an accelerator type (Ray `accelerator_type`, GPU only) or a custom Ray resource
(any machine): each bundle then asks for a sliver of that resource, so heterogeneous clusters place the
generator and trainer pools on the nodes that advertise it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from verl.single_controller.ray.base import RayResourcePool, RayWorkerGroup

ROLES = ("generator", "trainer", "reward")
#: a pool worker's bundle index in its placement group (its replica's bundle: `PoolSpec.hosts_replica`)
BUNDLE_VAR = "DIGENRL_PG_BUNDLE"


@dataclass(frozen=True)
class PoolSpec:
    """One resource pool.

    Args:
        name: pool name (e.g. "generator_pool").
        process_on_nodes: worker processes per node, e.g. [2] for two workers on one node.
        use_gpu: one GPU per worker process when True.
        accelerator_type: Ray accelerator type for GPU pools (e.g. "H100"), or None.
        custom_resource: a Ray custom resource every bundle must hold (heterogeneous placement), or None.
        gpu_fraction: GPUs per bundle when use_gpu (1, or 1/k for an integer k to share a device).
        hosts_replica: each bundle also holds its rank's rollout replica (module docstring): the bundle has a GPU
            share even on CPU (Ray's logical GPU) and 2 CPUs, and the rank's worker takes half of the GPU share.
    """

    name: str
    process_on_nodes: tuple[int, ...]
    use_gpu: bool = False
    accelerator_type: str | None = None
    custom_resource: str | None = None
    gpu_fraction: float = 1.0
    hosts_replica: bool = False

    def __post_init__(self) -> None:
        k = 1.0 / self.gpu_fraction if self.gpu_fraction > 0 else 0.0
        if not 0 < self.gpu_fraction <= 1 or abs(k - round(k)) > 1e-9:
            raise ValueError(f"trainer.digenrl.pools.{self.name}: gpu_fraction={self.gpu_fraction!r} must be 1/k for "
                             "an integer k ≥ 1 (1, 0.5, 0.25, ...)")
        if not self.process_on_nodes or any(int(n) <= 0 for n in self.process_on_nodes):
            raise ValueError(
                f"trainer.digenrl.pools.{self.name}: process_on_nodes={list(self.process_on_nodes)} must list at "
                "least one node with a positive number of workers (an empty pool cannot run tasks)"
            )

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def worker_gpus(self) -> float:
        """GPUs a worker process of this pool asks of its bundle (half of it when the bundle hosts a replica)."""
        return self.gpu_fraction / 2 if self.hosts_replica else self.gpu_fraction

    def bundle(self) -> dict[str, float]:
        """The Ray placement bundle of one worker of this pool."""
        out: dict[str, float] = {"CPU": 2 if self.hosts_replica else 1}
        if self.use_gpu or self.hosts_replica:
            out["GPU"] = self.gpu_fraction
        if self.use_gpu and self.accelerator_type:
            out[f"accelerator_type:{self.accelerator_type}"] = 1e-3
        if self.custom_resource:
            out[self.custom_resource] = 1e-3
        return out


@dataclass
class PoolManager:
    """Role → pool mapping over named pools; builds the Ray resource pools on demand."""

    specs: Mapping[str, PoolSpec]
    mapping: Mapping[str, str]
    _pools: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for role, pool in self.mapping.items():
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r} in the role → pool mapping; valid roles: {list(ROLES)}")
            if pool not in self.specs:
                raise ValueError(
                    f"role {role!r} maps to pool {pool!r}, which resource_pool_spec does not declare; "
                    f"declared pools: {sorted(self.specs)}"
                )

    def pool_for(self, role: str, label: str | None = None):
        """The `RayResourcePool` of a role (created once, then shared); `label` names it in errors
        (`trainer.digenrl.pools.<label>`, default the role)."""
        name = self.mapping[role]
        if name not in self._pools:
            check_placeable(self.specs[name], label or role)
            self._pools[name] = make_ray_pool(self.specs[name])
        return self._pools[name]

    def spec_for(self, role: str) -> PoolSpec:
        return self.specs[self.mapping[role]]

    def release(self) -> None:
        """Remove the placement groups (their CPUs/GPUs go back to the cluster)."""
        for pool in self._pools.values():
            for pg in pool.pgs or []:
                remove_placement_group(pg)
        self._pools.clear()


def check_placeable(spec: PoolSpec, role: str) -> None:
    """Fail fast, naming the pool, when the Ray cluster cannot hold it now (placement would wait forever).

    Checked against what is still available, so pools already placed (their placement groups hold their
    resources) count against this one."""
    for resource, have, amount in missing_resources(pool_needs(spec)):
        raise ValueError(f"trainer.digenrl.pools.{role}: the Ray cluster has {have:g} of resource {resource!r} left, "
                         f"the pool needs {amount:g}; start Ray with that resource (e.g. ray start "
                         f"--resources='{{\"{resource}\": 1}}') or change the pool")


def pool_needs(spec: PoolSpec) -> dict[str, float]:
    """The Ray resources a pool's placement groups take, in all."""
    bundle = spec.bundle()
    needs = {"CPU": float(spec.world_size) * bundle["CPU"]}
    if "GPU" in bundle:
        needs["GPU"] = float(spec.world_size) * bundle["GPU"]
    if spec.use_gpu and spec.accelerator_type:
        needs[f"accelerator_type:{spec.accelerator_type}"] = 1e-3
    if spec.custom_resource:
        needs[spec.custom_resource] = 1e-3 * spec.world_size
    return needs


def missing_resources(needs: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """(resource, available, needed) for each resource of `needs` the Ray cluster has not that much of left now."""
    have = ray.available_resources()
    return [(r, have.get(r, 0.0), amount) for r, amount in needs.items() if have.get(r, 0.0) < amount]


def make_ray_pool(spec: PoolSpec):
    """A verl `RayResourcePool` for `spec`, with custom resources added to its bundles when asked."""
    class _Pool(RayResourcePool):
        def get_placement_groups(self, strategy="STRICT_PACK", name=None, device_name="cuda"):
            if self.pgs is not None or (spec.custom_resource is None and not spec.hosts_replica
                                        and spec.bundle().get("GPU", 1) == 1):
                return super().get_placement_groups(strategy=strategy, name=name, device_name=device_name)
            bundle = spec.bundle()
            pgs = [
                placement_group([dict(bundle) for _ in range(n)], strategy=strategy, name=f"{self.name_prefix}{i}")
                for i, n in enumerate(self._store)
            ]
            ray.get([pg.ready() for pg in pgs])
            self.pgs = pgs
            return pgs

    return _Pool(
        process_on_nodes=list(spec.process_on_nodes),
        use_gpu=spec.use_gpu,
        name_prefix=spec.name,
        # verl gives each worker num_gpus = 1 / max_colocate_count (a fraction of the device when shared)
        max_colocate_count=round(1 / spec.worker_gpus) if spec.use_gpu else 1,
        accelerator_type=spec.accelerator_type if spec.use_gpu else None,
    )


def make_worker_group(resource_pool, ray_cls_with_init, *, name_prefix: str, device_name: str,
                      rendezvous: tuple[str, str] | None = None, worker_env: Mapping[str, str] | None = None):
    """A verl `RayWorkerGroup` on `resource_pool`; `rendezvous` = (master_addr, master_port) to use as the group's
    MASTER_ADDR / MASTER_PORT, or None to let verl find them (a Ray task on the group's first bundle); `worker_env`:
    more environment variables of each worker process (verl's `worker_env`, e.g. `digenrl_verl.platform.process_env`).

    verl's `RayWorkerGroup` takes `master_addr` / `master_port` keyword arguments but its base class's `__init__`
    resets both to None before the workers start, so verl always runs its port-finding task; this subclass keeps
    the given address. Each worker's environment also names its bundle (`BUNDLE_VAR`)."""
    class _WorkerGroup(RayWorkerGroup):
        def __init__(self, **kwargs) -> None:
            self._given_rendezvous = rendezvous  # before super().__init__: it starts the workers
            super().__init__(**kwargs)

        def _create_worker(self, rank, pg_idx, pg, local_rank, resource_pool, ray_cls_with_init, worker_env,
                           detached):
            env = {**(worker_env or {}), BUNDLE_VAR: str(local_rank)}
            super()._create_worker(rank, pg_idx, pg, local_rank, resource_pool, ray_cls_with_init, env, detached)

        def _get_master_addr_port(self, pg, bundle_index=0, master_port_range=None):
            if self._given_rendezvous is None:
                return super()._get_master_addr_port(pg, bundle_index=bundle_index,
                                                     master_port_range=master_port_range)
            self._master_addr, self._master_port = self._given_rendezvous

    return _WorkerGroup(resource_pool=resource_pool, ray_cls_with_init=ray_cls_with_init, name_prefix=name_prefix,
                        device_name=device_name, worker_env=dict(worker_env or {}))
