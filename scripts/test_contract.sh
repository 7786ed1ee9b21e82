#!/usr/bin/env bash
# The contract tier: tests/contract/ with the real vLLM, in .venv-contract (built or reused by
# scripts/contract_venv.sh: vllm at its pin, diffusers 0.40.0, CPU torch). Extra args go to pytest, e.g.
#   bash scripts/test_contract.sh                                 # the contract tier
#   bash scripts/test_contract.sh tests/models tests/diffusion    # the CPU tests on diffusers 0.40.0
# The main suite (scripts/test.sh) collects tests/contract too and skips it there (each module starts with
# pytest.importorskip("vllm")); in the tier (DIGENRL_TIER=contract) a skip is a failure
# unless its reason is declared (tests/conftest.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/contract_venv.sh
export TORCH_COMPILE_DISABLE=1 TORCHINDUCTOR_DISABLE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
       MPLBACKEND=Agg DIGENRL_TIER=contract
if [[ $# -eq 0 ]]; then set -- tests/contract; fi
# every module the tests import (a broken import fails, never skips), after the versions it prints (one interpreter)
"$CONTRACT_PY" scripts/tier_preflight.py \
  "--banner=contract venv: vllm {vllm.__version__}, diffusers {diffusers.__version__}" "$@"
# -rs: every skip with its reason; tests/conftest.py fails any skip whose reason DECLARED_SKIPS["contract"] lacks
exec "$CONTRACT_PY" -m pytest -q -rs -p no:randomly --durations=10 "$@"
