#!/usr/bin/env bash
# GPU checks of digenrl_verl on tiny models (one CUDA GPU; the NCCL test needs two). Prints the device, runs
# tests/gpu with timings, exits with pytest's status. Without CUDA every test reports SKIPPED.
#   bash tests/gpu/run_gpu_checks.sh [extra pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [[ -z "${VENV_PY:-}" ]]; then source scripts/ensure_venv.sh; fi
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 TORCH_COMPILE_DISABLE=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$VENV_PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'devices', torch.cuda.device_count())"
exec "$VENV_PY" -m pytest tests/gpu -v -rs --durations=0 -p no:cacheprovider "$@"
