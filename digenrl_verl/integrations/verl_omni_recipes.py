"""verl-omni's main recipes as data: their Hydra override lists, transcribed, and how they map onto ours.

Source: the three example scripts of verl-project/verl-omni at commit a1139baf (full hash
a1139bafffb5b9711f0a6b6edff8ecaa60bfff30), *read*, not run. Only their override lists are transcribed, as the
shell passes them with the scripts' GPU defaults substituted for their variables; `{model}` stands for the
model directory, `{reward_dir}` for a directory holding the recipe's custom reward file (verl-omni's own
files need a served VLM or the HPSv3 model: tests use stand-ins with the same names) and `{data_dir}` for
the directory of train.parquet / test.parquet. The lists are kept whole, including the keys of features
digenrl_verl does not implement, so that tests can show both halves of the contract:

* with `trainer.digenrl.mode=disaggregated` appended (the one flag) the list composes against our entry point
  unchanged, and every key in `blockers` fails with a message naming it;
* with the `blockers` switched to the value given here, the recipe validates (dry run), and with `tiny`
  appended as well it runs one real step on CPU with a tiny model directory.

`blockers` are of two kinds: what cannot run here (the reward model's Hugging Face id, not in the local cache;
verl-omni's v1 trainer selection; the vLLM-Omni backend on a machine without CUDA, a real run's blocker only: a dry
run plans it for the cluster and says so), and batch layouts our schedule cannot express (a micro-batch smaller than
one prompt group's share per trainer rank). Their ``ppo_mini_batch_size`` at half the batch (two optimizer steps per
global step) and their validation settings (``trainer.test_freq``, ``rollout.val_kwargs``) are run as they set them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

A = "actor_rollout_ref"
#: a custom reward file with verl-omni's reward signature (`.format(name=...)`): mean intensity in [0, 1], the stand-in
#: for a recipe's `reward_files` in tiny runs (verl-omni's own need a served VLM or the HPSv3 model)
STAND_IN_REWARD = '''
def {name}(data_source=None, solution_image=None, ground_truth=None, extra_info=None, **kwargs):
    """Stand-in with verl-omni's reward signature: mean intensity in [0, 1]."""
    return float(solution_image.float().mean() / 255.0)
