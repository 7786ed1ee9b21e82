"""Shared fixtures: one Ray instance per test session (starting Ray costs seconds; see README); and the rule that a
skip is a failure unless its reason is declared.

A skip proves nothing. Every run (the main suite and each tier: `DIGENRL_TIER`, set by scripts/test_verl_omni.sh
and scripts/test_contract.sh) accepts only the skips whose reason matches a pattern in `DECLARED_SKIPS` for that
run; any other skip, at collection or in a test, is reported as a failure naming the reason and this list.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _register(name: str) -> None:
    """tests/<name>.py importable as `name` from every test module, without putting tests/ on sys.path (its folders
    would shadow packages: tests/verl_omni is a namespace package `verl_omni`)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_register("_upstream")

TIER_ENV = "DIGENRL_TIER"
_GPU_ONLY = (r"needs a CUDA GPU", r"NCCL weight sync needs two GPUs", r"FSDP2 over NCCL: 1 generator \+ 2 trainer GPUs")
# run -> the skip reasons that are not failures there (regexes, searched in the reason)
DECLARED_SKIPS: dict[str, tuple[str, ...]] = {
    # the tiers: only what needs a GPU (tests/gpu is never collected by a tier; listed for a tier run that names it)
    "verl_omni": _GPU_ONLY,
    "contract": _GPU_ONLY,
    # the main suite (.venv: no vLLM, vLLM-Omni or verl-omni): the tiers' modules skip themselves here and run in their
    # own venv, where they may not skip; tests of a fall-back that only exists without those packages skip in a tier
    # venv; and the machine facts a developer's host may lack
    "main": _GPU_ONLY + (
        r"verl_omni is not importable here", r"no verl-omni \(the verl-omni tier", r"could not import 'verl_omni",
        r"could not import 'vllm_omni'", r"could not import 'vllm'",
        r"verl-omni is installed here", r"vLLM can judge on this machine",
        r"no IPv6 loopback here", r"patches are for verl 0\.9\.1",
    ),
}


def tier() -> str:
    return os.environ.get(TIER_ENV) or "main"


def _undeclared(report) -> str | None:
    """The reason of a skip that `DECLARED_SKIPS` does not allow in this run, else None (xfail is not a skip)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    allowed = DECLARED_SKIPS.get(tier())
    if allowed is None:
        return f"{reason} ({TIER_ENV}={tier()!r} is not a run in tests/conftest.py DECLARED_SKIPS)"
    if any(re.search(p, reason) for p in allowed):
        return None
    return reason


def _fail_undeclared(report) -> None:
    reason = _undeclared(report)
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = (f"undeclared skip in the {tier()!r} run: {reason}\n"
                           f"A skip is a failure unless its reason is declared in tests/conftest.py DECLARED_SKIPS.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_undeclared(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_undeclared(outcome.get_result())


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance on loopback, no dashboard, shared by every test that needs workers."""
    import ray

    from digenrl_verl.trainer.ray_runtime import init_local_ray

    if not ray.is_initialized():
        init_local_ray(num_cpus=8)
    yield ray
    ray.shutdown()
