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
# Two pytest-xdist workers where the machine has two cores or more, each test file on one worker (--dist loadfile: a
# module's fixtures run once); DIGENRL_TEST_WORKERS=N sets how many, 0 runs every test in this process. Measured in
# docs/benchmarks.md ("CI time"): on the 2-core machine the Ray runs' start-ups leave a core idle a third of the time.
workers="${DIGENRL_TEST_WORKERS:-$("$VENV_PY" -c 'import os; print(2 if (os.cpu_count() or 1) >= 2 else 0)')}"
dist=()
if (( workers > 0 )); then dist=(-n "$workers" --dist loadfile); fi
# -rs: every skip with its reason (tests/conftest.py fails a skip whose reason DECLARED_SKIPS["main"] lacks)
exec "$VENV_PY" -m pytest -q -rs --durations=15 "${dist[@]}" "$@"
