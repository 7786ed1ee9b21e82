"""Shared fixtures: one Ray instance per test session (starting Ray costs seconds; see README)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance on loopback, no dashboard, shared by every test that needs workers."""
    import ray

    from digenrl_verl.trainer.ray_runtime import init_local_ray

    if not ray.is_initialized():
        init_local_ray(num_cpus=8)
    yield ray
    ray.shutdown()
