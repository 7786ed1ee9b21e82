"""The contract tier: DigenRL's vLLM-Omni backend driven through the real vLLM-Omni code (CPU-importable parts).

Runs in `.venv-contract` (scripts/contract_venv.sh; `bash scripts/test_contract.sh`). Every test module starts with
`pytest.importorskip("vllm_omni")`, so the main suite (`.venv`, no vLLM-Omni) collects them and reports them as
skipped. Nothing here imports vLLM-Omni at module level.
"""

from __future__ import annotations

import pytest

@pytest.fixture(scope="session")
def flux_dir(tmp_path_factory) -> str:
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return str(build_tiny_model_dir("FluxPipeline", tmp_path_factory.mktemp("contract_models") / "flux", seed=0))
