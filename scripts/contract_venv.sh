#!/usr/bin/env bash
# Create (or reuse) .venv-contract: a second virtualenv with the real vLLM-Omni, for the contract tier
# (tests/contract/, run by scripts/test_contract.sh). CPU only: vllm and vllm-omni import on CPU, their CUDA
# kernels never run. Usage: source scripts/contract_venv.sh   (sets CONTRACT_PY)
#
# What goes in, in this order (reinstalled when this script, setup.py's requirements or constraints.txt change):
#   1. torch==2.13.0, the CPU wheel (constraints.txt): vllm pins this torch, so pip keeps the CPU build;
#   2. vllm / vllm-omni at the pinned pair (DIGENRL_CONTRACT_VLLM / DIGENRL_CONTRACT_VLLM_OMNI override them, e.g.
#      0.27.0 / 0.27.0rc1, verl-omni's pair), with the project's install_requires and test extra read from
#      setup.py, less its diffusers range: vllm-omni pins diffusers exactly (0.28.0: ==0.40.0), and the tier runs
#      on that diffusers;
#   3. the project itself through a .pth file (the main .venv's editable install is left alone);
#   4. the PyPI torchvision / torchaudio / torchcodec wheels are CUDA builds that fail to load on CPU
#      (`operator torchvision::nms does not exist`): they are uninstalled, nothing in the tier needs them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIGENRL_CONTRACT_VENV:-$ROOT/.venv-contract}"
VLLM_VERSION="${DIGENRL_CONTRACT_VLLM:-0.28.0}"
VLLM_OMNI_VERSION="${DIGENRL_CONTRACT_VLLM_OMNI:-0.28.0}"
STAMP="$VENV/.digenrl-contract-installed"
want="$( (python3 "$ROOT/scripts/setup_metadata.py" requirements; cat "$ROOT/constraints.txt" \
          "$ROOT/scripts/contract_venv.sh"; echo "$VLLM_VERSION $VLLM_OMNI_VERSION") | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
  t0=$SECONDS
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" "torch==2.13.0"
  # the project's requirements (install_requires + the test extra) as setup.py declares them, less diffusers
  mapfile -t reqs < <(cd "$ROOT" && "$VENV/bin/python" - <<'PY'
import re, setuptools
captured = {}
setuptools.setup = lambda **kw: captured.update(kw)
exec(open("setup.py").read())
reqs = list(captured["install_requires"]) + list(captured["extras_require"]["test"])
for r in reqs:
    if re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() != "diffusers":
        print(r)
PY
)
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" "vllm==$VLLM_VERSION" \
    "vllm-omni==$VLLM_OMNI_VERSION" "${reqs[@]}"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$ROOT" > "$site/digenrl_verl_src.pth"
  echo "$want" > "$STAMP"
  echo "contract venv: vllm $VLLM_VERSION, vllm-omni $VLLM_OMNI_VERSION built in $((SECONDS - t0)) s" >&2
fi
CONTRACT_PY="$VENV/bin/python"
export CONTRACT_PY
