#!/usr/bin/env bash
# The verl-omni tier: tests/verl_omni/ with the real verl-omni a1139baf + verl 8a69493, in .venv-verl-omni (built or
# reused by scripts/verl_omni_venv.sh), with OUR upstream series applied: the archive is unpacked into a git tree
# under build/ (gitignored), patches/verl-omni-a1139baf/*.patch go on with `git am`, and that tree is installed over
# the venv's verl-omni (--no-deps); the plugin's entry points (setup.py's: verl_omni.trainers, verl.plugins, the
# vLLM / vLLM-Omni platform plugins) are written as a stand-in dist-info (the venv holds the project through a .pth
# file, without metadata). Redone when the archive, the series or setup.py change (stamp in the venv).
# Extra args go to pytest. The main suite (scripts/test.sh) collects tests/verl_omni too and skips it there (each
# module skips itself when verl_omni does not import). In the tier (DIGENRL_TIER=verl_omni) a skip is a failure unless
# its reason is declared (tests/conftest.py), and scripts/tier_preflight.py imports what the tests import first.
#   bash scripts/test_verl_omni.sh                                       # the tier (key coverage + the replay)
#   source scripts/verl_omni_venv.sh && $VERL_OMNI_PY scripts/replay_verl_omni_recipes.py --markdown   # the table
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/verl_omni_venv.sh
export TORCH_COMPILE_DISABLE=1 TORCHINDUCTOR_DISABLE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
       MPLBACKEND=Agg RAY_USAGE_STATS_ENABLED=0 DIGENRL_TIER=verl_omni
PATCHED="$ROOT/build/verl-omni-a1139baf-patched"
PATCH_STAMP="$(dirname "$VERL_OMNI_PY")/../.digenrl-verl-omni-patched"
patch_want="$(cat "$VERL_OMNI_TGZ" patches/verl-omni-a1139baf/*.patch setup.py | sha256sum \
              | cut -d' ' -f1)"
if [[ ! -f "$PATCH_STAMP" || "$(cat "$PATCH_STAMP")" != "$patch_want" ]]; then
  rm -rf "$PATCHED" && mkdir -p "$PATCHED"
  tar xzf "$VERL_OMNI_TGZ" -C "$PATCHED" --strip-components=1
  g=(git -C "$PATCHED" -c user.name=digenrl-verl -c user.email=digenrl-verl@users.noreply.github.com)
  "${g[@]}" init -q && "${g[@]}" add -A && "${g[@]}" commit -q -m "verl-omni a1139baf (source archive)"
  "${g[@]}" am -q --keep-non-patch "$ROOT"/patches/verl-omni-a1139baf/*.patch
  "$VERL_OMNI_PY" -m pip install -q --no-deps --no-build-isolation "$PATCHED"
  site="$("$VERL_OMNI_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  dist="$site/digenrl_verl_entry_points-0.0.0.dist-info"
  mkdir -p "$dist"
  printf 'Metadata-Version: 2.1\nName: digenrl-verl-entry-points\nVersion: 0.0.0\n' > "$dist/METADATA"
  "$VERL_OMNI_PY" scripts/setup_metadata.py entry-points > "$dist/entry_points.txt"  # setup.py's, as pip writes them
  echo "$patch_want" > "$PATCH_STAMP"
  echo "verl-omni venv: verl-omni a1139baf + $(ls patches/verl-omni-a1139baf/*.patch | wc -l) patches installed" >&2
fi
if [[ $# -eq 0 ]]; then set -- tests/verl_omni; fi
# pre-flight: every module the tier's tests import, imported here first (a broken import fails the tier, never skips it),
# after the stack whose versions it prints (one interpreter for both)
"$VERL_OMNI_PY" scripts/tier_preflight.py "--banner=verl-omni venv: verl {verl.__version__}, verl-omni a1139baf + \
patches/verl-omni-a1139baf, vllm-omni {vllm_omni.__version__}, diffusers {diffusers.__version__}" "$@"
# -rs: every skip with its reason; tests/conftest.py fails any skip whose reason DECLARED_SKIPS["verl_omni"] lacks
# Two pytest-xdist workers where the machine has two cores or more, each test file on one worker (--dist loadfile: a
# module's fixtures run once), as scripts/test.sh; DIGENRL_TEST_WORKERS=N sets how many, 0 runs in this process (and
# with -s, so a hung replica's output shows). Measured in docs/benchmarks.md ("CI time").
workers="${DIGENRL_TEST_WORKERS:-$("$VERL_OMNI_PY" -c 'import os; print(2 if (os.cpu_count() or 1) >= 2 else 0)')}"
dist=(-s)
if (( workers > 0 )); then dist=(-n "$workers" --dist loadfile); fi
exec "$VERL_OMNI_PY" -m pytest -q -rs -p no:randomly --durations=10 "${dist[@]}" "$@"
