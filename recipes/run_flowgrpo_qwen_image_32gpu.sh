#!/usr/bin/env bash
# Paper setting: Flow-GRPO on Qwen-Image (LoRA r=64, OCR reward), 32 GPUs (4 nodes x 8), DigenRL
# disaggregated: 16 generator + 16 trainer GPUs by default (GEN_SHARE; the split is ours, not the paper's).
# Colocated twin: run_flowgrpo_qwen_image_32gpu_colocated.sh. Hyper-parameters follow verl-omni's
# run_qwen_image_ocr_lora.sh (n=16, 32 prompts/step, SDE window 2 in [0,5], noise 1.2, true CFG 4).
#   MODEL_PATH=/data/Qwen-Image TRAIN_FILES=/data/ocr_train.parquet bash recipes/run_flowgrpo_qwen_image_32gpu.sh
# TRAIN_FILES: a .parquet with a `prompt` column (the OCR target is the quoted text of the prompt, or the
# row's ground_truth); the built-in prompts are used when it is unset. See _gpu_common.sh for the knobs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"
NGPUS="${NGPUS:-32}"; digenrl_need_ngpus "$NGPUS" 32
digenrl_need_model Qwen-Image
digenrl_pools "$NGPUS"
digenrl_reward "${REWARD:-ocr}"
exec "$VENV_PY" -m digenrl_verl.main \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.architecture=QwenImagePipeline \
  actor_rollout_ref.model.algorithm=flow_grpo \
  actor_rollout_ref.model.lora_rank=64 \
  actor_rollout_ref.model.lora_alpha=128 \
  'actor_rollout_ref.model.target_modules=[to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,add_v_proj,to_add_out,img_mlp.net.0.proj,img_mlp.net.2,txt_mlp.net.0.proj,txt_mlp.net.2]' \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=3e-4 \
  actor_rollout_ref.actor.optim.weight_decay=1e-4 \
  actor_rollout_ref.actor.diffusion_loss.clip_ratio=1e-5 \
  actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16 \
  actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.rollout.pipeline.height=512 \
  actor_rollout_ref.rollout.pipeline.width=512 \
  actor_rollout_ref.rollout.pipeline.num_inference_steps=10 \
  actor_rollout_ref.rollout.pipeline.true_cfg_scale=4.0 \
  actor_rollout_ref.rollout.pipeline.max_sequence_length=256 \
  actor_rollout_ref.rollout.algo.sde_type=sde \
  actor_rollout_ref.rollout.algo.noise_level=1.2 \
  actor_rollout_ref.rollout.algo.sde_window_size=2 \
  'actor_rollout_ref.rollout.algo.sde_window_range=[0,5]' \
  data.train_files="${TRAIN_FILES:-null}" \
  data.train_batch_size=32 \
  "${REWARD_OVERRIDES[@]}" \
  trainer.total_training_steps=300 \
  trainer.experiment_name="flowgrpo_qwen_image_${MODE}_${NGPUS}gpu" \
  "${POOLS[@]}" "$@"
