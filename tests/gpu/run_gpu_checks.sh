#!/usr/bin/env bash
# The GPU checks of digenrl_verl in one bounded run (tests/gpu/gpu_checks.py): each check in its own process
# with its own timeout, global budget 420 s, one summary line per check, outputs/gpu_checks.json.
# Without CUDA: prints "skipped: no CUDA" and the checks it would run, exits 0.
#   bash tests/gpu/run_gpu_checks.sh            # run (exit 1 if a check failed)
#   bash tests/gpu/run_gpu_checks.sh --plan     # print the exact commands (also DIGENRL_GPU_CHECKS_DRY=1)
# verl-omni's rollout (`rollout.name=vllm_omni`: its replicas on CUDA) needs the verl-omni venv: run_replica_check.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [[ -z "${VENV_PY:-}" ]]; then source scripts/ensure_venv.sh; fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  2>/dev/null || true
exec "$VENV_PY" tests/gpu/gpu_checks.py "$@"
