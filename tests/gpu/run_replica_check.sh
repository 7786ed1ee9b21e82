#!/usr/bin/env bash
# verl-omni's own rollout replica on CUDA: the verl-omni tier's replica test, unchanged, on GPUs (issue 29). On a CUDA
# host its child takes Ray's real GPUs, vLLM's and vLLM-Omni's own platforms and verl-omni's `nccl` checkpoint engine
# (tests/verl_omni/_replica_child.py); the samples through the server API must equal the in-process pipeline's and
# follow the weights sent through the checkpoint engine. Needs the verl-omni stack (verl-omni, vLLM-Omni, Ray), which
# the lent GPU image does not have yet: build it with scripts/verl_omni_venv.sh (CUDA torch), then
#   bash tests/gpu/run_replica_check.sh            # TP 1 cases (Wan2.2, Qwen-Image; one GPU) + bench rollout, ~5 min
#   bash tests/gpu/run_replica_check.sh -k tp2     # TP 2 (two GPUs)
# Not part of run_gpu_checks.sh, whose 8-minute window it would not fit beside the other checks. The in-process
# references (verl-omni's pipeline, engine `verl_omni`, CPU only) are drawn in a child with CUDA hidden
# (`cpu_references`); that child has run on CPU only.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${VERL_OMNI_PY:-$ROOT/.venv-verl-omni/bin/python}"
"$PY" -c "import torch, verl_omni, ray; assert torch.cuda.is_available(), 'no CUDA here'" || {
  echo "replica check: needs CUDA and the verl-omni stack (verl_omni, vllm_omni, ray) in $PY" >&2; exit 2; }
args=("$@"); (( ${#args[@]} )) || args=(-k tp1)
"$PY" -m pytest tests/verl_omni/test_verl_omni_replica_on_cpu.py -q -rs -s -p no:cacheprovider "${args[@]}"
# then a run's own path (rollout engine verl_omni_replica): the replica on the generator's own GPU (verl's colocated
# rollout mode on the generator's bundle, half the GPU each), a weight hand-over, its server killed and replaced;
# the JSON's last line says start-up, samples/s, hand-over and recovery seconds and `left_behind` (must be [])
"$PY" -m digenrl_verl.bench rollout --engines verl_omni_replica --rounds 2 --json
