"""Where the tests find the upstream source archives (verl 8a69493, verl-omni a1139baf): `DIGENRL_UPSTREAM_DIR`,
read the way scripts/verl_omni_venv.sh and scripts/replay_verl_omni_recipes.py read it, else ../shared/upstream
beside the project. A missing archive skips with a reason the tiers do not declare (tests/conftest.py), so in a tier
it fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = Path(os.environ.get("DIGENRL_UPSTREAM_DIR") or ROOT.parent / "shared" / "upstream")
VERL_OMNI_ARCHIVE = UPSTREAM / "verl-omni-a1139baf.tar.gz"
VERL_ARCHIVE = UPSTREAM / "verl-8a69493.tar.gz"


def require(archive: Path) -> Path:
    """`archive`, or a skip naming it and the variable that points elsewhere."""
    if not archive.is_file():
        pytest.skip(f"upstream archive missing: {archive} (set DIGENRL_UPSTREAM_DIR to the folder holding it)")
    return archive
