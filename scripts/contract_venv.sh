#!/usr/bin/env bash
# Create (or reuse) .venv-contract: a second virtualenv with the real vLLM, for the contract tier (tests/contract/:
# the `vllm` judge backend, run by scripts/test_contract.sh), and the newest diffusers the project admits for the
# model and diffusion tests. CPU only: vllm imports on CPU, its CUDA kernels never run. vLLM-Omni is not here: the
# rollout's only vLLM-Omni is verl-omni's (0.27.0rc1, .venv-verl-omni, scripts/verl_omni_venv.sh).
# Usage: source scripts/contract_venv.sh   (sets CONTRACT_PY)
#
# What goes in, in this order (reinstalled when this script, setup.py's requirements or constraints.txt change):
#   1. torch==2.13.0, the CPU wheel (constraints.txt): vllm pins this torch, so pip keeps the CPU build;
#   2. vllm at its pin (DIGENRL_CONTRACT_VLLM overrides it) and diffusers 0.40.0 (DIGENRL_CONTRACT_DIFFUSERS; the
#      main venv resolves setup.py's range lower), with the project's install_requires and test extra read from
#      setup.py, less its diffusers range;
#   3. the project itself through a .pth file (the main .venv's editable install is left alone);
#   4. the PyPI torchvision / torchaudio / torchcodec wheels are CUDA builds that fail to load on CPU
#      (`operator torchvision::nms does not exist`): they are uninstalled, nothing in the tier needs them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIGENRL_CONTRACT_VENV:-$ROOT/.venv-contract}"
VLLM_VERSION="${DIGENRL_CONTRACT_VLLM:-0.28.0}"
DIFFUSERS_VERSION="${DIGENRL_CONTRACT_DIFFUSERS:-0.40.0}"
STAMP="$VENV/.digenrl-contract-installed"
want="$( (python3 "$ROOT/scripts/setup_metadata.py" requirements; cat "$ROOT/constraints.txt" \
          "$ROOT/scripts/contract_venv.sh"; echo "$VLLM_VERSION $DIFFUSERS_VERSION") | sha256sum | cut -d' ' -f1)"
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
    "diffusers==$DIFFUSERS_VERSION" "${reqs[@]}"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$ROOT" > "$site/digenrl_verl_src.pth"
  echo "$want" > "$STAMP"
  echo "contract venv: vllm $VLLM_VERSION, diffusers $DIFFUSERS_VERSION built in $((SECONDS - t0)) s" >&2
fi
CONTRACT_PY="$VENV/bin/python"
export CONTRACT_PY
