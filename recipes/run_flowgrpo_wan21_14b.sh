#!/usr/bin/env bash
# Paper setting: Flow-GRPO on Wan2.1-T2V-14B (full fine-tune, bf16), 16 or 32 GPUs (NGPUS, default 16),
# DigenRL disaggregated (half generator, half trainer by default, GEN_SHARE).
# Colocated twin: run_flowgrpo_wan21_14b_colocated.sh. 480x832, 33 frames, 20 steps, SDE on the first 60%
# of the steps; the reward is a stand-in (REWARD, default jpeg_compressibility, scored per frame).
#   MODEL_PATH=/data/Wan2.1-T2V-14B-Diffusers NGPUS=32 bash recipes/run_flowgrpo_wan21_14b.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"
NGPUS="${NGPUS:-16}"; digenrl_need_ngpus "$NGPUS" 16 32
digenrl_need_model Wan2.1-T2V-14B-Diffusers
digenrl_pools "$NGPUS"
digenrl_reward "${REWARD:-jpeg_compressibility}"
exec "$VENV_PY" -m digenrl_verl.main \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.architecture=WanPipeline \
  actor_rollout_ref.model.algorithm=flow_grpo \
  actor_rollout_ref.model.lora_rank=0 \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-5 \
  actor_rollout_ref.actor.diffusion_loss.clip_ratio=1e-4 \
  actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16 \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.pipeline.height=480 \
  actor_rollout_ref.rollout.pipeline.width=832 \
  actor_rollout_ref.rollout.pipeline.num_frames=33 \
  actor_rollout_ref.rollout.pipeline.num_inference_steps=20 \
  actor_rollout_ref.rollout.pipeline.guidance_scale=5.0 \
  actor_rollout_ref.rollout.pipeline.max_sequence_length=512 \
  actor_rollout_ref.rollout.algo.sde_type=sde \
  actor_rollout_ref.rollout.algo.noise_level=0.7 \
  algorithm.timestep_fraction=0.6 \
  data.train_files="${TRAIN_FILES:-null}" \
  data.train_batch_size=$(( NGPUS / 2 )) \
  "${REWARD_OVERRIDES[@]}" \
  trainer.total_training_steps=200 \
  trainer.experiment_name="flowgrpo_wan21_14b_${MODE}_${NGPUS}gpu" \
  "${POOLS[@]}" "$@"
