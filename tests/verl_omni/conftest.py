"""The verl-omni tier: the project against the real verl-omni (a1139baf) and the verl it pins (8a69493).

Runs in `.venv-verl-omni` (scripts/verl_omni_venv.sh; `bash scripts/test_verl_omni.sh`). The main suite (`.venv`,
no verl-omni) collects this folder and skips it: every module starts by importing verl_omni and skips
itself when that fails.
"""

from __future__ import annotations

import os

import pytest

#: the tier's longest modules, longest first (the clean-clone .ci/run of 2026-12-07, two workers: entry points ~935 s,
#: flag vs stock ~345, TSP engine ~250, replica TP 2 ~210, replica engine ~160, CPU platform ~150, gloo checkpoint
#: engine ~150, accumulating worker ~120; every other module under 45 s). pytest-xdist's --dist loadfile hands out
#: modules in collection order, so these start first and the short ones fill in at the end (longest-first
#: scheduling); a stale order only costs time.
LONGEST_FIRST = ("test_verl_omni_entry_points", "test_verl_omni_flag_equals_stock_on_cpu", "test_verl_omni_tsp_engine",
                 "test_verl_omni_replica_on_cpu", "test_verl_omni_replica_engine", "test_verl_omni_cpu_platform",
                 "test_verl_omni_gloo_checkpoint_engine", "test_verl_omni_accumulating_worker")


def pytest_collection_modifyitems(config, items):
    """In the tier (``DIGENRL_TIER=verl_omni``) its longest modules first (`LONGEST_FIRST`), each module's tests in
    their order; the main suite, which collects this folder and skips it, keeps its order."""
    if os.environ.get("DIGENRL_TIER") != "verl_omni":
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))

@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory) -> str:
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return str(build_tiny_model_dir("FluxPipeline", tmp_path_factory.mktemp("verl_omni_models") / "flux", seed=0))
