#!/usr/bin/env bash
# The verl-omni tier: tests/verl_omni/ with the real verl-omni a1139baf + verl 8a69493, in .venv-verl-omni (built or
# reused by scripts/verl_omni_venv.sh). Extra args go to pytest. The main suite (scripts/test.sh) collects
# tests/verl_omni too and skips it there (each module skips itself when verl_omni does not import).
#   bash scripts/test_verl_omni.sh                                       # the tier (key coverage + the replay)
#   source scripts/verl_omni_venv.sh && $VERL_OMNI_PY scripts/replay_verl_omni_recipes.py --markdown   # the table
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/verl_omni_venv.sh
export TORCH_COMPILE_DISABLE=1 TORCHINDUCTOR_DISABLE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
       MPLBACKEND=Agg VLLM_TARGET_DEVICE=cpu RAY_USAGE_STATS_ENABLED=0
if [[ $# -eq 0 ]]; then set -- tests/verl_omni; fi
"$VERL_OMNI_PY" -c "import verl, verl_omni, vllm_omni, diffusers; print(f'verl-omni venv: verl {verl.__version__}, verl-omni a1139baf, vllm-omni {vllm_omni.__version__}, diffusers {diffusers.__version__}')"
exec "$VERL_OMNI_PY" -m pytest -q -p no:randomly -s --durations=10 "$@"
