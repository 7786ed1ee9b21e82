#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and install digenrl_verl into it with the CPU constraints.
# Usage: source scripts/ensure_venv.sh   (sets VENV_PY)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIGENRL_VENV:-$ROOT/.venv}"
STAMP="$VENV/.digenrl-installed"
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
# Reinstall when the requirements (read from setup.py), the constraints or this script change; when only the rest of
# setup.py changes (entry points, package data), refresh the project's own metadata (no dependency is touched).
want="$( (python3 "$ROOT/scripts/setup_metadata.py" requirements; cat "$ROOT/constraints.txt" "$ROOT/scripts/ensure_venv.sh") \
        | sha256sum | cut -d' ' -f1)"
meta_want="$(sha256sum "$ROOT/setup.py" | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch first: the CPU wheel of the pinned version; an unpinned torch pulls a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" "torch==2.13.0"
  # the test extra, and the ocr extra: its weights ship in the wheel, so the OCR reward and recipe are tested too
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -e "$ROOT[test,ocr]"
  echo "$want" > "$STAMP"
  echo "$meta_want" > "$STAMP.metadata"
elif [[ ! -f "$STAMP.metadata" || "$(cat "$STAMP.metadata")" != "$meta_want" ]]; then
  "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
  echo "$meta_want" > "$STAMP.metadata"
fi
# the build leaves an egg-info in the work tree; on sys.path from the repo root it would shadow the installed
# metadata (entry points) with a stale copy
rm -rf "$ROOT/digenrl_verl.egg-info"
VENV_PY="$VENV/bin/python"
export VENV_PY
