#!/usr/bin/env bash
# The fast tier, for the edit loop: every test not marked `slow` (no Ray workers, no training runs, no recipe or
# benchmark subprocesses; see pytest.ini). CI runs the whole suite (scripts/test.sh). Extra args go to pytest.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/test.sh" -m "not slow" "$@"
