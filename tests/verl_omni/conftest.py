"""The verl-omni tier: the project against the real verl-omni (a1139baf) and the verl it pins (8a69493).

Runs in `.venv-verl-omni` (scripts/verl_omni_venv.sh; `bash scripts/test_verl_omni.sh`). The main suite (`.venv`,
no verl-omni) collects this folder and skips it: every module starts by importing verl_omni and skips
itself when that fails.
"""

from __future__ import annotations

import pytest

@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory) -> str:
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return str(build_tiny_model_dir("FluxPipeline", tmp_path_factory.mktemp("verl_omni_models") / "flux", seed=0))
