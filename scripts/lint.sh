#!/usr/bin/env bash
# Lint with ruff (config: ruff.toml), as CI does (.ci/run). Extra args go to `ruff check`, e.g. --fix.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/ensure_venv.sh
exec "$VENV_PY" -m ruff check . "$@"
