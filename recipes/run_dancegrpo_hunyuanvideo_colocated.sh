#!/usr/bin/env bash
# Baseline twin of run_dancegrpo_hunyuanvideo.sh: the same run colocated (every GPU generates, scores, then trains with the
# per-timestep loop, as verl-omni does today). Same knobs and extra overrides.
set -euo pipefail
MODE=colocated exec bash "$(dirname "${BASH_SOURCE[0]}")/run_dancegrpo_hunyuanvideo.sh" "$@"
