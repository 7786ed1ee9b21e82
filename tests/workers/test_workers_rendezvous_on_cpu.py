"""The rendezvous the runner picks reaches the workers (verl's RayWorkerGroup drops `master_addr`/`master_port`
keyword arguments: its base class resets them, so `make_worker_group` keeps them itself)."""

from __future__ import annotations

import os

import pytest
import ray
from ray.util.placement_group import remove_placement_group
from verl.single_controller.base import Worker
from verl.single_controller.ray.base import RayClassWithInitArgs

from digenrl_verl.weights.sync import free_port
from digenrl_verl.workers.pools import PoolSpec, make_ray_pool, make_worker_group

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("given", [True, False], ids=["given", "verl_finds_it"])
def test_worker_group_uses_the_given_rendezvous(ray_session, given):
    class _EnvWorker(Worker):  # defined here: Ray ships it by value (the tests package is not importable there)
        def master(self) -> tuple[str, str]:
            return os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]

    port = str(free_port())
    rendezvous = ("127.0.0.1", port) if given else None
    pool = make_ray_pool(PoolSpec(f"rdv_{int(given)}_", (1,)))
    wg = make_worker_group(pool, RayClassWithInitArgs(cls=ray.remote(_EnvWorker)), name_prefix=f"rdv{int(given)}",
                           device_name="cpu", rendezvous=rendezvous)
    try:
        addr, got_port = ray.get(wg.workers[0].master.remote())
        assert (str(wg.master_address), str(wg.master_port)) == (addr, got_port)
        if given:
            assert (addr, got_port) == rendezvous
        else:
            assert addr and got_port.isdigit()
    finally:
        for w in wg.workers:
            ray.kill(w)
        for pg in pool.pgs or []:
            remove_placement_group(pg)
