#!/usr/bin/env bash
# Create (or reuse) .venv-verl-omni: a third virtualenv with the real verl-omni at the commit the project targets
# (a1139baf) and the verl it pins (8a69493, reports 0.9.0.dev0), for the verl-omni tier (tests/verl_omni/, the
# replay of verl-omni's example scripts: scripts/replay_verl_omni_recipes.py). CPU only: verl-omni, vLLM and
# vLLM-Omni are imported (verl-omni's config, its registries), their CUDA kernels never run.
# Usage: source scripts/verl_omni_venv.sh   (sets VERL_OMNI_PY)
#
# What goes in, in this order (reinstalled when this script, setup.py's requirements or constraints.txt change):
#   1. torch==2.13.0, the CPU wheel (constraints.txt), and setuptools/wheel (the sources build without isolation);
#   2. verl 8a69493 and verl-omni a1139baf from the source archives in ../shared/upstream/ (not on the registries),
#      with --no-deps;
#   3. vllm-omni 0.27.0rc1 without its dependencies, then ONE resolution of what the three declare (read from their
#      installed metadata; verl-omni with its vllm-omni and gpu extras: vllm==0.27.0), less vllm-omni's
#      accelerate==1.12.0, which contradicts verl-omni's accelerate>=1.14.0 (so verl-omni's own pins never resolve
#      together; this venv only imports vllm_omni: `import verl_omni` imports every pipeline eagerly), plus the
#      project's install_requires + test extra from setup.py with the three specifiers in PROPOSED below (what
#      setup.py needs to admit verl-omni's pins). verl 0.9.0.dev0 is installed already and pip keeps it (verl-omni
#      cannot run on verl 0.9.1: it needs verl.utils.chat_template);
#   4. the project itself through a .pth file (the main .venv's editable install is left alone);
#   5. the PyPI torchvision / torchaudio / torchcodec wheels are CUDA builds that fail to load on CPU: uninstalled
#      (as in scripts/contract_venv.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIGENRL_VERL_OMNI_VENV:-$ROOT/.venv-verl-omni}"
UPSTREAM="${DIGENRL_UPSTREAM_DIR:-$ROOT/../shared/upstream}"
VERL_TGZ="$UPSTREAM/verl-8a69493.tar.gz"
VERL_OMNI_TGZ="$UPSTREAM/verl-omni-a1139baf.tar.gz"
STAMP="$VENV/.digenrl-verl-omni-installed"
# the requirements read from setup.py (not its entry points: scripts/test_verl_omni.sh writes those)
want="$( (python3 "$ROOT/scripts/setup_metadata.py" requirements; cat "$ROOT/constraints.txt" \
          "$ROOT/scripts/verl_omni_venv.sh") | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
  for f in "$VERL_TGZ" "$VERL_OMNI_TGZ"; do
    [[ -f "$f" ]] || { echo "verl-omni venv: $f is missing (the source archives live in ../shared/upstream/)" >&2; exit 2; }
  done
  t0=$SECONDS
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  PY="$VENV/bin/python"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -c "$ROOT/constraints.txt" "torch==2.13.0" setuptools wheel
  "$PY" -m pip install -q --no-deps --no-build-isolation "$VERL_TGZ" "$VERL_OMNI_TGZ"
  # vllm-omni 0.27.0rc1 pins accelerate==1.12.0, verl-omni a1139baf asks accelerate>=1.14.0: verl-omni's own pins do
  # not resolve together. vllm-omni goes in without its dependencies; they join the one resolution below, less that
  # accelerate pin (verl-omni's wins: this venv only imports vllm_omni).
  "$PY" -m pip install -q --no-deps "vllm-omni==0.27.0rc1"
  mapfile -t reqs < <(cd "$ROOT" && "$PY" - <<'PY'
import re
from importlib.metadata import requires

import setuptools

# setup.py's specifiers that exclude verl-omni's pins, and what admits them (the change proposed for setup.py)
PROPOSED = {"verl": "verl>=0.9.0.dev0,<0.10", "transferqueue": "TransferQueue>=0.1.8,<0.2",
            "diffusers": "diffusers>=0.38,<0.43"}
VERL_OMNI_EXTRAS = {"verl-omni": ("vllm-omni", "gpu")}  # verl-omni's extras this venv needs (vllm_omni importable)
SKIP = {"verl", "kernels", "liger-kernel", "vllm-omni"}  # installed above / GPU kernels that never run here


def name(req):
    return re.split(r"[<>=!~\[ ;@]", req, maxsplit=1)[0].lower().replace("_", "-")


captured = {}
setuptools.setup = lambda **kw: captured.update(kw)
exec(open("setup.py").read(), {})  # its own namespace (setup.py defines EXTRAS, ...)
ours = list(captured["install_requires"]) + list(captured["extras_require"]["test"])
out = [PROPOSED.get(name(r), r) for r in ours]
for dist in ("verl", "verl-omni", "vllm-omni"):
    for r in requires(dist) or []:
        spec, _, marker = r.partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)", marker)
        if extra and extra.group(1) not in VERL_OMNI_EXTRAS.get(dist, ()):
            continue
        if name(spec) in SKIP or (dist == "vllm-omni" and name(spec) == "accelerate"):
            continue
        out.append(spec.strip())
print("\n".join(out))
PY
)
  "$PY" -m pip install -q -c "$ROOT/constraints.txt" "${reqs[@]}"
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$ROOT" > "$site/digenrl_verl_src.pth"
  echo "$want" > "$STAMP"
  echo "verl-omni venv: verl $("$PY" -c 'import verl; print(verl.__version__)'), verl-omni a1139baf built in" \
       "$((SECONDS - t0)) s" >&2
fi
VERL_OMNI_PY="$VENV/bin/python"
export VERL_OMNI_PY