'''


@dataclass(frozen=True)
class VerlOmniRecipe:
    """One verl-omni example script.

    Attributes:
        name: short name used by tests and docs.
        source: the script's path in verl-omni (at VERL_OMNI_COMMIT).
        architecture: the diffusers `_class_name` of the model it trains.
        overrides: the script's override list (keys in full, `{model}` / `{reward_dir}` placeholders).
        reward_files: custom reward files the list names: file name → function name.
        blockers: key → value that switches it off (see the module docstring).
        tiny: overrides that shrink the run to one CPU step on a tiny model, and its validation to 2 prompts
            at the tiny rollout's steps.
    """

    name: str
    source: str
    architecture: str
    overrides: tuple[str, ...]
    reward_files: Mapping[str, str] = field(default_factory=dict)
    blockers: Mapping[str, str] = field(default_factory=dict)
    tiny: tuple[str, ...] = ()

    def render(self, model: str, reward_dir: str = ".", data_dir: str = ".", *,
               switch_off: Sequence[str] | bool = (), extra: Sequence[str] = ()) -> list[str]:
        """The override list with placeholders filled; `switch_off`: blocker keys (True = all) replaced in place
        by their value from `blockers`; `extra` appended (a key already present is replaced in place)."""
        keys = list(self.blockers) if switch_off is True else list(switch_off or ())
        unknown = [k for k in keys if k not in self.blockers]
        if unknown:
            raise KeyError(f"{self.name}: {unknown} are not blockers of this recipe; blockers: {sorted(self.blockers)}")
        out = [o.replace("{model}", str(model)).replace("{reward_dir}", str(reward_dir))
               .replace("{data_dir}", str(data_dir)) for o in self.overrides]
        for k in keys:
            out = _set(out, f"{k}={self.blockers[k]}")
        for o in extra:
            out = _set(out, o)
        return out


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _set(overrides: list[str], new: str) -> list[str]:
    """Replace the override of `new`'s key in place, or append it."""
    k = _key(new)
    hits = [i for i, o in enumerate(overrides) if _key(o) == k]
    if not hits:
        return [*overrides, new]
    out = list(overrides)
    out[hits[0]] = new
    return out


_TINY = ("data.train_batch_size=2", f"{A}.actor.ppo_mini_batch_size=2", f"{A}.actor.ppo_micro_batch_size_per_gpu=2",
         # verl-omni's log-prob passes cut a rank's samples into micro-batches of exactly this size (its recipes' 8-32
         # divide their GPU batches, not the 4 samples here)
         f"{A}.rollout.log_prob_micro_batch_size_per_gpu=2", f"{A}.ref.log_prob_micro_batch_size_per_gpu=2",
         f"{A}.rollout.n=2", f"{A}.rollout.pipeline.num_inference_steps=6", f"{A}.rollout.pipeline.height=32",
         f"{A}.rollout.pipeline.width=32", f"{A}.rollout.pipeline.max_sequence_length=16",
         "trainer.total_training_steps=1", "trainer.logger=[console]",
         "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=2",  # pools derived: 1 + 1 CPU workers
         f"{A}.rollout.nnodes=0",
         # tiny validation too: every recipe validates at its last step (test_freq > 0), with val_kwargs' 28-50 steps
         # over data.val_files (all of it, or 32 prompts): 2 prompts at the training's 6 steps
         "data.val_max_samples=2", f"{A}.rollout.val_kwargs.pipeline.num_inference_steps=6")
_USER_TEMPLATE = ("\"{% for message in messages %}{% if message['role'] == 'user' %}{{ message['content'] }}"
                  "{% endif %}{% endfor %}\"")

_WAN_TEMPLATE = (r'actor_rollout_ref.model.custom_chat_template="{% if messages %}{% for message in messages %}'
                 r'{% if message[\"role\"] == \"user\" %}{{ message[\"content\"] }}{% endif %}{% endfor %}'
                 r'{% endif %}</s>"')

QWEN_IMAGE_OCR_LORA = VerlOmniRecipe(
    name="qwen_image_flowgrpo_lora",
    source="examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh",
    architecture="QwenImagePipeline",
    overrides=(
        "data.train_files={data_dir}/train.parquet", "data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=32", "data.max_prompt_length=256",
        f"{A}.model.algorithm=flow_grpo", f"{A}.model.path={{model}}", f"{A}.model.lora_rank=64",
        f"{A}.model.lora_alpha=128",
        f"{A}.model.target_modules=['to_q','to_k','to_v','to_out.0','add_q_proj','add_k_proj','add_v_proj',"
        "'to_add_out','img_mlp.net.0.proj','img_mlp.net.2','txt_mlp.net.0.proj','txt_mlp.net.2']",
        f"{A}.actor.optim.lr=3e-4", f"{A}.actor.optim.weight_decay=0.0001", f"{A}.actor.ppo_mini_batch_size=16",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=16", f"{A}.actor.diffusion_loss.clip_ratio=1e-5",
        f"{A}.actor.fsdp_config.param_offload=True", f"{A}.actor.fsdp_config.optimizer_offload=True",
        f"{A}.actor.fsdp_config.model_dtype=bfloat16",
        f"{A}.rollout.log_prob_micro_batch_size_per_gpu=32", f"{A}.rollout.tensor_model_parallel_size=1",
        f"{A}.rollout.name=vllm_omni", f"{A}.rollout.n=16", f"{A}.rollout.agent.num_workers=4",
        f"{A}.rollout.load_format=safetensors", f"{A}.rollout.layered_summon=True",
        f"{A}.rollout.pipeline.true_cfg_scale=4.0", f"{A}.rollout.pipeline.max_sequence_length=256",
        f"{A}.rollout.algo.noise_level=1.2", f"{A}.rollout.algo.sde_type=sde", f"{A}.rollout.algo.sde_window_size=2",
        f"{A}.rollout.algo.sde_window_range=[0,5]", f"{A}.rollout.val_kwargs.pipeline.num_inference_steps=50",
        f"{A}.rollout.val_kwargs.algo.noise_level=0.0",
        f"+{A}.rollout.engine_kwargs.vllm_omni.max_num_seqs=8",
        f"+{A}.rollout.engine_kwargs.vllm_omni.request_batch_max_wait_ms=10",
        f"{A}.ref.log_prob_micro_batch_size_per_gpu=32",
        "reward.num_workers=1", "reward.reward_model.enable=True",
        "reward.reward_model.model_path=Qwen/Qwen3-VL-8B-Instruct", "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.rollout.tensor_model_parallel_size=4",
        "reward.custom_reward_function.path={reward_dir}/genrm_ocr.py",
        "reward.custom_reward_function.name=compute_score_ocr",
        "trainer.logger=[\"console\", \"wandb\"]", "trainer.project_name=flow_grpo",
        "trainer.experiment_name=qwen_image_ocr_lora", "trainer.log_val_generations=8",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=4", "trainer.nnodes=1", "trainer.save_freq=30", "trainer.test_freq=30",
        "trainer.total_epochs=15", "trainer.total_training_steps=300",
    ),
    reward_files={"genrm_ocr.py": "compute_score_ocr"},
    blockers={
        f"{A}.rollout.name": "diffusers",
        "reward.reward_model.enable": "False",
    },
    tiny=_TINY,
)

SD35_OCR_LORA_SEPARATE_ASYNC = VerlOmniRecipe(
    name="sd35_flowgrpo_lora_v1_separate_async",
    source="examples/flowgrpo_trainer/sd35/run_sd35_medium_ocr_lora_v1_separate_async.sh",
    architecture="StableDiffusion3Pipeline",
    overrides=(
        "data.train_files={data_dir}/train.parquet", "data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=8", "data.val_max_samples=32", "data.max_prompt_length=512", "data.truncation=error",
        "data.seed=42",
        f"{A}.model.algorithm=flow_grpo", f"{A}.actor.diffusion_loss.clip_ratio=1e-5", f"{A}.model.path={{model}}",
        f"{A}.model.custom_chat_template={_USER_TEMPLATE}",
        f"{A}.model.extra_tokenizers={{clip: {{path: tokenizer, max_length: 77}}, "
        f"t5: {{path: tokenizer_3, max_length: 256}}}}",
        f"{A}.model.attn_backend=native", f"{A}.rollout.rollout_attn_backend=TORCH_SDPA",
        f"{A}.model.lora_rank=32", f"{A}.model.lora_alpha=64",
        f"{A}.model.target_modules=['to_q','to_k','to_v','to_out.0','add_q_proj','add_k_proj','add_v_proj','to_add_out']",
        f"{A}.actor.optim.lr=1e-4", f"{A}.actor.optim.weight_decay=0.0001", f"{A}.actor.ppo_mini_batch_size=8",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=8", f"{A}.actor.use_kl_loss=False", f"{A}.actor.kl_loss_coef=0.0",
        f"{A}.actor.fsdp_config.param_offload=False", f"{A}.actor.fsdp_config.optimizer_offload=False",
        f"{A}.actor.fsdp_config.model_dtype=bfloat16", f"{A}.actor.strategy=fsdp2",
        f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=1",
        f"{A}.rollout.log_prob_micro_batch_size_per_gpu=8", f"{A}.rollout.tensor_model_parallel_size=1",
        f"{A}.rollout.name=vllm_omni", f"{A}.rollout.mode=async", f"{A}.rollout.calculate_log_probs=True",
        f"{A}.rollout.n=8", f"{A}.rollout.seed=42", f"{A}.rollout.nnodes=1", f"{A}.rollout.n_gpus_per_node=2",
        f"{A}.rollout.checkpoint_engine.backend=nccl", f"{A}.rollout.agent.num_workers=2",
        f"{A}.rollout.load_format=safetensors",
        f"{A}.rollout.pipeline.height=384", f"{A}.rollout.pipeline.width=384",
        f"{A}.rollout.pipeline.num_inference_steps=10", f"{A}.rollout.pipeline.guidance_scale=1.0",
        f"{A}.rollout.pipeline.max_sequence_length=256", f"{A}.rollout.max_prompt_embed_length=333",
        f"{A}.rollout.algo.noise_level=0.8", f"{A}.rollout.algo.sde_type=cps", f"{A}.rollout.algo.sde_window_size=3",
        f"{A}.rollout.algo.sde_window_range=[0,5]",
        f"+{A}.rollout.engine_kwargs.vllm_omni.max_num_seqs=256",
        f"{A}.rollout.val_kwargs.pipeline.num_inference_steps=28", f"{A}.rollout.val_kwargs.algo.noise_level=0.0",
        f"{A}.ref.log_prob_micro_batch_size_per_gpu=8",
        "reward.num_workers=1", "reward.reward_model.enable=True",
        "reward.reward_model.model_path=Qwen/Qwen2.5-VL-3B-Instruct", "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.enable_resource_pool=True", "reward.reward_model.nnodes=1",
        "reward.reward_model.n_gpus_per_node=1", "reward.reward_model.rollout.gpu_memory_utilization=0.9",
        "reward.reward_model.rollout.free_cache_engine=False",
        "reward.reward_model.rollout.tensor_model_parallel_size=1",
        "reward.reward_model.rollout.enforce_eager=False",
        "reward.custom_reward_function.path={reward_dir}/genrm_ocr.py",
        "reward.custom_reward_function.name=compute_score_ocr",
        "trainer.logger=[\"console\", \"wandb\"]", "trainer.project_name=flow_grpo",
        "trainer.experiment_name=sd35_medium_ocr_lora_v1_separate_async", "trainer.log_val_generations=8",
        "trainer.val_before_train=False", "trainer.n_gpus_per_node=2", "trainer.nnodes=1", "trainer.save_freq=100",
        "trainer.test_freq=20", "trainer.total_epochs=15", "trainer.total_training_steps=100",
        "trainer.use_v1=true", "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.num_warmup_batches=0",
        "trainer.v1.separate_async.parameter_sync_step=1", "trainer.v1.separate_async.sync_compatible=1",
        "trainer.v1.sampler.max_off_policy_threshold=1", "trainer.v1.sampler.max_off_policy_strategy=drop",
    ),
    reward_files={"genrm_ocr.py": "compute_score_ocr"},
    blockers={
        f"{A}.rollout.name": "diffusers",
        "reward.reward_model.enable": "False",
        "trainer.use_v1": "false",
    },
    tiny=_TINY,
)

WAN22_DANCEGRPO = VerlOmniRecipe(
    name="wan22_dancegrpo",
    source="examples/dancegrpo_trainer/wan22/run_wan22_5b_t2v_hpsv3_auto.sh",
    architecture="WanPipeline",
    overrides=(
        "trainer.device=gpu", "algorithm.adv_estimator=dance_grpo", f"{A}.model.algorithm=dance_grpo",
        f"{A}.actor.diffusion_loss.loss_mode=dance_grpo",
        "data.train_files={data_dir}/train.parquet", "data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=64", "data.max_prompt_length=1024", "data.seed=42",
        f"{A}.model.path={{model}}", f"{A}.model.attn_backend=native",
        _WAN_TEMPLATE,
        f"{A}.actor.optim.lr=1e-5", f"{A}.actor.optim.weight_decay=0.0001", f"{A}.actor.ppo_mini_batch_size=16",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=4",
        f"{A}.actor.fsdp_config.param_offload=True", f"{A}.actor.fsdp_config.optimizer_offload=True",
        f"{A}.actor.fsdp_config.model_dtype=bfloat16", f"{A}.actor.fsdp_config.wrap_policy.min_num_params=10000",
        f"{A}.rollout.log_prob_micro_batch_size_per_gpu=16", f"{A}.rollout.tensor_model_parallel_size=1",
        f"{A}.rollout.name=vllm_omni", f"{A}.rollout.n=8", f"{A}.rollout.seed=42", f"{A}.rollout.agent.num_workers=8",
        f"{A}.rollout.rollout_attn_backend=TORCH_SDPA", f"{A}.rollout.load_format=safetensors",
        f"{A}.rollout.layered_summon=True",
        f"{A}.rollout.pipeline.true_cfg_scale=5.0", f"{A}.rollout.pipeline.height=704",
        f"{A}.rollout.pipeline.width=1280",
        f"{A}.rollout.pipeline.num_frames=8", f"{A}.rollout.pipeline.num_inference_steps=10",
        f"{A}.rollout.pipeline.guidance_scale=5.0", f"{A}.rollout.pipeline.max_sequence_length=1024",
        f"{A}.rollout.algo.noise_level=1.2", f"{A}.rollout.algo.sde_type=dance_sde",
        f"{A}.rollout.algo.sde_window_size=2", f"{A}.rollout.algo.sde_window_range=[0,5]",
        f"{A}.rollout.val_kwargs.pipeline.num_inference_steps=50", f"{A}.rollout.val_kwargs.algo.noise_level=0.0",
        f"{A}.ref.log_prob_micro_batch_size_per_gpu=16",
        "reward.num_workers=1", "reward.reward_model.enable=False",
        "reward.custom_reward_function.path={reward_dir}/hpsv3_reward.py",
        "reward.custom_reward_function.name=compute_score_hpsv3",
        "trainer.logger=[\"console\", \"tensorboard\"]", "trainer.project_name=dance_grpo",
        "trainer.experiment_name=wan22_5b_t2v_hpsv3_gpu", "trainer.log_val_generations=8",
        "trainer.val_before_train=True", "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=30",
        "trainer.test_freq=30", "trainer.total_epochs=15", "trainer.total_training_steps=120",
    ),
    reward_files={"hpsv3_reward.py": "compute_score_hpsv3"},
    blockers={
        f"{A}.rollout.name": "diffusers",
    },
    tiny=(*_TINY, f"{A}.rollout.pipeline.num_frames=5"),
)

RECIPES: dict[str, VerlOmniRecipe] = {r.name: r for r in (QWEN_IMAGE_OCR_LORA, SD35_OCR_LORA_SEPARATE_ASYNC,
                                                          WAN22_DANCEGRPO)}

#: The one flag that switches a recipe to DigenRL.
DIGENRL_FLAG = "trainer.digenrl.mode=disaggregated"
