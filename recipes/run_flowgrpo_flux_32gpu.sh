#!/usr/bin/env bash
# Paper setting: Flow-GRPO on FLUX.1-dev (LoRA r=32), 32 GPUs (4 nodes x 8), DigenRL disaggregated
# (16 generator + 16 trainer GPUs by default, GEN_SHARE). Colocated twin: run_flowgrpo_flux_32gpu_colocated.sh.
# Flow-GRPO-style sampling: 512 px, 10 steps, SDE noise level 0.7 on the first steps (timestep_fraction),
# group size 16. The reward is a stand-in (REWARD, default jpeg_compressibility); the paper's reward models
# are not shipped: give reward.custom_reward_function.path=... for yours.
#   MODEL_PATH=/data/FLUX.1-dev bash recipes/run_flowgrpo_flux_32gpu.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"
NGPUS="${NGPUS:-32}"; digenrl_need_ngpus "$NGPUS" 32
digenrl_need_model FLUX.1-dev
digenrl_pools "$NGPUS"
digenrl_reward "${REWARD:-jpeg_compressibility}"
exec "$VENV_PY" -m digenrl_verl.main \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.architecture=FluxPipeline \
  actor_rollout_ref.model.algorithm=flow_grpo \
  actor_rollout_ref.model.lora_rank=32 \
  actor_rollout_ref.model.lora_alpha=64 \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.actor.diffusion_loss.clip_ratio=1e-4 \
  actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16 \
  actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.rollout.pipeline.height=512 \
  actor_rollout_ref.rollout.pipeline.width=512 \
  actor_rollout_ref.rollout.pipeline.num_inference_steps=10 \
  actor_rollout_ref.rollout.pipeline.guidance_scale=3.5 \
  actor_rollout_ref.rollout.pipeline.max_sequence_length=512 \
  actor_rollout_ref.rollout.algo.sde_type=sde \
  actor_rollout_ref.rollout.algo.noise_level=0.7 \
  algorithm.timestep_fraction=0.6 \
  data.train_files="${TRAIN_FILES:-null}" \
  data.train_batch_size=32 \
  "${REWARD_OVERRIDES[@]}" \
  trainer.total_training_steps=300 \
  trainer.experiment_name="flowgrpo_flux_${MODE}_${NGPUS}gpu" \
  "${POOLS[@]}" "$@"
