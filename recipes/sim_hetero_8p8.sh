#!/usr/bin/env bash
# The paper's Sec. 5.4 shape (8 + 8 GPUs of two kinds) in the simulator: DigenRL's gain over colocated,
# with the slow class generating (the scenario), the classes swapped, and a homogeneous 8+8 reference.
# Simulated from modelled costs (digenrl_verl/sim/profiles.py), not measured. Runs on CPU in about a second.
#   bash recipes/sim_hetero_8p8.sh [--json] [--steps N]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -z "${VENV_PY:-}" ]]; then source scripts/ensure_venv.sh; fi
exec "$VENV_PY" -m digenrl_verl.sim.hetero "$@"
