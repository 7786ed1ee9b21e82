"""GAP-aware splitting and gathering of a step's DataProto (no Ray needed); the pools' bundles and what each worker
knows of its own."""

import numpy as np
import pytest
import torch
from verl import DataProto

from digenrl_verl.trainer.data import make_step_batch
from digenrl_verl.workers.dispatch import gather_in_sample_order, split_by_assignment


def _batch(prompts=3, n=4):
    b = make_step_batch([f"prompt {i}" for i in range(prompts)], ["builtin"] * prompts, list(range(prompts)), n, step=7)
    b.batch = DataProto.from_dict(tensors={"x": torch.arange(prompts * n, dtype=torch.float32)[:, None]}).batch
    return b


def test_gap_assignment_spreads_one_group_over_ranks_and_gathers_back():
    b = _batch(prompts=3, n=4)
    # GAP: group 1 (rows 4..7) over 3 ranks, uneven: 2/1/1
    assignment = [[4, 7], [5], [6]]
    parts = split_by_assignment(b, assignment)
    assert [len(p) for p in parts] == [2, 1, 1]
    assert set(parts[0].non_tensor_batch["uid"]) == {"p1"}
    gathered = gather_in_sample_order(parts, assignment)
    assert gathered.batch["x"][:, 0].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert gathered.non_tensor_batch["sample_index"].tolist() == [0, 1, 2, 3]


def test_empty_shards_are_allowed_and_skipped_on_gather():
    b = _batch(prompts=1, n=2)
    parts = split_by_assignment(b, [[0, 1], [], []])
    assert [len(p) for p in parts] == [2, 0, 0]
    assert gather_in_sample_order(parts, [[0, 1], [], []]).batch["x"][:, 0].tolist() == [0.0, 1.0]


def test_row_given_twice_or_out_of_range_is_rejected():
    b = _batch(prompts=1, n=2)
    with pytest.raises(ValueError, match="two ranks"):
        split_by_assignment(b, [[0, 1], [1]])
    with pytest.raises(ValueError, match="outside"):
        split_by_assignment(b, [[0, 5]])


def test_step_batch_layout_matches_grpo_groups():
    b = make_step_batch(["a", "b"], ["s", "s"], [10, 11], n=3, step=2)
    assert b.non_tensor_batch["uid"].tolist() == ["p10"] * 3 + ["p11"] * 3
    assert b.non_tensor_batch["sample_index"].tolist() == [0, 1, 2, 0, 1, 2]
    assert b.meta_info["global_step"] == 2
    assert isinstance(b.non_tensor_batch["sample_index"], np.ndarray)


@pytest.mark.slow  # starts the session's Ray instance
def test_a_pool_the_cluster_cannot_place_fails_fast_naming_it(ray_session):
    from digenrl_verl.workers.pools import PoolManager, PoolSpec

    manager = PoolManager({"g": PoolSpec("g", (1,), custom_resource="no_such_kind")}, {"generator": "g"})
    with pytest.raises(ValueError, match="trainer.digenrl.pools.generator.*no_such_kind"):
        manager.pool_for("generator")


def test_each_pool_worker_knows_its_bundle_the_one_its_replica_shares(ray_session):
    """`make_worker_group` tells each worker its placement-group bundle (`BUNDLE_VAR`, verl's local rank there):
    a generator rank starts its rollout replica on that bundle (`PoolSpec.hosts_replica`)."""
    import os

    import ray
    from ray.util.placement_group import remove_placement_group
    from verl.single_controller.base import Worker
    from verl.single_controller.ray.base import RayClassWithInitArgs

    from digenrl_verl.workers.pools import BUNDLE_VAR, PoolSpec, make_ray_pool, make_worker_group

    class _Probe(Worker):  # defined here: Ray ships it by value
        def where(self) -> tuple[str, str]:
            return os.environ[BUNDLE_VAR], ray.get_runtime_context().get_placement_group_id()

    pool = make_ray_pool(PoolSpec("bundle_probe_", (2,)))
    wg = make_worker_group(pool, RayClassWithInitArgs(cls=ray.remote(_Probe)), name_prefix="bundle_probe",
                           device_name="cpu")
    try:
        got = ray.get([w.where.remote() for w in wg.workers])
    finally:
        for w in wg.workers:
            ray.kill(w)
        for pg in pool.pgs or []:
            remove_placement_group(pg)
    assert [b for b, _ in got] == ["0", "1"] and {pg for _, pg in got} == {pool.pgs[0].id.hex()}, got


def test_a_bundle_that_hosts_a_replica_holds_the_device_and_halves_the_workers_share():
    from digenrl_verl.workers.pools import PoolSpec, make_ray_pool, pool_needs

    cpu = PoolSpec("g", (2,), hosts_replica=True)  # CPU: the device is one of Ray's logical GPUs
    assert cpu.bundle() == {"CPU": 2, "GPU": 1.0} and pool_needs(cpu) == {"CPU": 4.0, "GPU": 2.0}
    shared = PoolSpec("g", (1,), use_gpu=True, gpu_fraction=0.5, hosts_replica=True)
    assert shared.bundle() == {"CPU": 2, "GPU": 0.5} and shared.worker_gpus == 0.25
    assert make_ray_pool(shared).max_colocate_count == 4
    plain = PoolSpec("g", (1,), use_gpu=True)
    assert plain.bundle() == {"CPU": 1, "GPU": 1.0} and plain.worker_gpus == 1.0
