"""Run as a script (by test_integ_hetero_on_cpu.py) in its own process: a local Ray instance that advertises
two custom resources, one generator and one trainer pool placed by `PoolSpec.custom_resource` (the placement
groups `workers/pools.py` builds, which the runner's worker groups then fill), a probe worker in the trainer
pool, and a JSON report on stdout. Its own process because the test session's shared Ray instance advertises
no custom resources (and a second Ray instance cannot start in the same process)."""

from __future__ import annotations

import json
import sys


def main() -> int:
    import ray
    from ray.util import placement_group_table
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray.base import RayClassWithInitArgs, RayWorkerGroup

    from digenrl_verl.trainer.ray_runtime import init_local_ray
    from digenrl_verl.workers.pools import PoolManager, PoolSpec

    class Probe(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def held(self) -> dict:
            ctx = ray.get_runtime_context()
            return {"resources": ctx.get_assigned_resources(), "pg": ctx.get_placement_group_id()}

    # Each bundle of a pool asks 1e-3 of its pool's resource (workers/pools.py): 2 generator bundles of kind_a,
    # 1 trainer bundle of kind_b.
    init_local_ray(num_cpus=4, resources={"kind_a": 1, "kind_b": 1})
    specs = {"gen_pool": PoolSpec("probe_gen_", (2,), custom_resource="kind_a"),
             "trn_pool": PoolSpec("probe_trn_", (1,), custom_resource="kind_b")}
    manager = PoolManager(specs, {"generator": "gen_pool", "trainer": "trn_pool"})
    report: dict = {"pools": {}}
    for role in ("generator", "trainer"):
        pgs = manager.pool_for(role).get_placement_groups()
        bundles = [b for pg in pgs for b in placement_group_table(pg)["bundles"].values()]
        report["pools"][role] = {"placement_groups": [pg.id.hex() for pg in pgs], "bundles": bundles}
    # One worker group (the trainer's): its workers run inside the pool's placement group.
    wg = RayWorkerGroup(resource_pool=manager.pool_for("trainer"), ray_cls_with_init=RayClassWithInitArgs(
        cls=ray.remote(Probe)), name_prefix="probe_trainer", device_name="cpu")
    report["pools"]["trainer"]["workers"] = wg.held()
    report["available"] = {k: ray.available_resources().get(k, 0.0) for k in ("kind_a", "kind_b")}
    manager.release()
    ray.shutdown()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
