#!/usr/bin/env bash
# Paper setting: DanceGRPO on HunyuanVideo (full fine-tune, bf16), 16 or 32 GPUs (NGPUS, default 16),
# DigenRL disaggregated (half generator, half trainer by default, GEN_SHARE).
# Colocated twin: run_dancegrpo_hunyuanvideo_colocated.sh. DanceGRPO sampling: 480x480, 53 frames, 20 steps,
# dance SDE (eta 0.3) with 60% of the steps trained (a fresh permutation per sample), one initial noise per
# group. The simulator's hunyuanvideo-20-0.6 scenario models this setting. Reward: a stand-in (REWARD).
#   MODEL_PATH=/data/HunyuanVideo NGPUS=32 bash recipes/run_dancegrpo_hunyuanvideo.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"
NGPUS="${NGPUS:-16}"; digenrl_need_ngpus "$NGPUS" 16 32
digenrl_need_model HunyuanVideo
digenrl_pools "$NGPUS"
digenrl_reward "${REWARD:-jpeg_compressibility}"
exec "$VENV_PY" -m digenrl_verl.main \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.architecture=HunyuanVideoPipeline \
  actor_rollout_ref.model.algorithm=dance_grpo \
  actor_rollout_ref.model.lora_rank=0 \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-5 \
  actor_rollout_ref.actor.diffusion_loss.clip_ratio=1e-4 \
  actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16 \
  actor_rollout_ref.rollout.n=12 \
  actor_rollout_ref.rollout.pipeline.height=480 \
  actor_rollout_ref.rollout.pipeline.width=480 \
  actor_rollout_ref.rollout.pipeline.num_frames=53 \
  actor_rollout_ref.rollout.pipeline.num_inference_steps=20 \
  actor_rollout_ref.rollout.pipeline.guidance_scale=6.0 \
  actor_rollout_ref.rollout.algo.sde_type=dance_sde \
  actor_rollout_ref.rollout.algo.noise_level=0.3 \
  actor_rollout_ref.rollout.algo.init_same_noise=true \
  algorithm.timestep_fraction=0.6 \
  data.train_files="${TRAIN_FILES:-null}" \
  data.train_batch_size=$(( NGPUS / 2 )) \
  "${REWARD_OVERRIDES[@]}" \
  trainer.total_training_steps=200 \
  trainer.experiment_name="dancegrpo_hunyuanvideo_${MODE}_${NGPUS}gpu" \
  "${POOLS[@]}" "$@"
