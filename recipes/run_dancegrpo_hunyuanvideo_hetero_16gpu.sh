#!/usr/bin/env bash
# Heterogeneous cluster (the paper's Sec. 5.4 shape): 8 generator GPUs of one kind + 8 trainer GPUs of
# another, DanceGRPO on HunyuanVideo. Pools are placed by Ray accelerator type: GEN_ACCEL (default A800)
# and TRN_ACCEL (default H800) must match the accelerator_type your Ray nodes report.
# Colocated twin: run_dancegrpo_hunyuanvideo_hetero_16gpu_colocated.sh (16 GPUs of mixed kinds as one pool).
# The simulated gain over colocated for this shape: bash recipes/sim_hetero_8p8.sh
#   MODEL_PATH=/data/HunyuanVideo GEN_ACCEL=A800 TRN_ACCEL=H800 bash recipes/run_dancegrpo_hunyuanvideo_hetero_16gpu.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${MODE:-disaggregated}" == disaggregated ]]; then
  export GEN_ACCEL="${GEN_ACCEL:-A800}" TRN_ACCEL="${TRN_ACCEL:-H800}"
fi
NGPUS=16 GEN_SHARE=8 exec bash "$HERE/run_dancegrpo_hunyuanvideo.sh" "$@"
