#!/usr/bin/env bash
# The README's main command: a short disaggregated Flow-GRPO run on CPU with a tiny FLUX model
# (1 generator + 1 trainer worker, GAP + TSP + TAG(BTS), staleness 0, brightness reward). The package's defaults are
# verl-omni's (512 px, 10 steps, bf16, cuda); +preset=tiny_cpu (digenrl_verl/config/preset/tiny_cpu.yaml) passes the
# demo's tiny values explicitly.
# Builds the tiny model directory if missing; outputs (metrics.jsonl, trace.json, timeline.png) go to
# outputs/tiny_cpu_disaggregated/. Extra arguments are Hydra overrides.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -z "${VENV_PY:-}" ]]; then source scripts/ensure_venv.sh; fi  # a given interpreter is used as is
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 TORCH_COMPILE_DISABLE=1 MPLBACKEND=Agg
MODEL="${MODEL:-$ROOT/outputs/models/tiny_flux}"
[[ -f "$MODEL/model_index.json" ]] || "$VENV_PY" -m digenrl_verl.models.tiny FluxPipeline "$MODEL"
MODE="${MODE:-disaggregated}"
exec "$VENV_PY" -m digenrl_verl.main +preset=tiny_cpu \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.algorithm=flow_grpo \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.pipeline.num_inference_steps=6 \
  actor_rollout_ref.rollout.algo.sde_type=sde \
  actor_rollout_ref.rollout.algo.noise_level=0.7 \
  actor_rollout_ref.actor.optim.lr=3e-3 \
  data.train_batch_size=4 \
  reward.reward_functions="{brightness: 1.0}" \
  trainer.total_training_steps=20 \
  trainer.experiment_name="tiny_cpu_${MODE}" \
  trainer.logger="[console,tensorboard]" \
  trainer.digenrl.mode="$MODE" \
  trainer.digenrl.pools.colocated.workers_per_node=2 \
  trainer.digenrl.pools.generator.workers_per_node=1 \
  trainer.digenrl.pools.trainer.workers_per_node=1 \
  "$@"
