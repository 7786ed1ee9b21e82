# Shared by the GPU recipes (sourced, not run). Sets VENV_PY, the environment, and the pool overrides.
#
# Knobs (environment):
#   MODEL_PATH   local diffusers directory of the model (required unless the recipe names a default)
#   MODE         disaggregated (default; DigenRL) | colocated (verl-omni's layout: the twin scripts set it)
#   NGPUS        GPUs in the job (the recipe says which values it supports)
#   GPUS_PER_NODE  GPUs per node (default 8)
#   GEN_SHARE    GPUs of the generator pool when disaggregated (default NGPUS/2; the trainer gets the rest)
#   GEN_ACCEL / TRN_ACCEL  Ray accelerator_type of the generator / trainer pool (heterogeneous clusters)
#   REWARD       the reward function name (recipes name a default; a custom file: append
#                reward.custom_reward_function.path=... and REWARD=custom)
#   ROLLOUT      generator backend: diffusers (default) | vllm_omni (verl-omni's replicas: needs verl-omni; its
#                architectures only, SD3.5, Qwen-Image and Wan2.2; never run on a GPU: see docs/verl_omni.md)
#   TRAIN_FILES  the prompts (.txt or .parquet; unset: the 8 built-in prompts, too few for a batch of more than 8)
#   DRY_RUN=1    compose, validate, print the plan and pools, start no worker (what CI runs)
# Extra arguments of a recipe are Hydra overrides appended last (they win).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -z "${VENV_PY:-}" ]]; then source scripts/ensure_venv.sh; fi
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 TORCH_COMPILE_DISABLE=1 MPLBACKEND=Agg
MODE="${MODE:-disaggregated}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
ROLLOUT="${ROLLOUT:-diffusers}"

# digenrl_pools <ngpus>: fills the POOLS array for $MODE (whole nodes of GPUS_PER_NODE, or one smaller node).
digenrl_pools() {
  local ngpus="$1" gen trn
  _pool() {  # _pool <role> <gpus> <accelerator or empty>
    local role="$1" g="$2" acc="${3:-}" nodes per
    if (( g <= GPUS_PER_NODE )); then nodes=1; per="$g"; else
      (( g % GPUS_PER_NODE == 0 )) || { echo "recipe: $role pool of $g GPUs is not whole nodes of $GPUS_PER_NODE" >&2; exit 2; }
      nodes=$(( g / GPUS_PER_NODE )); per="$GPUS_PER_NODE"; fi
    POOLS+=("trainer.digenrl.pools.$role.nnodes=$nodes" "trainer.digenrl.pools.$role.workers_per_node=$per"
            "trainer.digenrl.pools.$role.use_gpu=true")
    [[ -n "$acc" ]] && POOLS+=("trainer.digenrl.pools.$role.accelerator_type=$acc")
    return 0
  }
  # the recipes' choices where verl-omni's defaults would differ: one optimizer step per global step (verl-omni's
  # ppo_mini_batch_size=256 divides none of these batches), the run length being total_training_steps
  POOLS=("trainer.digenrl.mode=$MODE" "trainer.device=cuda" "actor_rollout_ref.rollout.name=$ROLLOUT"
         "actor_rollout_ref.actor.ppo_mini_batch_size=null" "trainer.total_epochs=1000")
  case "$MODE" in
    colocated) _pool colocated "$ngpus" "" ;;
    disaggregated)
      gen="${GEN_SHARE:-$(( ngpus / 2 ))}"; trn=$(( ngpus - gen ))
      (( gen >= 1 && trn >= 1 )) || { echo "recipe: GEN_SHARE=$gen leaves no trainer GPUs of $ngpus" >&2; exit 2; }
      _pool generator "$gen" "${GEN_ACCEL:-}"; _pool trainer "$trn" "${TRN_ACCEL:-}" ;;
    *) echo "recipe: MODE=$MODE; valid: disaggregated, colocated" >&2; exit 2 ;;
  esac
  if [[ "${DRY_RUN:-0}" == 1 ]]; then POOLS+=("trainer.digenrl.dry_run=true"); fi
}

# digenrl_need_ngpus <value> <allowed...>
digenrl_need_ngpus() {
  local v="$1"; shift
  for a in "$@"; do [[ "$v" == "$a" ]] && return 0; done
  echo "recipe: NGPUS=$v; this recipe is set up for: $*" >&2; exit 2
}

digenrl_need_model() {
  [[ -n "${MODEL_PATH:-}" ]] || { echo "recipe: set MODEL_PATH to a local diffusers directory of $1" >&2; exit 2; }
}

# digenrl_reward <name>: REWARD_OVERRIDES selecting the reward function <name> alone (custom: only the file
# given by reward.custom_reward_function.path).
digenrl_reward() {
  if [[ "$1" == custom ]]; then REWARD_OVERRIDES=("reward.reward_functions=null")
  else REWARD_OVERRIDES=("reward.reward_functions={$1: 1.0}"); fi
}
