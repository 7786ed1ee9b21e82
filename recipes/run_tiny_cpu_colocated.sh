#!/usr/bin/env bash
# Baseline twin of run_tiny_cpu.sh: the same run, colocated (2 workers generate, score, then train with the
# per-timestep loop, like verl-omni today). Outputs go to outputs/tiny_cpu_colocated/.
set -euo pipefail
MODE=colocated exec bash "$(dirname "${BASH_SOURCE[0]}")/run_tiny_cpu.sh" "$@"
