#!/usr/bin/env bash
# Small clusters: Flow-GRPO on SD3.5-Medium (LoRA r=32), 4 or 8 GPUs on one node (NGPUS, default 4),
# DigenRL disaggregated (half generator, half trainer by default, GEN_SHARE). Colocated twin:
# run_flowgrpo_sd35_small_colocated.sh. Sampling follows verl-omni's SD3.5 OCR LoRA recipe: 384 px, 10 steps,
# no CFG, CPS steps (noise 0.8) in a window of 3 within [0,5], group size 8.
#   MODEL_PATH=/data/stable-diffusion-3.5-medium bash recipes/run_flowgrpo_sd35_small.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"
NGPUS="${NGPUS:-4}"; digenrl_need_ngpus "$NGPUS" 2 4 8
digenrl_need_model stable-diffusion-3.5-medium
digenrl_pools "$NGPUS"
digenrl_reward "${REWARD:-jpeg_compressibility}"
exec "$VENV_PY" -m digenrl_verl.main \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.architecture=StableDiffusion3Pipeline \
  actor_rollout_ref.model.algorithm=flow_grpo \
  actor_rollout_ref.model.lora_rank=32 \
  actor_rollout_ref.model.lora_alpha=64 \
  'actor_rollout_ref.model.target_modules=[to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,add_v_proj,to_add_out]' \
  actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.actor.diffusion_loss.clip_ratio=1e-5 \
  actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16 \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.seed=42 \
  actor_rollout_ref.rollout.pipeline.height=384 \
  actor_rollout_ref.rollout.pipeline.width=384 \
  actor_rollout_ref.rollout.pipeline.num_inference_steps=10 \
  actor_rollout_ref.rollout.pipeline.guidance_scale=1.0 \
  actor_rollout_ref.rollout.pipeline.max_sequence_length=256 \
  actor_rollout_ref.rollout.algo.sde_type=cps \
  actor_rollout_ref.rollout.algo.noise_level=0.8 \
  actor_rollout_ref.rollout.algo.sde_window_size=3 \
  'actor_rollout_ref.rollout.algo.sde_window_range=[0,5]' \
  data.train_files="${TRAIN_FILES:-null}" \
  data.train_batch_size=8 \
  data.seed=42 \
  "${REWARD_OVERRIDES[@]}" \
  trainer.total_training_steps=100 \
  trainer.experiment_name="flowgrpo_sd35_${MODE}_${NGPUS}gpu" \
  "${POOLS[@]}" "$@"
