#!/usr/bin/env bash
# The whole test suite, on CPU: what CI runs (.ci/run). Creates or reuses .venv (see scripts/ensure_venv.sh).
# Extra args go to pytest. Ends with the 15 slowest tests (--durations=15). The edit loop's fast tier, without
# the tests marked `slow`, is scripts/test_fast.sh (see README, Development).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/ensure_venv.sh
export TORCH_COMPILE_DISABLE=1 TORCHINDUCTOR_DISABLE=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0 \
       RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
# -rs: every skip with its reason (tests/conftest.py fails a skip whose reason DECLARED_SKIPS["main"] lacks)
exec "$VENV_PY" -m pytest -q -rs --durations=15 "$@"
