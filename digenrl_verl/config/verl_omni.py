"""The verl-omni adapter: verl-omni's key layout → the plugin's typed component configs.

This module and its reward half (`config.verl_omni_reward`) are the one place that knows verl-omni's key names.
Every key of the shipped config (`digenrl_trainer.yaml`, verl-omni's layout) is in exactly one of three classes:

* implemented: read by one of the builders here or in `config.verl_omni_reward` (`RecipeKeys` records every read);
* `NO_EFFECT`: accepted so verl-omni recipes parse; a value other than the shipped default warns, naming the key
  and the reason (nothing is ignored silently);
* `UNSUPPORTED`: accepted so recipes parse; enabling the feature fails before any worker starts, naming the key
  and what to do instead.

`tests/trainer/test_trainer_key_classes_on_cpu.py` checks that the three classes cover every key of the shipped
config and that each no-effect key warns.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import warnings
from dataclasses import asdict, dataclass, replace
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Union

from huggingface_hub import constants as hf_constants
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from omegaconf import DictConfig, ListConfig, OmegaConf

from digenrl_verl.config.digenrl import SECTION, DigenRLConfig, PoolConfig, PoolsConfig
from digenrl_verl.config.runtime import CheckpointSpec, DataSpec, LoggingSpec, ValidationSpec
from digenrl_verl.diffusion.advantages import AdvantageConfig
from digenrl_verl.diffusion.loss import LossConfig
from digenrl_verl.diffusion.rollout import RolloutConfig
from digenrl_verl.diffusion.selection import auto_selection
from digenrl_verl.engines.base import ENGINES, VERL_OMNI, VERL_OMNI_REPLICA, VLLM_OMNI
from digenrl_verl.engines.spec import REPLICAS_KEY
from digenrl_verl.errors import ConfigError
from digenrl_verl.models.config import LoraConfig, PipelineConfig
from digenrl_verl.models.lora import AdapterLoraConfig, read_lora_adapter
from digenrl_verl.models.registry import get_adapter_class, read_model_index
from digenrl_verl.schedule.config import verl_cut_keeps_groups
from digenrl_verl.config.prompt_files import prompt_reader_decision
from digenrl_verl.workers.sharding import STRATEGIES, STRATEGY_KEY, ShardingSpec
from digenrl_verl.workers.specs import OptimSpec, PolicySpec, RolloutEngineSpec, TrainSpec

ALGORITHMS = ("flow_grpo", "dance_grpo")
CONFIG_FILE = "digenrl_trainer.yaml"
VERL_OMNI_KEYS_FILE = "verl_omni_keys.yaml"  # verl-omni's keys that we do not use (composed under CONFIG_FILE)
A = "actor_rollout_ref"
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16", "float32": "float32",
          "fp16": "float16", "float16": "float16"}
# verl-omni pipeline keys that PipelineConfig does not take (classified below)
VERL_OMNI_PIPELINE_KEYS = ("frame_rate", "video_flow_shift", "aspect_ratio", "output_type")
_BACKENDS_OK = ("naive", "nccl")  # our weight sync is a torch.distributed group (gloo on CPU, NCCL on GPU)
_PIXEL_OUTPUTS = ("image", "video", "pil", "np", "pt")
DEVICES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}  # trainer.device -> the workers' torch device
# verl-omni's resource layout: trainer GPUs per node x nodes, and standalone rollout nodes (0 = none)
# the `trainer.digenrl.pools.<role>` settings that size or place a pool: any of them given -> the layout is not derived
POOL_SIZING = ("nnodes", "workers_per_node", "use_gpu", "accelerator_type", "custom_resource", "gpu_fraction")
LAYOUT_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node", f"{A}.rollout.nnodes", f"{A}.rollout.n_gpus_per_node")
# verl-omni's engine config group (`diffusion/model_engine=<name>` in its recipes): registered in Hydra's ConfigStore
# so that the override composes on our entry point; each option only sets the `model_engine` key (classified below).
MODEL_ENGINE_GROUP = "diffusion/model_engine"
MODEL_ENGINES = ("dp_diffusion", "veomni_diffusion")


def _register_model_engines() -> None:
    from hydra.core.config_store import ConfigStore

    for name in MODEL_ENGINES:
        ConfigStore.instance().store(group=MODEL_ENGINE_GROUP, name=name, node={"model_engine": name},
                                     package="_global_")


_register_model_engines()


#: `RecipeKeys`' default: a key absent from the config reads as the shipped config files' value (defaults are written
#: once, in the files; a key deleted with `~key` falls back to it too).
SHIPPED = object()
_ABSENT = object()


class RecipeKeys:
    """Read access to a composed config by verl-omni key; records every key read (`read`)."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.read: set[str] = set()
        self.decisions: list[str] = []  # what the builders decided for the user (printed by the dry run's plan)
        self.used: dict[str, Any] = {}  # keys whose value the run uses differs from the config's (`use`)

    def __call__(self, key: str, default: Any = SHIPPED) -> Any:
        self.read.add(key)
        return self.peek(key, default)

    def peek(self, key: str, default: Any = SHIPPED) -> Any:
        """The value of `key`, not recorded as read (the key classes' own checks); when the config lacks `key`,
        `default`, by default the shipped files' value (None when they lack it too)."""
        value = OmegaConf.select(self.cfg, key, default=_ABSENT)
        if value is _ABSENT and default is SHIPPED:  # the shipped value, its `${...}` resolved in this config
            # (a key the shipped files lack too is None without the merge, which costs ~0.07 s a call)
            shipped = OmegaConf.select(shipped_defaults(), key, default=_ABSENT, throw_on_resolution_failure=False)
            value = None if shipped is _ABSENT else OmegaConf.select(OmegaConf.merge(shipped_defaults(), self.cfg),
                                                                     key, default=None)
        elif value is _ABSENT:
            value = default
        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
        return value

    def number(self, key: str, default: Any = SHIPPED) -> float:
        """The value of `key` as a float; ValueError naming the key when it is missing or not a number."""
        value = self(key, default)
        try:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}={value!r} must be a number") from None

    def integer(self, key: str, default: Any = SHIPPED) -> int:
        """The value of `key` as an int; ValueError naming the key when it is missing or not a whole number."""
        value = self(key, default)
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key}={value!r} must be an integer")
        return value

    def numbers(self, key: str, default: Any = SHIPPED) -> tuple[float, ...]:
        """The value of `key` as a tuple of floats; ValueError naming the key otherwise."""
        value = self(key, default)
        try:
            if isinstance(value, (str, bytes)) or any(isinstance(v, bool) for v in value):
                raise TypeError
            return tuple(float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}={value!r} must be a list of numbers, e.g. [0.9, 0.999]") from None

    def decide(self, text: str) -> None:
        """Record a decision taken for the user (a fall-back, a coercion, a derived value); the plan prints it."""
        self.decisions.append(text)

    def use(self, key: str, value: Any, why: str) -> Any:
        """Record that the run uses `value` for `key` (the config's value, e.g. null, means it), as a decision
        that says how to repeat it; returns `value`."""
        self.used[key] = value
        self.decide(f"{key}={self.peek(key)!r}: {why}; this run uses {value!r} (set {key}={value!r} to repeat it)")
        return value

    def resolved(self) -> dict[str, Any]:
        """Every key a builder read, as flat dotted names, with the value the run uses (`used` over the config's)."""
        out: dict[str, Any] = {}
        for key in sorted(self.read):
            value = self.peek(key)
            if isinstance(value, dict) and value:
                out.update({f"{key}.{k}": v for k, v in _flat(value).items()})
            else:
                out[key] = value
        out.update(self.used)
        return out

    def section(self, prefix: str, names: tuple[str, ...]) -> dict[str, Any]:
        """The keys `prefix.<name>` that are set (not None), as a dict name → value."""
        values = {name: self(f"{prefix}.{name}") for name in names}
        return {k: v for k, v in values.items() if v is not None}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


#: why a null seed is drawn: verl-omni samples unseeded then (rollout.seed) and shuffles unseeded (data.seed)
NULL_SEED = "unseeded, as in verl-omni: a seed was drawn at start"


def drawn_seed() -> int:
    """A fresh seed for a key left null (verl-omni draws unseeded noise / an unseeded shuffle then)."""
    return secrets.randbelow(2**31)


# ---------------------------------------------------------------------------------------------------------
# Keys accepted so recipes parse, whose features are not implemented: ON → ValueError. The rule tells when the
# feature is ON: a value (ON when equal), "!value" (ON when different), or a predicate (value, keys) -> bool.
# ---------------------------------------------------------------------------------------------------------
Rule = Union[Any, Callable[[Any, RecipeKeys], bool]]


def _algorithm_mismatch(value: Any, keys: RecipeKeys) -> bool:
    return value not in ALGORITHMS and value != keys(f"{A}.model.algorithm")


UNSUPPORTED: dict[str, tuple[Rule, str]] = {
    f"{A}.actor.ppo_epochs": ("!1", "only ppo_epochs=1 is supported (one pass over each step's samples)"),
    f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size": (
        "!1", "Ulysses sequence parallelism is not supported; set it to 1"),
    "algorithm.trainer_type": ("!policy_gradient", "only trainer_type=policy_gradient is supported"),
    "algorithm.sample_source": ("!online", "only online sampling is supported"),
    "algorithm.adv_estimator": (_algorithm_mismatch,
                                f"only the group-relative estimators {list(ALGORITHMS)} are implemented"),
    f"{A}.actor.diffusion_loss.loss_mode": (_algorithm_mismatch,
                                            f"only the clipped Flow-GRPO/DanceGRPO loss {list(ALGORITHMS)} is "
                                            "implemented"),
    "trainer.use_v1": (True, "verl-omni's v1 trainer selection does not apply: select DigenRL with "
                       "trainer.digenrl.mode=disaggregated on this entry point (or trainer.v1.trainer_mode=digenrl "
                       "on verl-omni's entry point, see digenrl_verl.integrations.verl_omni)"),
    "trainer.device": (lambda v, keys: v not in DEVICES,
                       f"valid devices: {sorted(DEVICES)} (gpu = cuda); set trainer.device=cuda or cpu"),
    f"{A}.rollout.tensor_model_parallel_size": (
        "!1", "tensor-parallel generation runs in verl-omni's vLLM-Omni rollout replicas (vLLMOmniReplica, one "
        "replica over that many GPUs), which DigenRL's generator pool does not start yet: its generators hold a "
        "whole model per rank (diffusers; or verl-omni's rollout pipeline in-process on CPU); set it to 1"),
    f"{A}.rollout.data_parallel_size": ("!1", "generation is data parallel over trainer.digenrl.pools.generator; "
                                        "set it to 1"),
    f"{A}.rollout.nnodes": (
        lambda v, keys: isinstance(v, int) and v > 0 and keys("trainer.digenrl.mode") != "disaggregated",
        "standalone rollout nodes are verl-omni's separate layout: set trainer.digenrl.mode=disaggregated and size "
        "trainer.digenrl.pools.generator / .trainer"),
    f"{A}.rollout.checkpoint_engine.backend": (
        lambda v, keys: v not in _BACKENDS_OK, f"weights sync through our process group; valid: {list(_BACKENDS_OK)}"),
    f"{A}.rollout.checkpoint_engine.custom_backend_module": (
        lambda v, keys: v is not None, "custom checkpoint-engine backends are not supported; set it to null"),
    f"{A}.rollout.pipeline.video_flow_shift": (
        lambda v, keys: v is not None, "the flow shift comes from the model's scheduler_config.json; set it to null "
        "(or edit the scheduler config of the model directory)"),
    f"{A}.rollout.pipeline.aspect_ratio": (
        lambda v, keys: v is not None, f"give {A}.rollout.pipeline.height/width instead"),
    f"{A}.rollout.pipeline.output_type": (
        lambda v, keys: v not in _PIXEL_OUTPUTS,
        "hands the reward latents instead of pixels (verl-omni's latent reward models, e.g. the SD3.5 DRM recipe); "
        "DigenRL's scoring queue receives decoded samples only, so a latent reward path is what is missing; valid: "
        f"{list(_PIXEL_OUTPUTS)}"),
    "data.filter_overlong_prompts": (
        True, "dropping the prompts whose chat-rendered ids exceed data.max_prompt_length (verl's RLHFDataset) is not "
        "implemented; set data.filter_overlong_prompts=false (verl-omni's default and its diffusion recipes'): "
        f"long prompts are then cut at {A}.rollout.pipeline.max_sequence_length tokens"),
}

# Keys accepted with no effect here: a value other than the shipped default warns once per run.
_CHAT_PROMPTS = ("chat prompts become their user turns' text under the pipeline's own template (trainer.data."
                 "chat_text), which equals verl-omni's rendering for its recipes (docs/verl_omni.md, Prompts and "
                 "data_source); a template or its kwargs are not applied")
NO_EFFECT: dict[str, str] = {
    f"{A}.actor.fsdp_config.param_offload": "parameter CPU offload is not implemented",
    f"{A}.actor.fsdp_config.optimizer_offload": "optimizer CPU offload is not implemented",
    f"{A}.rollout.layered_summon": "weights reach the generators through the trainer → generator process group, "
                                   "not vLLM's layered summon",
    f"{A}.rollout.algo.sde_contiguous": "the trained steps are given by the timestep selection "
                                        f"({A}.rollout.algo.timestep_selection / sde_window_size), contiguous or not",
    f"{A}.actor.loss_scale_factor": "the loss is the mean over a step's trained rows; no extra scale is applied",
    "algorithm.adv_mode": "advantages are the group-normalised rewards (continuous); no other mode is implemented",
    f"{A}.rollout.calculate_log_probs": "rollout log-probs are always recorded (they are the old log-probs unless "
                                        f"{A}.rollout.recompute_old_log_probs=true)",
    "algorithm.old_policy_update_interval": "the old policy is the sampling policy of each trajectory (updated "
                                            "every step)",
    "algorithm.old_policy_decay_schedule": "the old policy is the sampling policy of each trajectory (copy)",
    f"{A}.actor.shuffle": "mini-batches (ppo_mini_batch_size) are cut as verl's default shuffle=false cuts them "
                          "(each trainer rank's share of the batch in contiguous blocks of prompt groups); "
                          "micro-batches are prompt groups in schedule order",
    f"{A}.rollout.gpu_memory_utilization": "vLLM memory settings apply to the vLLM-Omni engine only through "
                                           f"{A}.rollout.engine_kwargs.vllm_omni",
    f"{A}.rollout.free_cache_engine": "generators keep their engine resident (disaggregated: nothing to free)",
    f"{A}.rollout.mode": "generation is driven by the schedule, one task per micro-batch",
    f"{A}.rollout.step_execution": "generation is driven by the schedule, one task per micro-batch",
    f"{A}.rollout.load_format": "generator weights come from the model directory, then from the trainer",
    f"{A}.rollout.rollout_attn_backend": "attention uses the diffusers default of the model",
    f"{A}.model.attn_backend": "attention uses the diffusers default of the model",
    f"{A}.rollout.max_prompt_embed_length": f"the text length is {A}.rollout.pipeline.max_sequence_length",
    f"{A}.ref.log_prob_micro_batch_size_per_gpu": "the KL reference's forward runs inside each update pass, on the "
                                                  "same rows as the policy's (a micro-batch, chunked by "
                                                  "trainer.digenrl.tsp.chunk_size)",
    f"{A}.rollout.agent.num_workers": "there is no agent loop: generators are driven by the schedule",
    **{f"{A}.rollout.val_kwargs.pipeline.{k}": f"validation samples take the rollout's {k} ({A}.rollout.pipeline."
       f"{k}); of val_kwargs.pipeline only num_inference_steps applies" for k in (
        "height", "width", "true_cfg_scale", "max_sequence_length", "guidance_scale", "num_frames", "frame_rate",
        "video_flow_shift", "aspect_ratio")},
    **{f"{A}.rollout.val_kwargs.algo.{k}": f"validation samples take the rollout's SDE window ({A}.rollout.algo.*); "
       "of val_kwargs.algo only noise_level and sde_type apply" for k in (
        "sde_window_size", "sde_window_range", "sde_contiguous")},
    f"{A}.rollout.checkpoint_engine.update_weights_bucket_megabytes": "weights are sent tensor by tensor over the "
                                                                      "trainer → generator process group",
    f"{A}.rollout.checkpoint_engine.engine_kwargs": "weights sync through our process group",
    f"{A}.rollout.pipeline.frame_rate": "videos are scored as tensors; the frame rate is container metadata",
    f"{A}.hybrid_engine": "the layout is trainer.digenrl.mode (colocated or disaggregated)",
    f"{A}.nccl_timeout": "collective timeouts follow trainer.digenrl.task_timeout_s",
    f"{A}.model.model_type": "the model type is read from model_index.json",
    f"{A}.model.tokenizer_path": "the pipeline's own tokenizers are used",
    f"{A}.model.extra_tokenizers": "the pipeline's own tokenizers are used",
    f"{A}.model.custom_chat_template": _CHAT_PROMPTS,
    f"{A}.model.external_lib": "models are diffusers pipelines of the registered architectures",
    f"{A}.model.transformer_subfolder": "the denoiser is the pipeline's transformer component",
    f"{A}.model.enable_gradient_checkpointing": "activation checkpointing is not implemented; use "
                                                "trainer.digenrl.tsp.chunk_size to bound activation memory",
    f"{A}.actor.rollout_correction": "verl-omni's rollout correction is not implemented",
    "data.val_batch_size": "the validation prompts are sampled in one pass, dealt round-robin over the trainer "
                           "ranks",
    "data.train_max_samples": "every prompt of data.train_files is used",
    "data.max_prompt_length": f"verl's agent loop left-truncates the rendered prompt ids to it ({A}.rollout."
                              "prompt_length), with a warning; here each text encoder's pipeline cuts its ids at "
                              f"{A}.rollout.pipeline.max_sequence_length (the pipeline's own truncation)",
    "data.max_response_length": "diffusion samples have no response length",
    "data.truncation": "verl's RLHFDataset stores it and never reads it (no effect in verl-omni either); prompts are "
                       f"cut at {A}.rollout.pipeline.max_sequence_length tokens by the pipeline",
    "data.return_raw_chat": "chat prompts become their user text",
    "data.tokenizer": "the pipeline's own tokenizers are used",
    "data.apply_chat_template_kwargs": _CHAT_PROMPTS,
    "data.custom_cls": "prompts come from .txt or verl-style .parquet files",
    "reward.num_workers": "the reward runs on the generators (one scorer per generator rank)",
    "reward.reward_manager": "rewards are composed by reward.reward_functions / reward.custom_reward_function",
    **{f"reward.reward_model.rollout.{k}": "an engine setting of verl's reward-model rollout that the VLM judge does "
       "not pass to vLLM (it sets model, dtype, tensor_parallel_size, gpu_memory_utilization, enforce_eager, "
       "max_model_len, max_num_seqs, max_num_batched_tokens)" for k in (
        "profiler", "cudagraph_capture_sizes", "data_parallel_size", "expert_parallel_size",
        "pipeline_model_parallel_size", "load_format", "layered_summon", "scheduling_policy", "multi_stage_wake_up",
        "engine_kwargs", "enable_chunked_prefill", "enable_prefix_caching", "disable_log_stats", "skip_tokenizer_init",
        "quantization", "quantization_config_file", "mtp", "disaggregation")},
    **{f"reward.reward_model.rollout.{k}": "the judge's sampling is verl-omni's genrm_ocr request (temperature 0.7, "
       "top_p 0.8, 4096 tokens; GENRM_OCR_* environment overrides), which overrides the server's" for k in (
        "temperature", "top_k", "top_p", "do_sample", "n", "ignore_eos")},
    "reward.reward_model.rollout.limit_images": "each request of the judge holds one image (genrm_ocr's chat)",
    "reward.reward_model.rollout.free_cache_engine": "the judge stays resident (its own pool, replicas colocated on "
                                                     "the worker pools' devices, or the scoring worker's process): "
                                                     "nothing is freed between steps",
    "trainer.log_val_generations": "validation samples are scored, not logged as images",
    "trainer.v1": "verl-omni's v1 trainer modes do not apply (trainer.digenrl.mode selects the layout)",
    "trainer.trainer_class": "selects an external trainer on verl-omni's entry points (patches/verl-omni-a1139baf; "
                             "trainer.trainer_class=digenrl hands the run to this package); this entry point is "
                             "DigenRL's own",
}

# ---------------------------------------------------------------------------------------------------------
# The rest of verl-omni's config (verl_omni_keys.yaml: its keys that we do not use, with its default values), so
# that every verl-omni key is known. Mostly whole sections (a prefix covers every key below it).
# ---------------------------------------------------------------------------------------------------------
_LLM_ENGINE = "an LLM-engine setting of verl's rollout config; diffusion generation does not use it"
_PROFILER = "profiling is not implemented; the run's timeline is trace.json (Perfetto) and timeline.png"
_VEOMNI = "VeOmni engine settings; the trainer is FSDP2/ddp over torch (diffusion/model_engine=veomni_diffusion fails)"
_MIRROR = ("verl-omni's model-side copy of the rollout's {}: the adapters read "
           + f"{A}.rollout." + "{} (set it there)")
_NO_DUMPS = "samples are not dumped to files; the run's trace and metrics are in trainer.digenrl.output_dir"

UNSUPPORTED.update({
    "model_engine": ("!dp_diffusion", "verl-omni's VeOmni engine is not implemented: the trainer is FSDP2 or ddp "
                     f"({STRATEGY_KEY}); drop diffusion/model_engine=veomni_diffusion (and its veomni_config keys)"),
    "distillation.enabled": (True, "on-policy distillation from teacher models is not implemented; set it to false"),
    f"{A}.actor.use_distill_loss": (True, "distillation losses are not implemented; set it to false"),
    "algorithm.paired_preference": (True, "preference (DPO-style) training is not implemented; set it to false"),
    "algorithm.rollout_correction.rollout_is": (
        lambda v, keys: v is not None, "rollout importance sampling (rollout correction) is not implemented; set it "
        "to null"),
    "algorithm.rollout_correction.rollout_rs": (
        lambda v, keys: v is not None, "rollout rejection sampling (rollout correction) is not implemented; set it "
        "to null"),
    "algorithm.rollout_correction.loss_type": ("!ppo_clip", "only the clipped (ppo_clip) loss is implemented"),
    f"{A}.actor.optim.optimizer": (lambda v, keys: str(v).lower() != "adamw",
                                   "the optimizer is torch's AdamW (actor.optim.lr/betas/eps/weight_decay)"),
    f"{A}.actor.optim.optimizer_impl": ("!torch.optim", "the optimizer is torch.optim.AdamW"),
    f"{A}.actor.optim.override_optimizer_config": (
        lambda v, keys: bool(v), "optimizer overrides are not supported: set actor.optim.lr/betas/eps/weight_decay"),
    f"{A}.model.target_parameters": (
        lambda v, keys: v is not None,
        "LoRA on parameters is not supported: give model.target_modules; set it to null"),
    f"{A}.rollout.quantization": (lambda v, keys: v is not None,
                                  "quantized generation is not implemented; set it to null"),
    f"{A}.rollout.multi_turn.enable": (True, "multi-turn rollouts do not apply to diffusion generation"),
    "skip.rollout.enable": (True, "replaying dumped rollouts is not implemented: generation runs every step"),
    "skip.async_rollout.enable": (True, "replaying dumped rollouts is not implemented: generation runs every step"),
    "trainer.val_only": (True, "validation runs are not implemented"),
})

NO_EFFECT.update({
    "global_profiler": _PROFILER,
    f"{A}.actor.profiler": _PROFILER,
    f"{A}.ref.profiler": _PROFILER,
    f"{A}.rollout.profiler": _PROFILER,
    f"{A}.actor.veomni_config": _VEOMNI,
    f"{A}.ref.veomni_config": _VEOMNI,
    "transfer_queue": "batches move through Ray's object store (TransferQueue is not used)",
    "ray_kwargs": "Ray is started by the entry point with the pools' resources (trainer.digenrl.pools)",
    "skip": "generation runs every step (nothing is dumped or replayed)",
    "distillation": "on-policy distillation is not implemented (distillation.enabled=true fails)",
    f"{A}.actor.distill_loss_mode": "distillation losses are not implemented",
    f"{A}.actor.distill_loss_coef": "distillation losses are not implemented",
    f"{A}.actor.diffusion_loss.mix_beta": "MixGRPO's setting; the loss is Flow-GRPO/DanceGRPO's",
    f"{A}.actor.diffusion_loss.ref_kl_coef": "the KL term is actor.use_kl_loss / kl_loss_coef",
    f"{A}.actor.diffusion_loss.adaptive_weight_min": "DiffusionNFT's setting; the loss is Flow-GRPO/DanceGRPO's",
    f"{A}.actor.diffusion_loss.dpo_beta": "DPO's setting; the loss is Flow-GRPO/DanceGRPO's",
    f"{A}.actor.diffusion_loss.kl_mask_threshold": "GRPO-Guard's setting; the loss is Flow-GRPO/DanceGRPO's",
    f"{A}.actor.diffusion_loss.add_kl_coefficient": "GRPO-Guard's setting; the loss is Flow-GRPO/DanceGRPO's",
    f"{A}.actor.optim.total_training_steps": "the schedule's length is the run's (trainer.total_training_steps, or "
                                             "the epochs' steps), as verl-omni's trainer sets this key",
    f"{A}.actor.optim.clip_grad": f"the gradient-norm clip is {A}.actor.grad_clip",
    f"{A}.actor.optim.lr_min": f"a Megatron optimizer setting; the cosine schedule's floor is {A}.actor.optim."
                               "min_lr_ratio",
    f"{A}.actor.optim.lr_start": "no learning-rate schedule is implemented: the learning rate is constant",
    f"{A}.actor.optim.lr_decay_ratio": "no learning-rate schedule is implemented: the learning rate is constant",
    f"{A}.actor.optim.fused": "the optimizer is torch's AdamW with its default implementation",
    f"{A}.ref.optim": "the KL reference is not trained (VeOmni's reference optimizer section)",
    f"{A}.actor.fsdp_config.offload_policy": "CPU offload is not implemented",
    f"{A}.actor.fsdp_config.forward_prefetch": "FSDP2 prefetching follows torch's defaults",
    f"{A}.actor.fsdp_config.use_orig_params": "FSDP2 (fully_shard) always keeps the original parameters",
    f"{A}.actor.fsdp_config.seed": "seeds come from rollout.seed and data.seed",
    f"{A}.actor.fsdp_config.full_determinism": "deterministic algorithms are not forced",
    f"{A}.actor.fsdp_config.forward_only": "the trainer trains (the KL reference's forward is in its update pass)",
    f"{A}.actor.fsdp_config.strategy": f"the sharding is {STRATEGY_KEY}",
    f"{A}.actor.fsdp_config.dtype": f"the trainer's dtype is {A}.actor.fsdp_config.model_dtype",
    f"{A}.actor.checkpoint": "a checkpoint always holds the trainable weights, the optimizer and the data cursor "
                             "(trainer.save_freq, trainer.default_local_dir)",
    f"{A}.actor.data_loader_seed": "the prompt order follows data.seed",
    f"{A}.ref.rollout_n": f"the group size is {A}.rollout.n",
    f"{A}.ref.strategy": f"the KL reference is the trainer's model with the adapters off ({STRATEGY_KEY})",
    f"{A}.ref.fsdp_config": "the KL reference's forward runs inside the trainer's update pass, with its sharding",
    **{f"{A}.rollout.{k}": _LLM_ENGINE for k in (
        "prompt_length", "enforce_eager", "cudagraph_capture_sizes", "expert_parallel_size",
        "pipeline_model_parallel_size", "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill",
        "enable_prefix_caching", "logprobs_mode", "scheduling_policy", "disable_log_stats", "llm_calculate_log_probs",
        "temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens", "skip_tokenizer_init",
        "enable_rollout_routing_replay", "mtp", "multi_turn", "disaggregation", "prometheus")},
    f"{A}.rollout.max_num_seqs": f"vLLM-Omni's batching is {A}.rollout.engine_kwargs.vllm_omni.max_num_seqs",
    f"{A}.rollout.external_lib": "models are diffusers pipelines of the registered architectures",
    f"{A}.rollout.rollout_adapter": "the rollout adapter is chosen by the architecture (model_index.json)",
    f"{A}.rollout.agent.default_agent_loop": "there is no agent loop: generators are driven by the schedule",
    f"{A}.rollout.algo.sample_strategy": "MixGRPO's setting; the trained steps follow rollout.algo / "
                                         "algorithm.timestep_fraction",
    f"{A}.rollout.algo.iters_per_group": "MixGRPO's setting",
    f"{A}.rollout.algo.sde_window_seed": "the SDE window is drawn from the per-sample seeds (rollout.seed)",
    f"{A}.model.pipeline": _MIRROR.format("pipeline", "pipeline"),
    f"{A}.model.algo": _MIRROR.format("algo", "algo"),
    f"{A}.model.use_shm": "models load from the local directory model.path",
    f"{A}.model.trust_remote_code": "models are diffusers pipelines of the registered architectures (no remote code)",
    f"{A}.model.config_path": "the model's configs are read from model.path",
    f"{A}.model.policy_state_adapters": "the trainable state is the LoRA adapters or the denoiser (model.lora_rank)",
    f"{A}.model.lora_dtype": f"LoRA parameters take {A}.actor.fsdp_config.model_dtype",
    f"{A}.model.mtp": _LLM_ENGINE,
    "data.trust_remote_code": "prompts come from .txt or verl-style .parquet files (no remote code)",
    **{f"data.{k}": "prompts are read as text from data.prompt_key" for k in (
        "use_shm", "tool_config_path", "return_raw_input_ids", "return_full_prompt", "image_patch_size", "image_key",
        "video_key", "return_multi_modal_inputs", "filter_overlong_prompts_workers", "datagen")},
    "data.validation_shuffle": "validation uses the first data.val_max_samples prompts of data.val_files, in "
                               "file order",
    "data.sampler": "the prompt order follows data.shuffle and data.seed",
    "reward.sandbox_fusion": "code-execution rewards do not apply to diffusion samples",
    "algorithm.old_policy_decay": "the old policy is the sampling policy of each trajectory (copy)",
    "algorithm.rollout_correction": "verl-omni's rollout correction is not implemented",
    **{f"trainer.{k}": _NO_DUMPS for k in ("rollout_data_dir", "validation_data_dir", "rollout_data_save_freq",
                                           "rollout_data_max_samples", "validation_data_max_samples", "video_fps")},
    "trainer.esi_redundant_time": "checkpoints follow trainer.save_freq",
    "trainer.default_hdfs_dir": "checkpoints are written to trainer.default_local_dir only",
    "trainer.del_local_ckpt_after_load": "checkpoints are kept (trainer.max_actor_ckpt_to_keep)",
    "trainer.ray_wait_register_center_timeout": "workers are Ray actors started by the entry point",
    "trainer.ray_master_port_range": "the process groups pick free ports",
})

# ---------------------------------------------------------------------------------------------------------
# The shipped defaults are verl-omni's (a1139baf, its composed diffusion_trainer config) for every key the two share,
# except the few below, where the plugin cannot follow: key -> (verl-omni's value, why). A run that leaves such a key
# at the shipped default is told so in its plan (`differences`); tests/verl_omni holds every other shared default to
# verl-omni's composed config, key by key, and this table's values to verl-omni's. Resolution, steps, dtypes, device,
# run length, LR, weight decay, LoRA targets, seeds and advantage normalisation are never on it.
# ---------------------------------------------------------------------------------------------------------
NOT_VERL_OMNI_DEFAULTS: dict[str, tuple[Any, str]] = {
    f"{A}.model.path": ("~/models/Qwen/Qwen-Image", "a run names its model directory (required here)"),
    "data.train_files": ("~/data/rlhf/gsm8k/train.parquet", "verl's GSM8K example file is no prompt set for a "
                         "diffusion model; null = the package's built-in prompts"),
    "data.val_files": ("~/data/rlhf/gsm8k/test.parquet", "null = the training prompts"),
    f"{A}.rollout.name": ("???", "verl-omni requires it (its scripts set vllm_omni: verl-omni's rollout, which needs "
                          "verl-omni installed); the default here is the package's diffusers generator, which runs on "
                          "CPU and GPU"),
    f"{A}.rollout.tensor_model_parallel_size": (2, "each generator rank holds a whole model: tensor-parallel "
                                                "generation comes with verl-omni's rollout replicas (not yet used)"),
    f"{A}.rollout.pipeline.video_flow_shift": (12.0, "the flow shift is the model's scheduler_config.json value; "
                                               "verl-omni applies 12.0 in its Wan pipelines"),
}


#: keys whose shipped default differs from verl-omni's in form only, the same meaning: key -> (ours, verl-omni's)
SAME_MEANING: dict[str, tuple[Any, Any]] = {
    "reward.reward_functions": (None, {}),  # no reward function given (a struct {} would take no names from Hydra)
}


def differences(keys: RecipeKeys) -> list[str]:
    """`key=ours (verl-omni: theirs): why` for each NOT_VERL_OMNI_DEFAULTS key left at the shipped default."""
    return [f"{key}={keys.peek(key)!r} (verl-omni: {theirs!r}): {why}"
            for key, (theirs, why) in NOT_VERL_OMNI_DEFAULTS.items() if not changed_keys(keys, (key,))]


def leaf_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """The dotted keys of every leaf of a config tree (an empty section counts as a leaf; verl-omni's `_target_`
    dataclass bindings are not settings and are left out)."""
    out: list[str] = []
    for key in node.keys():
        child = node._get_node(key)
        path = f"{prefix}{key}"
        if isinstance(child, DictConfig) and len(child) > 0:
            out += leaf_keys(child, path + ".")
        elif key != "_target_":
            out.append(path)
    return out


def covered_by(key: str, classes: set[str]) -> bool:
    """True if `key` or one of its parent sections is in `classes` (a section entry classifies all its keys)."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in classes for i in range(1, len(parts) + 1))


def _is_on(rule: Rule, value: Any, keys: RecipeKeys) -> bool:
    if callable(rule):
        return bool(rule(value, keys))
    if isinstance(rule, str) and rule.startswith("!"):
        return value != rule[1:] and str(value) != rule[1:]
    return value == rule


#: Keys verl-omni's own actor worker reads when it trains (`trainer.digenrl.trainer_engine=verl_omni`): the UNSUPPORTED
#: and NO_EFFECT entries under them are verl-omni's business then, not refused or warned here. Prefixes of dotted keys.
HOST_TRAINER_KEYS = (
    f"{A}.actor.fsdp_config.", f"{A}.actor.optim.", f"{A}.actor.checkpoint", f"{A}.actor.veomni_config",
    f"{A}.actor.loss_scale_factor", "model_engine", f"{A}.model.enable_gradient_checkpointing",
    f"{A}.model.attn_backend", f"{A}.model.lora_dtype", f"{A}.model.transformer_subfolder",
    f"{A}.actor.diffusion_loss.",
)
#: verl-omni's losses that need only old log-probs, advantages and old SDE means (what this path delivers)
_HOST_LOSSES = ("flow_grpo", "dance_grpo", "grpo_guard", "flow_dppo")
#: of those, what the accumulating worker cannot serve yet (still refused, naming why)
HOST_TRAINER_LIMITS: dict[str, tuple[Rule, str]] = {
    f"{A}.actor.diffusion_loss.loss_mode": (
        lambda v, keys: str(v) not in _HOST_LOSSES,
        f"the generators deliver old log-probs, advantages and (recomputed) old SDE means, which verl-omni's losses "
        f"{list(_HOST_LOSSES)} take; the others need reference / teacher outputs or another engine (DiffusionNFT, "
        "DPO)"),
}
def host_reads(key: str) -> bool:
    """`key` is read by verl-omni's actor worker when it trains (HOST_TRAINER_KEYS)."""
    return any(key == p or key.startswith(p) for p in HOST_TRAINER_KEYS)


def unsupported_on(keys: RecipeKeys, trainer_engine: str = "digenrl") -> list[tuple[str, Any, str]]:
    """(key, value, why) for every UNSUPPORTED key whose feature is on; with `trainer_engine` ``verl_omni`` the keys
    verl-omni's actor worker reads are its (HOST_TRAINER_KEYS) but for HOST_TRAINER_LIMITS."""
    host = trainer_engine == "verl_omni"
    rules = {k: r for k, r in UNSUPPORTED.items() if not (host and host_reads(k))}
    found = []
    for key, (rule, why) in {**rules, **(HOST_TRAINER_LIMITS if host else {})}.items():
        value = keys.peek(key)
        if value is not None and _is_on(rule, value, keys):
            found.append((key, value, why))
    return found


def check_unsupported(keys: RecipeKeys, trainer_engine: str = "digenrl") -> None:
    """ValueError naming every UNSUPPORTED key whose feature is on (one line each), so a recipe learns all its
    blockers at once."""
    found = unsupported_on(keys, trainer_engine)
    if found:
        raise ValueError("\n".join(f"{key}={value!r} is not supported by digenrl_verl: {why}"
                                    for key, value, why in found))


@lru_cache(maxsize=1)
def shipped_defaults() -> DictConfig:
    """The shipped config files as written (verl-omni's layout: VERL_OMNI_KEYS_FILE under CONFIG_FILE, as the
    defaults list composes them; the trainer.digenrl section comes from Python)."""
    files = resources.files("digenrl_verl.config")
    merged = OmegaConf.merge(*(OmegaConf.create(files.joinpath(f).read_text())
                               for f in (VERL_OMNI_KEYS_FILE, CONFIG_FILE)))
    merged.pop("defaults", None)
    return merged


def _unresolved(cfg: DictConfig, key: str) -> Any:
    """The value at `key` as written (interpolations unresolved, containers as plain Python), None when absent."""
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None, throw_on_resolution_failure=False) if parent else cfg
    if not isinstance(node, DictConfig) or last not in node.keys():
        return None
    child = node._get_node(last)
    if isinstance(child, (DictConfig, ListConfig)):
        return OmegaConf.to_container(child, resolve=False)
    return child._value()


def warn_no_effect(keys: RecipeKeys, trainer_engine: str = "digenrl") -> list[str]:
    """A UserWarning for each NO_EFFECT key set to something other than the shipped default; returns the keys. With
    `trainer_engine` ``verl_omni`` the keys verl-omni's actor worker reads (HOST_TRAINER_KEYS) are not warned: they
    take effect there, so they are recorded as read (`record_host_keys`: the plan shows them)."""
    if trainer_engine == "verl_omni":
        record_host_keys(keys)
    warned = []
    for key, why in NO_EFFECT.items():
        if trainer_engine == "verl_omni" and host_reads(key):
            continue
        default = _unresolved(shipped_defaults(), key)  # as written: a copy of another key (${...}) stays a copy
        if _unresolved(keys.cfg, key) != default:
            value = keys.peek(key)
            warnings.warn(f"{key}={value!r} has no effect in digenrl_verl: {why}", UserWarning, stacklevel=3)
            warned.append(key)
    return warned


def record_host_keys(keys: RecipeKeys) -> list[str]:
    """Record as read every key of the config that verl-omni's actor worker reads when it trains (HOST_TRAINER_KEYS:
    `actor.fsdp_config.param_offload`, `optimizer_offload`, its optimizer, checkpoint and loss keys, ...), so that
    `resolved` and plan.json show each key that takes effect, whoever reads it. Returns the keys."""
    found = [key for key in leaf_keys(keys.cfg) if host_reads(key)]
    for key in found:
        keys(key)
    return found


def unknown_keys(keys: RecipeKeys) -> list[str]:
    """The keys of the config that no builder read and that neither our shipped config nor verl-omni's has (every
    shipped key is read, no-effect or unsupported, as tests/trainer/test_trainer_key_classes_on_cpu.py checks): keys
    added with `+key=...` that nothing reads. Complete only after every builder ran (`keys.read`)."""
    known = keys.read | set(leaf_keys(shipped_defaults())) | set(NO_EFFECT) | set(UNSUPPORTED)
    return [key for key in leaf_keys(keys.cfg) if not covered_by(key, known)]


def warn_unknown(keys: RecipeKeys) -> list[str]:
    """A UserWarning for each of `unknown_keys`, with the valid keys of its section; the plan lists them too."""
    found = unknown_keys(keys)
    for key in found:
        parent = key.rpartition(".")[0]
        section = OmegaConf.select(shipped_defaults(), parent, default=None) if parent else shipped_defaults()
        valid = f"; valid keys under {parent}: {sorted(section.keys())}" if isinstance(section, DictConfig) else ""
        warnings.warn(f"{key}={keys.peek(key)!r} has no effect: neither digenrl_verl nor verl-omni has this key "
                      f"(added with '+'?), nothing reads it; check its spelling{valid}", UserWarning, stacklevel=3)
        keys.decide(f"{key}: not a key of digenrl_verl or verl-omni, no effect (warned)")
    return found


# ---------------------------------------------------------------------------------------------------------
# Builders: one per component, each reading only its keys.
# ---------------------------------------------------------------------------------------------------------


def build_digenrl(keys: RecipeKeys) -> DigenRLConfig:
    """`trainer.digenrl.*` (typed, see `config.digenrl`); warns about TAG/TCSS settings that colocated mode ignores."""
    keys.read.add("trainer.digenrl")
    digenrl = DigenRLConfig.from_node(keys.cfg.trainer.digenrl)
    for path in digenrl.inert_in_colocated:
        warnings.warn(f"trainer.digenrl.{path} has no effect in trainer.digenrl.mode=colocated (colocated ranks "
                      "generate the whole batch, then update it: GAP, pipelining, TAG and TCSS need a separate "
                      "trainer pool)", UserWarning, stacklevel=3)
        keys.decide(f"trainer.digenrl.{path}: no effect in trainer.digenrl.mode=colocated (warned)")
    return digenrl


def split_layout(mode: str, *, use_gpu: bool, nnodes: int, per_node: int, rollout_nnodes: int = 0,
                 rollout_per_node: int | None = None) -> PoolsConfig:
    """The pools of verl-omni's resource layout (the one rule both entry points use).

    verl-omni sizes the actor GPUs with `trainer.nnodes x trainer.n_gpus_per_node` and standalone rollout GPUs with
    `actor_rollout_ref.rollout.nnodes x rollout.n_gpus_per_node` (0 nodes: none). Colocated: one pool of every
    device. Disaggregated: the generator pool is the standalone rollout nodes when there are any; else half of the
    trainer nodes (several nodes: whole nodes, rounded down) or half of one node's devices (rounded down, at least
    1) generate and the rest train. `use_gpu`: one GPU per worker, else CPU worker processes."""
    def pool(nodes: int, per: int) -> PoolConfig:
        return PoolConfig(nnodes=nodes, workers_per_node=per, use_gpu=use_gpu)

    rollout_per = rollout_per_node or per_node
    if mode == "colocated":
        if rollout_nnodes > 0 and rollout_per != per_node:
            raise ValueError(f"colocated: trainer.n_gpus_per_node={per_node} and {A}.rollout.n_gpus_per_node="
                             f"{rollout_per} differ; one pool needs equal nodes")
        return PoolsConfig(colocated=pool(nnodes + rollout_nnodes, per_node))
    if rollout_nnodes > 0:
        return PoolsConfig(generator=pool(rollout_nnodes, rollout_per), trainer=pool(nnodes, per_node))
    total = nnodes * per_node
    if total < 2:
        unit = "GPUs" if use_gpu else "CPU workers"
        raise ValueError(f"trainer.digenrl.mode=disaggregated needs at least 2 {unit} (trainer.nnodes x "
                         f"trainer.n_gpus_per_node = {total}) or standalone rollout nodes ({A}.rollout.nnodes > 0); "
                         "raise trainer.n_gpus_per_node, or give trainer.digenrl.pools.generator / .trainer")
    if nnodes > 1:
        gen_nodes = nnodes // 2
        return PoolsConfig(generator=pool(gen_nodes, per_node), trainer=pool(nnodes - gen_nodes, per_node))
    gen = max(1, per_node // 2)
    return PoolsConfig(generator=pool(1, gen), trainer=pool(1, per_node - gen))


def pools_from_layout(cfg: Any, mode: str) -> dict[str, dict[str, Any]]:
    """`trainer.digenrl.pools` (plain dicts per role of `mode`) from a config in verl-omni's layout (a DictConfig or
    a nested mapping; a missing key takes verl-omni's default: cuda, one node of 8 GPUs). See `split_layout`."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))

    def sel(key: str, default: Any) -> Any:
        value = OmegaConf.select(node, key, default=None)
        return default if value is None else value

    per = int(sel("trainer.n_gpus_per_node", 8))
    pools = split_layout(mode, use_gpu=str(sel("trainer.device", "cuda")) != "cpu",
                         nnodes=int(sel("trainer.nnodes", 1)), per_node=per,
                         rollout_nnodes=int(sel(f"{A}.rollout.nnodes", 0)),
                         rollout_per_node=int(sel(f"{A}.rollout.n_gpus_per_node", per)))
    roles = ("colocated",) if mode == "colocated" else ("generator", "trainer")
    return {role: asdict(pools[role]) for role in roles}


def build_layout(keys: RecipeKeys, digenrl: DigenRLConfig) -> DigenRLConfig:
    """The section with its pools: as given in `trainer.digenrl.pools` (then verl-omni's layout keys have no effect,
    and a changed one warns), else derived from verl-omni's layout (`split_layout`) on `trainer.device`."""
    device = keys("trainer.device")
    layout = {key: keys(key) for key in LAYOUT_KEYS}
    changed = changed_keys(keys, LAYOUT_KEYS)
    if _pools_given(digenrl.pools):
        for key in changed:
            warnings.warn(f"{key}={layout[key]!r} has no effect in digenrl_verl: trainer.digenrl.pools is given and "
                          "sizes the pools (drop trainer.digenrl.pools.* to derive them from verl-omni's layout)",
                          UserWarning, stacklevel=3)
        _check_cpu_workers(digenrl, "trainer.digenrl.pools", "shrink pools.*.workers_per_node")
        keys.decide("pools: as given in trainer.digenrl.pools"
                    + (f" ({', '.join(changed)} not used)" if changed else ""))
        return digenrl
    counts = {key: at_least(key, layout[key], low=1 if key.startswith("trainer.") else 0)
              for key in LAYOUT_KEYS if layout[key] is not None}
    use_gpu = DEVICES.get(device) == "cuda"
    pools = split_layout(digenrl.mode, use_gpu=use_gpu, nnodes=counts["trainer.nnodes"],
                         per_node=counts["trainer.n_gpus_per_node"],
                         rollout_nnodes=counts.get(f"{A}.rollout.nnodes", 0),
                         rollout_per_node=counts.get(f"{A}.rollout.n_gpus_per_node"))
    derived = replace(digenrl, pools=PoolsConfig(**{  # a pool's other settings (not its size) stay as given
        role: replace(digenrl.pools[role], **{f: getattr(pools[role], f) for f in ("nnodes", "workers_per_node",
                                                                                  "use_gpu")})
        for role in ("colocated", "generator", "trainer")}))
    unit = "GPU(s)" if use_gpu else "CPU worker process(es)"
    sources = " x ".join(f"{key}={counts[key]}" for key in ("trainer.nnodes", "trainer.n_gpus_per_node"))
    if counts.get(f"{A}.rollout.nnodes"):
        sources += f", {A}.rollout.nnodes={counts[f'{A}.rollout.nnodes']} (standalone rollout nodes)"
    split = " + ".join(f"{role} {pools[role].size}" for role in derived.roles)
    note = f"pools: {split} {unit}, from {sources} on trainer.device={device}"
    if not use_gpu and not changed_keys(keys, ("trainer.device",)) and (
            changed or counts["trainer.nnodes"] * counts["trainer.n_gpus_per_node"] > PoolsConfig().colocated.size):
        note += (" (trainer.device=cpu is this plugin's default, verl-omni's is cuda: the layout's GPUs became CPU "
                 "worker processes; set trainer.device=cuda to train on GPUs)")
    keys.decide(note + "; trainer.digenrl.pools.<role> sets them directly")
    _check_cpu_workers(derived, f"{sources} on trainer.device={device}",
                       "set trainer.device=cuda to run on GPUs, lower trainer.n_gpus_per_node, or give "
                       "trainer.digenrl.pools.<role>.workers_per_node")
    return derived


def _pools_given(pools: PoolsConfig) -> bool:
    """True when `trainer.digenrl.pools` sizes or places a pool (any of those settings differs from the default)."""
    default = PoolsConfig()
    return any(getattr(pools[role], f) != getattr(default[role], f) for role in ("colocated", "generator", "trainer")
               for f in POOL_SIZING)


def at_least(key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key}={value!r} must be an integer >= {low}")
    return value


def changed_keys(keys: RecipeKeys, names: tuple[str, ...]) -> list[str]:
    """The keys of `names` whose value differs from the shipped default (set by the user or the recipe)."""
    return [key for key in names if _unresolved(keys.cfg, key) != _unresolved(shipped_defaults(), key)]


def _check_cpu_workers(digenrl: DigenRLConfig, source: str, fix: str) -> None:
    pools = [digenrl.pools[r] for r in digenrl.roles]
    if not any(p.use_gpu for p in pools):
        check_cpu_processes(sum(p.size for p in pools), source, fix)


def cpu_process_limit() -> int:
    """The most CPU worker processes a run may start on this machine: max(4 x cores, 8) (more would thrash it)."""
    return max(4 * (os.cpu_count() or 1), 8)


def check_cpu_processes(total: int, source: str, fix: str) -> None:
    """At most `cpu_process_limit()` CPU worker processes on this machine."""
    limit = cpu_process_limit()
    if total > limit:
        raise ValueError(f"{source}: {total} CPU worker processes on a machine with {os.cpu_count()} cores (limit "
                         f"{limit}); {fix}")


def plan_for_cluster(keys: RecipeKeys, setting: str, what: str, why: str) -> None:
    """A dry run with a backend this machine cannot run (`why`): planned for the cluster, warned, a decision line."""
    note = (f"{setting}: this machine cannot run {what} ({why}); the dry run plans for the cluster, a real run here "
            "stops before any worker starts")
    keys.decide(note)
    warnings.warn(note, UserWarning, stacklevel=4)


@dataclass(frozen=True)
class ModelChoice:
    """The model directory, its architecture (`model_index.json` `_class_name`) and the RL algorithm."""

    path: str
    architecture: str
    algorithm: str


def build_model(keys: RecipeKeys) -> ModelChoice:
    algorithm = keys(f"{A}.model.algorithm")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown {A}.model.algorithm={algorithm!r}; valid choices: {list(ALGORITHMS)}")
    path = keys(f"{A}.model.path")
    if path is None or path == "???":
        raise ValueError(f"{A}.model.path is not set: give a local diffusers model directory (build a tiny one with "
                         "`python -m digenrl_verl.models.tiny FluxPipeline <dir>`)")
    path = resolve_model_path(keys, str(path))
    try:
        architecture = read_model_index(path)["_class_name"]  # ValueError naming the key if not a diffusers directory
    except ValueError as e:
        raise ValueError(f"{e}. {MISSING_FOR_NON_DIFFUSERS}") from None
    want = keys(f"{A}.model.architecture")
    if want is not None and want != architecture:
        raise ValueError(f"{A}.model.architecture={want!r} but {path}/model_index.json names {architecture!r}; drop "
                         f"the key or point model.path at a {want} directory")
    try:
        get_adapter_class(architecture)  # lists the valid architectures on a miss
    except ValueError as e:
        raise ValueError(f"{e}. {MISSING_FOR_NEW_ARCHITECTURE}") from None
    return ModelChoice(str(path), architecture, algorithm)


#: what stands between verl-omni's models without a package adapter and a DigenRL run (the precise missing pieces)
MISSING_FOR_NEW_ARCHITECTURE = (
    "verl-omni may train it (its training adapter) and sample it (its rollout pipeline: LTX-2, Qwen-Image-Edit, ...), "
    "but DigenRL's trainer-side batch (prompt conditioning, validation and TAG samples) comes from this package's "
    "adapter of the architecture (digenrl_verl.models), which is what is missing (an image-conditioned family such "
    "as Qwen-Image-Edit also needs the prompts' images in the generators' requests)")
MISSING_FOR_NON_DIFFUSERS = (
    "Models without a diffusers layout (BAGEL: verl-omni's OmniBagelForConditionalGeneration) run in verl-omni only "
    "through its vLLM-Omni rollout replicas on GPUs, which DigenRL's generator pool does not start yet, and have no "
    "adapter in this package: both are missing")


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_path(keys: RecipeKeys, path: str) -> str:
    """A Hugging Face model id (`Qwen/Qwen-Image`) → its snapshot in the local Hugging Face cache, the way verl-omni
    resolves one (`huggingface_hub.snapshot_download`), but without downloading before any worker starts: not
    cached → ValueError naming the key and how to fetch it. A local path is returned as given (`~` expanded)."""
    local = Path(path).expanduser()
    if local.exists() or not _REPO_ID.match(path):
        return str(local) if local.exists() else path
    try:
        snapshot = snapshot_download(repo_id=path, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError) as e:
        raise ValueError(f"{A}.model.path={path!r} is neither a local directory nor a model in the local Hugging Face "
                         f"cache ({hf_constants.HF_HUB_CACHE}; {type(e).__name__}); fetch it first with `hf download "
                         f"{path}` (or `huggingface-cli download {path}`), or point the key at a local diffusers "
                         "directory") from None
    keys.decide(f"{A}.model.path={path!r}: the Hugging Face model id resolved to its local cache snapshot {snapshot}")
    return snapshot


@dataclass(frozen=True)
class Shape:
    """The step batch: `prompts` per step x `n` samples each, `total_steps` global steps; `micro_batch_size`: the
    colocated plan's samples per rank per micro-batch (`ppo_micro_batch_size_per_gpu`; None: a rank's whole share,
    and always None for disaggregated runs, whose micro-batch is one prompt group)."""

    prompts: int
    n: int
    total_steps: int
    micro_batch_size: int | None = None
    mini_batches: int = 1


def _mini_batches(keys: RecipeKeys, prompts: int) -> int:
    """Optimizer steps per global step: data.train_batch_size / ppo_mini_batch_size (both in prompts, as verl's)."""
    mini = keys(f"{A}.actor.ppo_mini_batch_size")
    if mini is None:
        return 1
    if isinstance(mini, bool) or not isinstance(mini, int) or mini < 1 or mini > prompts or prompts % mini:
        raise ValueError(f"{A}.actor.ppo_mini_batch_size={mini!r} must divide data.train_batch_size={prompts} (prompts "
                         "per optimizer step; each optimizer step takes the same number of whole prompt groups): set "
                         f"it to a divisor of {prompts}, or null (one optimizer step per global step)")
    return prompts // mini


def run_length(keys: RecipeKeys, prompts: int, dataset_prompts: int) -> int:
    """Global steps, as verl-omni counts them: `trainer.total_epochs` x the steps of an epoch (its dataloader drops
    the last partial batch: `dataset_prompts // data.train_batch_size`), or `trainer.total_training_steps` when set
    (verl-omni stops at the last epoch's end too, so at most the epochs' steps)."""
    epochs = keys.integer("trainer.total_epochs")
    total = keys("trainer.total_training_steps")
    if epochs < 1:
        raise ValueError(f"trainer.total_epochs={epochs} must be >= 1")
    per_epoch = dataset_prompts // prompts
    if per_epoch < 1:
        where = " (null: the package's built-in prompts)" if keys("data.train_files") is None else ""
        raise ValueError(f"data.train_batch_size={prompts} is larger than the {dataset_prompts} prompts of "
                         f"data.train_files{where}: an epoch has no full batch (verl-omni's dataloader drops the "
                         "partial one); lower data.train_batch_size or give more prompts")
    if total is None:
        keys.decide(f"trainer.total_training_steps=null: trainer.total_epochs={epochs} x {per_epoch} step(s) per "
                    f"epoch ({dataset_prompts} prompts // data.train_batch_size={prompts}) = {epochs * per_epoch}")
        return epochs * per_epoch
    total = keys.integer("trainer.total_training_steps")
    if total < 1:
        raise ValueError(f"trainer.total_training_steps={total} must be a positive number of global steps, or null "
                         "(trainer.total_epochs of the prompts)")
    if total > epochs * per_epoch:
        keys.decide(f"trainer.total_training_steps={total} is past trainer.total_epochs={epochs} x {per_epoch} "
                    f"step(s) per epoch: the run ends after {epochs * per_epoch} steps, as verl-omni's epoch loop")
        return epochs * per_epoch
    return total


def build_shape(keys: RecipeKeys, digenrl: DigenRLConfig, dataset_prompts: int) -> Shape:
    n, prompts = keys(f"{A}.rollout.n"), keys("data.train_batch_size")
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"{A}.rollout.n={n!r}: group-relative advantages need at least 2 samples per prompt; set "
                         "rollout.n >= 2")
    if not isinstance(prompts, int) or prompts < 1:
        raise ValueError(f"data.train_batch_size={prompts!r} must be a positive number of prompts")
    role = digenrl.trainer_role
    ranks = digenrl.pools[role].size
    micro = keys(f"{A}.actor.ppo_micro_batch_size_per_gpu")
    if micro is not None and (isinstance(micro, bool) or not isinstance(micro, int) or micro < 1):
        raise ValueError(f"{A}.actor.ppo_micro_batch_size_per_gpu={micro!r} must be a positive number of samples per "
                         "GPU, or null (a rank's whole share of the step)")
    share = -(-n // ranks)
    if digenrl.mode == "disaggregated" and micro is not None and micro < share:
        raise ValueError(f"{A}.actor.ppo_micro_batch_size_per_gpu={micro} is smaller than one prompt group's share "
                         f"per {role} rank (ceil(rollout.n={n} / {ranks} ranks) = {share}): a micro-batch is one "
                         f"group; raise it to >= {share} or null")
    total = run_length(keys, prompts, dataset_prompts)
    _check_pool_sizes(digenrl, prompts * n)
    mini_batches = _mini_batches(keys, prompts)
    if not verl_cut_keeps_groups(prompts, mini_batches, ranks):
        note = (f"{A}.actor.ppo_mini_batch_size={prompts // mini_batches}: verl cuts each of the {ranks} {role} ranks' "
                f"shares of the batch into {mini_batches} mini-batches, whose blocks would split prompt groups "
                f"({prompts // mini_batches} prompts is not a multiple of {ranks} ranks); here mini-batch j is the "
                "j-th contiguous block of whole prompt groups (verl's cut with one data-parallel rank). A multiple of "
                f"{ranks} prompts gets verl's cut")
        keys.decide(note)
        warnings.warn(note, UserWarning, stacklevel=3)
    # colocated: verl-omni's micro-batches, `micro` samples of every rank's share (schedule.plan.ColocatedPlanner)
    return Shape(prompts, n, total, micro if digenrl.mode == "colocated" else None, mini_batches)


def _check_pool_sizes(digenrl: DigenRLConfig, samples: int) -> None:
    gen_ranks = digenrl.pools[digenrl.generator_role].size
    if gen_ranks > samples:
        raise ValueError(f"trainer.digenrl.pools: {gen_ranks} generator ranks for {samples} samples per step; some "
                         "ranks would never get a sample: shrink the pool or raise data.train_batch_size")


def generator_engine_name(keys: RecipeKeys, digenrl: DigenRLConfig, device: str) -> str:
    """The generators' rollout engine: `rollout.name`, but ``vllm_omni`` (what verl-omni's scripts set) is verl-omni's
    own rollout: its rollout replicas (``verl_omni_replica``, the path verl-omni takes on GPUs) or its registered
    rollout pipeline in each generator's process (``verl_omni``, CPU only), chosen by
    ``trainer.digenrl.generator_replicas`` (`REPLICAS_KEY`; null = replicas on CUDA, the pipeline on CPU). The same
    choice in a dry run (it plans for the cluster); a real run without verl-omni is refused here, naming the key and
    the fix. The key set where it has no effect is warned by name; every choice is said in the plan."""
    name, replicas = keys(f"{A}.rollout.name"), digenrl.generator_replicas
    if name != "vllm_omni":
        if replicas is not None:
            note = (f"{REPLICAS_KEY}={str(replicas).lower()} has no effect: {A}.rollout.name={name} (the key chooses "
                    f"how verl-omni's rollout runs: set {A}.rollout.name=vllm_omni, or drop the key)")
            warnings.warn(note, UserWarning, stacklevel=3)
            keys.decide(f"{note} (warned)")
        return name
    if not digenrl.dry_run:
        VLLM_OMNI.require()  # ValueError naming rollout.name=vllm_omni and the fixes (install verl-omni, diffusers)
    if replicas is None:
        replicas = device == "cuda"
    if device == "cuda" and not replicas:
        raise ValueError(f"{REPLICAS_KEY}=false with {A}.rollout.name=vllm_omni and trainer.device=cuda: verl-omni's "
                         "rollout pipeline runs in the generator's process on CPU only; on GPUs verl-omni's rollout "
                         f"is its replicas. Fix: drop {REPLICAS_KEY} (null: the replicas on CUDA), or set "
                         f"{A}.rollout.name=diffusers")
    how = "auto" if digenrl.generator_replicas is None else str(replicas).lower()
    if replicas:
        keys.decide(replica_decision(digenrl, device, how))
        return VERL_OMNI_REPLICA.name
    keys.decide(f"{A}.rollout.name=vllm_omni on CPU ({REPLICAS_KEY}={how}): the generators sample with verl-omni's "
                "own registered rollout pipeline for the model, built by vLLM-Omni's loader in each generator's "
                f"process (rollout engine verl_omni; a replica start costs ~100 s on CPU; {REPLICAS_KEY}=true starts "
                "verl-omni's replicas instead)")
    return VERL_OMNI.name


def replica_decision(digenrl: DigenRLConfig, device: str, how: str) -> str:
    """The plan's line for verl-omni's replicas as the generators (`generator_engine_name`)."""
    ranks = digenrl.pools[digenrl.generator_role].size
    where = ("its device is the rank's own GPU (the rank's worker and the replica's worker take half of the bundle's "
             "GPU each)" if device == "cuda" else
             "its device is the rank's own bundle's logical GPU (the run's own local Ray instance gets one per "
             "generator rank, and one more CPU in each generator bundle)")
    return (f"{A}.rollout.name=vllm_omni on {device.upper()} ({REPLICAS_KEY}={how}): each of the {ranks} generator "
            "ranks starts one of verl-omni's rollout replicas on its own placement-group bundle "
            "(vLLMOmniReplica.init_colocated, verl's colocated rollout mode: its server, AsyncOmni and diffusion "
            f"worker) and samples through its server API (rollout engine verl_omni_replica); {where}; new weights "
            "reach it as verl's server adapter sends them")


def build_engine(keys: RecipeKeys, digenrl: DigenRLConfig, device: str = "cpu") -> RolloutEngineSpec:
    name = generator_engine_name(keys, digenrl, device)
    colocated = name == "verl_omni" and colocated_sampling(keys, digenrl)
    if not colocated and name != "diffusers" and digenrl.mode == "disaggregated" and digenrl.tag.policy != "off":
        keys.decide(f"TAG (trainer.digenrl.tag.policy={digenrl.tag.policy}) with {A}.rollout.name={name}: trainer "
                    "ranks generate their TAG micro-batches with their own diffusers engine over the weights they "
                    f"train (the generators keep {name}); trainer.digenrl.tag.policy=off turns TAG off")
    entry = ENGINES.entry(name)  # ValueError naming the key and the valid names
    why = entry.unavailable_reason() if digenrl.dry_run else None
    if why is not None:  # a dry run plans for the cluster; a real run is refused below, before any worker starts
        plan_for_cluster(keys, f"{A}.rollout.name={keys(f'{A}.rollout.name')}", entry.title or name, why)
    dtype = keys(f"{A}.rollout.dtype")
    if dtype not in DTYPES:
        raise ValueError(f"{A}.rollout.dtype={dtype!r}; valid: {sorted(DTYPES)}")
    return RolloutEngineSpec(  # validates rollout.name, and (but for a dry run) that the backend can run here
        name=name, dtype=DTYPES[dtype],
        engine_kwargs=dict(keys(f"{A}.rollout.engine_kwargs.vllm_omni") or {}), runs_here=why is None,
        colocated=colocated)


def colocated_sampling(keys: RecipeKeys, digenrl: DigenRLConfig) -> bool:
    """Whether the trainer ranks sample (TAG, or everything in the colocated mode) with their own copy of verl-omni's
    rollout pipeline, as verl-omni's hybrid engine does; said in the plan either way. One trainer rank only:
    vLLM-Omni's pipeline on CPU needs a single-rank world in its process."""
    pool = digenrl.pools[digenrl.trainer_role]
    what = ("all their samples (the colocated mode)" if digenrl.mode == "colocated" else
            f"their TAG micro-batches (trainer.digenrl.tag.policy={digenrl.tag.policy})")
    if digenrl.mode == "disaggregated" and digenrl.tag.policy == "off":
        return False
    if pool.size != 1:
        keys.decide(f"{A}.rollout.name=verl_omni with {pool.size} {digenrl.trainer_role} ranks: those ranks sample "
                    f"{what} with their own diffusers engine over the weights they train; verl-omni's pipeline runs "
                    "colocated on one trainer rank only (vLLM-Omni on CPU needs a single-rank world in its process)")
        return False
    keys.decide(f"{A}.rollout.name=verl_omni: the {digenrl.trainer_role} rank samples {what} with its own copy of "
                "verl-omni's rollout pipeline, handed the trained weights before it samples at a new version "
                "(verl-omni's hybrid engine: wake up, weight sync, generate; the switch is part of the TAG task's "
                "time, which BTS measures)")
    return True


# component field -> the user's key, for the components' ConfigErrors (`ConfigError.keyed`)
ROLLOUT_KEYS = {
    "num_inference_steps": f"{A}.rollout.pipeline.num_inference_steps", "sde_type": f"{A}.rollout.algo.sde_type",
    "noise_level": f"{A}.rollout.algo.noise_level", "timestep_selection": f"{A}.rollout.algo.timestep_selection",
    "timestep_fraction": "algorithm.timestep_fraction", "sde_window_size": f"{A}.rollout.algo.sde_window_size",
    "sde_window_range": f"{A}.rollout.algo.sde_window_range", "seed": f"{A}.rollout.seed",
    "init_same_noise": f"{A}.rollout.algo.init_same_noise",
}
LOSS_KEYS = {"clip_ratio": f"{A}.actor.diffusion_loss.clip_ratio", "kl_coef": f"{A}.actor.kl_loss_coef",
             "kl_type": f"{A}.actor.kl_loss_type"}
ADVANTAGE_KEYS = {"adv_clip_max": f"{A}.actor.diffusion_loss.adv_clip_max", "epsilon": "algorithm.epsilon",
                  "aggregation": "reward.aggregation"}


@contextmanager
def user_keys(mapping: dict[str, str]) -> Iterator[None]:
    """Re-raise a component's ConfigError with the user's keys (field -> key in `mapping`)."""
    try:
        yield
    except ConfigError as e:
        raise e.keyed(mapping) from None


def build_rollout(keys: RecipeKeys, algorithm: str) -> RolloutConfig:
    with user_keys(ROLLOUT_KEYS):
        return _build_rollout(keys, algorithm)


def _build_rollout(keys: RecipeKeys, algorithm: str) -> RolloutConfig:
    steps_key, seed_key = f"{A}.rollout.pipeline.num_inference_steps", f"{A}.rollout.seed"
    steps, seed = keys(steps_key), keys(seed_key)
    default_steps = _unresolved(shipped_defaults(), steps_key)
    if steps is None:
        keys.decide(f"{steps_key}=null: {default_steps} sampling steps (verl-omni's default)")
    seed = keys.use(seed_key, drawn_seed(), NULL_SEED) if seed is None else keys.integer(seed_key)
    cfg = _rollout_config(keys, algorithm, default_steps if steps is None else keys.integer(steps_key), seed)
    if cfg.num_train_steps < 1:
        raise ValueError(f"{A}.rollout.algo.sde_type={cfg.sde_type!r} trains no step; use sde, cps or dance_sde for "
                         "training")
    if cfg.timestep_fraction < 1 and cfg.timestep_selection in ("flow_grpo", "dance_grpo"):
        keys.decide(f"algorithm.timestep_fraction={cfg.timestep_fraction}: {cfg.num_train_steps} of the "
                    f"{cfg.num_inference_steps} steps are trained, as in Flow-GRPO's reference code; verl-omni reads "
                    "this key for DiffusionNFT only and trains every step (algorithm.timestep_fraction=1.0, its "
                    "default, trains as verl-omni does)")
    return cfg


def _rollout_config(keys: RecipeKeys, algorithm: str, steps: int, seed: int) -> RolloutConfig:
    """The rollout config of `steps` sampling steps and base seed `seed` (no decision recorded)."""
    algo = f"{A}.rollout.algo"
    window = keys(f"{algo}.sde_window_range")
    if isinstance(window, str):  # verl-omni's recipes pass it quoted: sde_window_range="[0,5]"
        try:
            window = json.loads(window)
        except json.JSONDecodeError:
            raise ValueError(f"{algo}.sde_window_range={window!r}: give two ints, e.g. [0,5]") from None
    window_size = keys(f"{algo}.sde_window_size")
    return RolloutConfig(
        num_inference_steps=steps,
        sde_type=keys(f"{algo}.sde_type"), noise_level=keys.number(f"{algo}.noise_level"),
        timestep_selection=keys(f"{algo}.timestep_selection") or auto_selection(algorithm, window_size),
        timestep_fraction=keys.number("algorithm.timestep_fraction"),
        sde_window_size=0 if window_size is None else keys.integer(f"{algo}.sde_window_size"),
        sde_window_range=tuple(window) if window is not None else None,
        seed=seed,
        init_same_noise=bool(keys(f"{algo}.init_same_noise")),
    )


def trained_steps_per_sample(keys: RecipeKeys) -> int:
    """K, the trained timesteps per sample (the columns of verl-omni's old_log_probs, its T), from the keys."""
    steps_key = f"{A}.rollout.pipeline.num_inference_steps"
    steps = keys(steps_key)
    steps = _unresolved(shipped_defaults(), steps_key) if steps is None else keys.integer(steps_key)
    with user_keys(ROLLOUT_KEYS):
        return max(1, _rollout_config(keys, keys(f"{A}.model.algorithm"), steps, 0).num_train_steps)


def build_device(keys: RecipeKeys, digenrl: DigenRLConfig) -> str:
    """cuda when `trainer.device` asks for it and every pool holds GPUs; all workers share one device kind (NCCL
    or gloo spans both pools)."""
    gpu = {r: digenrl.pools[r].use_gpu for r in digenrl.roles}
    if keys("trainer.device") in ("cuda", "gpu"):
        if not all(gpu.values()):
            raise ValueError("trainer.device=cuda needs GPUs in every pool: set trainer.digenrl.pools.<role>.use_gpu="
                             f"true for {[r for r, g in gpu.items() if not g]}, or trainer.device=cpu")
        return "cuda"
    if any(gpu.values()):
        raise ValueError("trainer.digenrl.pools.<role>.use_gpu=true needs trainer.device=cuda")
    return "cpu"


def build_policy(keys: RecipeKeys, digenrl: DigenRLConfig, *, path: str, algorithm: str,
                 start_version: int) -> PolicySpec:
    model = f"{A}.model"
    lora = build_lora(keys)
    pipe = keys(f"{A}.rollout.pipeline") or {}
    if "host_sigmas" in pipe:
        raise ValueError(f"{A}.rollout.pipeline.host_sigmas is not a key: the verl-omni path sets the schedules itself "
                         "(verl-omni's training adapter's); drop it")
    pipeline = PipelineConfig.from_dict({k: v for k, v in pipe.items() if k not in VERL_OMNI_PIPELINE_KEYS})
    model_dtype = keys(f"{A}.actor.fsdp_config.model_dtype")
    if model_dtype not in DTYPES:
        raise ValueError(f"{A}.actor.fsdp_config.model_dtype={model_dtype!r}; valid: {sorted(DTYPES)}")
    device = build_device(keys, digenrl)
    engine = build_engine(keys, digenrl, device)
    if engine.name in ("diffusers", "verl_omni") and engine.dtype != DTYPES[model_dtype]:
        keys.decide(f"{A}.rollout.dtype={engine.dtype}: generators sample in it, as verl-omni's rollout does (the "
                    f"trainer's weights, in {A}.actor.fsdp_config.model_dtype={DTYPES[model_dtype]}, are cast on "
                    "arrival; PEFT keeps LoRA adapter weights in float32); samples drawn on trainer ranks (TAG, "
                    f"the colocated mode) come from the trained model in {DTYPES[model_dtype]}")
    if isinstance(lora, AdapterLoraConfig) and engine.name != "diffusers":
        raise ValueError(f"{model}.lora_adapter_path with {A}.rollout.name={engine.name}: the vLLM-Omni generator does "
                         f"not load pre-trained adapters yet; set {A}.rollout.name=diffusers (the generators then "
                         f"load the adapter too) or {model}.lora_adapter_path=null")
    rollout = replace(build_rollout(keys, algorithm), rows_alone=digenrl.rows_alone)
    if digenrl.rows_alone:
        rows_alone_decision(keys, engine, DTYPES[model_dtype])
    return PolicySpec(model_path=str(path), lora=lora, pipeline=pipeline, rollout=rollout,
                      dtype=DTYPES[model_dtype], start_version=start_version, device=device, engine=engine)


def rows_alone_decision(keys: RecipeKeys, engine: RolloutEngineSpec, model_dtype: str) -> None:
    """What `trainer.digenrl.rows_alone=true` does here, said in the plan: which engines draw each sample alone, and
    what still makes a sample depend on who draws it (another engine, another dtype)."""
    said = ("trainer.digenrl.rows_alone=true: the diffusers engines draw each sample in a batch of its own (its "
            "trajectory does not depend on its neighbours)")
    if engine.name != "diffusers" or engine.colocated:
        said += (f"; the generators' {A}.rollout.name={engine.name} batches as it does (the key has no effect there): "
                 "a sample drawn by a generator and by a trainer rank come from different samplers")
    elif engine.dtype != model_dtype:
        said += (f"; generators sample in {A}.rollout.dtype={engine.dtype}, trainer ranks in {model_dtype}: a sample "
                 "still depends on who draws it (set both dtypes equal for identical samples)")
    else:
        said += "; every worker samples in the same dtype, so a sample is the same whichever worker draws it"
    keys.decide(said)


def build_lora(keys: RecipeKeys) -> LoraConfig:
    """The recipe's LoRA, or, with `model.lora_adapter_path`, the pre-trained adapter's (verl-omni's
    `LoRAAdapterMixin._build_lora_module`: diffusers' `load_lora_adapter` takes rank, alpha and targets from the
    adapter, not from lora_rank / lora_alpha / target_modules), read here so that a bad path fails before any
    worker starts; every worker building the model loads its weights (`models.lora.apply_lora`)."""
    model = f"{A}.model"
    lora = LoraConfig.from_dict(keys.section(model, ("lora_rank", "lora_alpha", "lora_init_weights",
                                                     "target_modules", "exclude_modules")))
    path = keys(f"{model}.lora_adapter_path")
    if path is None:
        return lora
    if not isinstance(path, str) or not path:
        raise ValueError(f"{model}.lora_adapter_path={path!r}: give a local peft adapter directory or diffusers "
                         "LoRA file, or null")
    path = os.path.abspath(os.path.expanduser(path))
    adapter = read_lora_adapter(path)
    c = adapter.config
    targets = c["target_modules"]
    keys.decide(f"{model}.lora_adapter_path={path}: the LoRA starts from this pre-trained {adapter.kind} adapter "
                f"({adapter.summary}), on the trainers and the generators, as verl-omni's engine loads it; "
                f"{model}.lora_rank / lora_alpha / target_modules are not used (the adapter's are); the KL reference "
                "is the model with the adapter off")
    return AdapterLoraConfig(rank=int(c["r"]), alpha=float(c["lora_alpha"]), init_weights=lora.init_weights,
                             target_modules=targets if isinstance(targets, str) else tuple(targets),
                             exclude_modules=lora.exclude_modules, seed=lora.seed, adapter_path=path)


def build_sharding(keys: RecipeKeys, digenrl: DigenRLConfig, n: int, engine: str = "digenrl") -> ShardingSpec:
    """`actor.strategy` → how the trainer pool splits its model (see `workers.sharding`).

    FSDP2 applies to the trainer pool of a disaggregated run with more than one rank. A single trainer rank has
    nothing to shard with; colocated ranks sample their own micro-batches, which sharded forwards (collectives
    over all ranks) cannot do, so they keep a whole model each (the data-parallel baseline). With `engine`
    ``verl_omni`` verl-omni's engine reads the strategy and its FSDP settings (VeOmni, hybrid sharding included);
    only its need for rows on every trainer rank is checked here."""
    if engine == "verl_omni":
        return _host_sharding(keys, digenrl, n)
    strategy = keys(STRATEGY_KEY)
    if strategy not in STRATEGIES:
        raise ValueError(f"{STRATEGY_KEY}={strategy!r}; valid: {list(STRATEGIES)} (fsdp and fsdp2 both mean FSDP2 "
                         "fully_shard over the trainer pool; ddp keeps a whole model per trainer rank)")
    fsdp = f"{A}.actor.fsdp_config"
    fsdp_size = keys(f"{fsdp}.fsdp_size")
    prefixes = keys(f"{A}.model.fsdp_layer_prefixes")
    wrap = keys(f"{fsdp}.wrap_policy") or {}
    reshard = bool(keys(f"{fsdp}.reshard_after_forward"))
    if strategy == "ddp":
        return ShardingSpec("ddp")
    if digenrl.mode != "disaggregated":
        if strategy == "fsdp2" and digenrl.pools.colocated.size > 1:
            warnings.warn(f"{STRATEGY_KEY}=fsdp2 in trainer.digenrl.mode=colocated: colocated ranks keep a whole "
                          "model each and all-reduce gradients (FSDP2 applies to the trainer pool of mode="
                          "disaggregated)", UserWarning, stacklevel=3)
        return ShardingSpec("ddp")
    trainers = digenrl.pools.trainer.size
    if fsdp_size not in (-1, None, trainers):
        raise ValueError(f"{fsdp}.fsdp_size={fsdp_size}: hybrid sharding is not implemented; use -1 (shard over the "
                         f"whole trainer pool, {trainers} ranks)")
    if trainers == 1:
        return ShardingSpec("ddp")
    if n < trainers:
        raise ValueError(f"{STRATEGY_KEY}={strategy} shards the model over {trainers} trainer ranks, which run every "
                         f"forward together, so each needs a sample of every micro-batch, but {A}.rollout.n={n} < "
                         f"{trainers}: raise rollout.n, shrink trainer.digenrl.pools.trainer, or set "
                         f"{STRATEGY_KEY}=ddp")
    if isinstance(prefixes, str):
        prefixes = [prefixes]
    return ShardingSpec(strategy, tuple(prefixes) if prefixes else None, int(wrap.get("min_num_params") or 0),
                        reshard)


def _host_sharding(keys: RecipeKeys, digenrl: DigenRLConfig, n: int) -> ShardingSpec:
    """verl-omni's engine shards as its config says; its forwards are collectives over the trainer ranks, so each
    needs a sample of every micro-batch (a GAP micro-batch is a prompt group of `n` samples)."""
    trainers = digenrl.pools.trainer.size if digenrl.mode == "disaggregated" else 1
    if keys.peek(STRATEGY_KEY) != "ddp" and n < trainers:
        raise ValueError(f"{STRATEGY_KEY}={keys.peek(STRATEGY_KEY)} on verl-omni's engine runs every forward on all "
                         f"{trainers} trainer ranks together, so each needs a sample of every micro-batch, but "
                         f"{A}.rollout.n={n} < {trainers}: raise rollout.n or shrink trainer.digenrl.pools.trainer")
    return ShardingSpec("ddp")  # the package's own sharding is not used on this path


def build_optim(keys: RecipeKeys, total_steps: int) -> OptimSpec:
    """AdamW, the clip and verl's learning-rate schedule over the run's `total_steps` global steps
    (`actor_rollout_ref.actor.optim.*`; the deprecated `warmup_style` names the schedule when set, as in verl)."""
    optim = f"{A}.actor.optim"
    style = keys(f"{optim}.warmup_style")
    if style is not None:
        keys.decide(f"{optim}.warmup_style={style!r} (deprecated in verl): the schedule is {style!r}, as verl reads it "
                    f"(use {optim}.lr_scheduler_type)")
    return OptimSpec(lr=keys.number(f"{optim}.lr"), weight_decay=keys.number(f"{optim}.weight_decay"),
                     betas=keys.numbers(f"{optim}.betas"), eps=keys.number(f"{optim}.eps"),
                     grad_clip=keys(f"{A}.actor.grad_clip"),
                     lr_scheduler_type=style if style is not None else keys(f"{optim}.lr_scheduler_type"),
                     lr_warmup_steps=keys.integer(f"{optim}.lr_warmup_steps"),
                     lr_warmup_steps_ratio=keys.number(f"{optim}.lr_warmup_steps_ratio"),
                     min_lr_ratio=keys.number(f"{optim}.min_lr_ratio"), num_cycles=keys.number(f"{optim}.num_cycles"),
                     zero_indexed_step=bool(keys(f"{optim}.zero_indexed_step")), total_steps=total_steps)


def build_train(keys: RecipeKeys, digenrl: DigenRLConfig, policy: PolicySpec, n: int, total_steps: int,
                engine: str = "digenrl") -> TrainSpec:
    actor = f"{A}.actor"
    use_kl = keys(f"{actor}.use_kl_loss")
    kl_coef = keys.number(f"{actor}.kl_loss_coef")
    with user_keys(LOSS_KEYS):
        loss = LossConfig(clip_ratio=keys.number(f"{actor}.diffusion_loss.clip_ratio"),
                          kl_coef=kl_coef if use_kl else 0.0, kl_type=keys(f"{actor}.kl_loss_type"),
                          stale_is_cap=digenrl.tcss.stale_is_cap)
    optim = build_optim(keys, total_steps)
    recompute = keys(f"{A}.rollout.recompute_old_log_probs")
    if recompute is None:  # auto: the diffusers fp32 path shares the trainer's numerics
        recompute = policy.engine.name != "diffusers" or policy.dtype != "float32"
        if keys("algorithm.rollout_correction.bypass_mode") is False and not recompute:
            keys.decide("algorithm.rollout_correction.bypass_mode=False (verl-omni: the trainer recomputes the old "
                        "log-probs): the generator's log-probs are used, the same numbers on this path (diffusers "
                        f"engine, {policy.dtype}, the weights the trainer holds); {A}.rollout.recompute_old_log_probs="
                        "true recomputes them anyway")
    log_prob_micro = keys(f"{A}.rollout.log_prob_micro_batch_size_per_gpu")
    if log_prob_micro is not None and (isinstance(log_prob_micro, bool) or not isinstance(log_prob_micro, int)
                                       or log_prob_micro < 1):
        raise ValueError(f"{A}.rollout.log_prob_micro_batch_size_per_gpu={log_prob_micro!r} must be a positive "
                         "number of samples per GPU, or null (a rank's whole micro-batch per recompute pass)")
    return TrainSpec(loss=loss, optim=optim, tsp_chunk_size=digenrl.tsp.chunk_size,
                     recompute_old_log_probs=bool(recompute), log_prob_micro_batch_size=log_prob_micro,
                     sharding=build_sharding(keys, digenrl, n, engine))


def trainer_engine_of(digenrl: DigenRLConfig, host: Any) -> str:
    """`trainer.digenrl.trainer_engine` resolved: ``auto`` is ``verl_omni`` when verl-omni's composed config came
    with the run (`host`: a run from verl-omni's entry point) and verl-omni imports here, else ``digenrl``."""
    if digenrl.trainer_engine != "auto":
        return digenrl.trainer_engine
    return "verl_omni" if host is not None and importlib.util.find_spec("verl_omni") is not None else "digenrl"


def build_trainer_engine(keys: RecipeKeys, digenrl: DigenRLConfig, train: TrainSpec, host: Any) -> TrainSpec:
    """`train` on the engine `trainer_engine_of` picks. ``verl_omni``: verl-omni's actor worker reads `host` (its
    composed ``actor_rollout_ref``); what that worker cannot do yet is refused here, before any worker starts,
    naming the key and the fix."""
    engine = trainer_engine_of(digenrl, host)
    key = f"{SECTION}.trainer_engine"
    if engine == "digenrl":
        return train
    if host is None:
        raise ValueError(f"{key}=verl_omni trains with verl-omni's actor worker, built from the config verl-omni "
                         "composed: start the run from verl-omni's entry point (python -m "
                         "digenrl_verl.integrations.verl_omni ..., or verl-omni's main_diffusion_v1 with "
                         f"trainer.v1.trainer_mode=digenrl), or set {key}=digenrl")
    if importlib.util.find_spec("verl_omni") is None:
        raise ValueError(f"{key}=verl_omni: verl-omni is not installed in this environment; install it "
                         f"(pip install verl-omni, see README) or set {key}=digenrl")
    if train.loss.kl_coef > 0:
        raise ValueError(f"{A}.actor.use_kl_loss=true with {key}=verl_omni: the reference model's log-probs "
                         "(verl-omni's ref worker) are not produced on this path yet; set use_kl_loss=false or "
                         f"{key}=digenrl")
    if digenrl.tcss.staleness > 0:
        keys.decide(f"{SECTION}.tcss.staleness={digenrl.tcss.staleness} with {key}=verl_omni: the stale rows go "
                    f"through verl-omni's loss ({A}.actor.diffusion_loss.loss_mode) against their behaviour log-probs "
                    f"(its clip), not the package's decoupled objective ({SECTION}.tcss.objective is not used)")
    keys.decide(f"{key}=verl_omni: the trainer pool is verl-omni's actor worker (its engine, with the TSP "
                f"subclass; its LoRA, optimizer, LR schedule, loss and checkpoints), configured by verl-omni's "
                f"composed {A}; the package's own trainer settings are not used. Its weights reach the generators "
                f"through the package's transport ({A}.rollout.checkpoint_engine.backend is for verl-omni's rollout "
                "replicas, not used here)")
    return replace(train, engine="verl_omni", host_config=host.actor_rollout_ref)


def honour_global_std(keys: RecipeKeys, digenrl: DigenRLConfig,
                      engine: str = "digenrl") -> tuple[DigenRLConfig, bool]:
    """`algorithm.global_std=True` (verl-omni's default) divides by the std of the whole step's rewards, known only
    once the step's last group is scored. A disaggregated, pipelined run keeps it exactly in one of two ways, said in
    the plan: **deferred** (returns True): groups train as soon as they are scored, with their group-centred rewards,
    and the step's gradient is scaled by 1/(std + epsilon) at its optimizer step, which waits for the last reward
    (`diffusion.advantages`; samples the clamp may touch train then), on the package's trainer and on verl-omni's
    actor worker (`engine`: its losses flow_grpo / dance_grpo / grpo_guard / flow_dppo are positively homogeneous in
    the advantage; its clamp sees the values divided by a power of two and the 1/(std + epsilon) goes before its
    clip, `integrations.verl_omni_worker`); **barrier** (`pipeline=False`): the step's updates wait for its last
    reward, where the deferred scaling does not apply (the KL term). Colocated steps, and runs without pipelining,
    score everything before updating anyway (False)."""
    global_std, norm = advantage_std(keys)
    if not (global_std and norm) or digenrl.mode != "disaggregated" or not digenrl.pipeline:
        return digenrl, False
    head = "algorithm.global_std=True (verl-omni's default): advantages use the std of the whole step's rewards"
    blocked = (f"{A}.actor.use_kl_loss=true (the KL term does not scale with the std)" if keys(f"{A}.actor.use_kl_loss")
               else None)
    if blocked is None:
        where = (" on verl-omni's actor worker (trainer.digenrl.trainer_engine=verl_omni: its loss gets the values "
                 "divided by a power of two with the loss scaled back, so its clamp does not touch them, and the "
                 "scale goes before its grad clip)" if engine == "verl_omni" else "")
        keys.decide(f"{head}, applied by deferred scaling (exact){where}: a prompt group trains as soon as it is "
                    "scored, with its group-centred rewards, and the step's gradient is scaled by 1/(std + epsilon) "
                    "at its optimizer step, which waits for the step's last reward; samples that "
                    f"{A}.actor.diffusion_loss.adv_clip_max may clamp train then. With several optimizer steps per "
                    "global step only the first one's updates overlap generation")
        return digenrl, True
    keys.decide(f"{head}, so a step's updates wait for its last reward (GAP pipelining off for the updates; TCSS may "
                "still generate the next step meanwhile): the deferred scaling (updates as groups are scored, the std "
                f"applied at the optimizer step) does not apply with {blocked}; algorithm.global_std=false (each "
                "prompt group's own std) lets updates start as soon as a group is scored")
    return replace(digenrl, pipeline=False), False


#: the std keys verl-omni's `compute_advantage` passes to the Flow-GRPO estimator only: with
#: `algorithm.adv_estimator=dance_grpo` the same estimator runs on its defaults (global std, divided by it)
STD_KEYS = ("algorithm.global_std", "algorithm.norm_adv_by_std_in_grpo")


def advantage_std(keys: RecipeKeys) -> tuple[bool, bool]:
    """(global_std, norm_adv_by_std) as verl-omni applies them: the keys' values for flow_grpo; always (True, True)
    for dance_grpo, whatever the keys say."""
    if keys("algorithm.adv_estimator") == "dance_grpo":
        return True, True
    return bool(keys(STD_KEYS[0])), bool(keys(STD_KEYS[1]))


def build_advantage(keys: RecipeKeys, deferred_std: bool = False) -> AdvantageConfig:
    """verl-omni's Flow-GRPO advantages: its stds are over [B, T] rows (each reward repeated over the sample's T
    trained timesteps, `compute_flow_grpo_outcome_advantage`), so T is the run's trained steps per sample. A std
    key that verl-omni ignores (DanceGRPO) and the user set otherwise is warned about by name. `deferred_std`: the
    global std by deferred scaling (`honour_global_std`)."""
    timesteps = trained_steps_per_sample(keys)
    global_std, norm = advantage_std(keys)
    for key, used in zip(STD_KEYS, (global_std, norm)):
        if bool(keys(key)) != used:
            warnings.warn(f"{key}={keys(key)} has no effect with algorithm.adv_estimator=dance_grpo: verl-omni's "
                          "compute_advantage passes it to the flow_grpo estimator only, so DanceGRPO advantages "
                          "always divide by the step's global std (as here)", UserWarning, stacklevel=3)
    with user_keys(ADVANTAGE_KEYS):
        return AdvantageConfig(global_std=global_std, norm_adv_by_std=norm,
                               adv_clip_max=keys(f"{A}.actor.diffusion_loss.adv_clip_max"),
                               timesteps_per_sample=timesteps, deferred_std=deferred_std)


def _data_seed(keys: RecipeKeys) -> int:
    seed = keys("data.seed")
    return keys.use("data.seed", drawn_seed(), NULL_SEED) if seed is None else keys.integer("data.seed")


def build_data(keys: RecipeKeys) -> DataSpec:
    try:
        keys.decide(prompt_reader_decision(keys("data.train_files")))  # verl-omni's dataset code, or our same rules
        return DataSpec(train_files=keys("data.train_files"), prompt_key=keys("data.prompt_key"),
                        seed=_data_seed(keys), shuffle=bool(keys("data.shuffle")),
                        val_files=keys("data.val_files"), val_max_samples=keys("data.val_max_samples"),
                        source_key=str(keys("data.reward_fn_key")), negative_prompt_key=_negative_prompt_key(keys),
                        loader_workers=int(keys("data.dataloader_num_workers")))
    except ConfigError as e:
        raise e.under("data") from None


#: verl-omni's `RLHFDataset` reads `config.get("negative_prompt_key", "negative_prompt")` (a key its YAML lacks: set
#: it with `+data.negative_prompt_key=<column>` on either entry point)
VERL_OMNI_NEGATIVE_PROMPT_KEY = "negative_prompt"
NEGATIVE_PROMPT = f"{A}.rollout.pipeline.negative_prompt"


def _negative_prompt_key(keys: RecipeKeys) -> str:
    column = keys("data.negative_prompt_key", VERL_OMNI_NEGATIVE_PROMPT_KEY)
    if not isinstance(column, str) or not column:
        raise ValueError(f"data.negative_prompt_key={column!r} must be a column name (verl-omni's default: "
                         f"{VERL_OMNI_NEGATIVE_PROMPT_KEY!r})")
    keys.used["data.negative_prompt_key"] = column  # in neither config file: the plan shows the column it reads
    return column


def negative_prompt_encoded(pipeline: PipelineConfig, architecture: str) -> bool:
    """Whether the architecture's pipeline may encode the negative prompt with these settings: its CFG scale
    (true_cfg_scale where it has true CFG, else guidance_scale) is > 1 or null (the pipeline's default)."""
    adapter = get_adapter_class(architecture)
    scale = pipeline.true_cfg_scale if getattr(adapter, "uses_true_cfg_scale", False) else pipeline.guidance_scale
    return scale is None or scale > 1


def build_negative_prompt(keys: RecipeKeys, pipeline: PipelineConfig, architecture: str, column: str,
                          columns: dict[str, dict[str, list[str] | None]]) -> PipelineConfig:
    """The negative prompt of the run's CFG / true CFG, and the plan's line on where it came from.

    verl-omni gives each row the chat of its `data.negative_prompt_key` column (its dataset's `raw_negative_prompt`,
    rendered by its agent loop as the prompt is). The pipelines here encode one negative prompt per run (`Pipeline
    Config.negative_prompt`), so where the prompt files have the column the run takes its one value (the chat's user
    text, `trainer.data.load_negative_prompts`, which the pipeline's template renders as verl-omni renders the chat),
    and refuses, before any worker starts, files whose rows differ or where some rows have none, unless the
    negative prompt is not encoded (`negative_prompt_encoded`). Without the column: `rollout.pipeline.negative_prompt`
    (the plan says so where it is encoded).

    `column`: data.negative_prompt_key as `build_data` read it (`DataSpec.negative_prompt_key`); `columns`: the
    setting (data.train_files, data.val_files) -> `load_negative_prompts` of its files."""
    files = [(f"{setting}: {f}", texts) for setting, read in columns.items() for f, texts in read.items()]
    without = [name for name, texts in files if texts is None]
    where = [name for name, texts in files if texts is not None]
    found = sorted({text for _, texts in files for text in texts or ()})
    if not found:
        if negative_prompt_encoded(pipeline, architecture):
            keys.decide(f"negative prompt: {NEGATIVE_PROMPT}={pipeline.negative_prompt!r} (no prompt file has a "
                        f"{column!r} column, data.negative_prompt_key)")
        return pipeline
    if len(found) > 1 or without:
        if not negative_prompt_encoded(pipeline, architecture):
            keys.decide(f"negative prompt: none is encoded ({architecture}'s CFG scale is <= 1), so the {column!r} "
                        "column (data.negative_prompt_key), whose rows differ, is not used")
            return pipeline
        raise ValueError(
            f"data.negative_prompt_key={column!r}: the rows' negative prompts differ ({len(found)} distinct user "
            f"texts, e.g. {found[:3]!r}{f'; no such column in {without}' if without else ''}); verl-omni encodes each "
            f"row's own, this run encodes one for every sample ({NEGATIVE_PROMPT}): give every row of data."
            f"train_files / data.val_files the same {column!r} chat, drop the column (then {NEGATIVE_PROMPT} is "
            "used), or run without CFG (its scale <= 1)")
    (text,) = found
    if pipeline.negative_prompt and pipeline.negative_prompt != text:
        raise ValueError(f"{NEGATIVE_PROMPT}={pipeline.negative_prompt!r} and the prompt files' {column!r} column "
                         f"(user text {text!r}, {where}) both give the negative prompt: drop one (verl-omni reads "
                         "the column)")
    keys.used[NEGATIVE_PROMPT] = text
    keys.decide(f"negative prompt: {text!r}, the user text of every row's {column!r} chat (data.negative_prompt_key; "
                f"{', '.join(where)}), which the pipeline's template renders as verl-omni's agent loop renders the "
                f"chat (its raw_negative_prompt); {NEGATIVE_PROMPT} is not used")
    return replace(pipeline, negative_prompt=text)


VAL_KWARGS = f"{A}.rollout.val_kwargs"
# validation fields -> the user's keys (ValidationSpec, and the validation's RolloutConfig on top of ROLLOUT_KEYS)
VALIDATION_KEYS = {"test_freq": "trainer.test_freq", "val_before_train": "trainer.val_before_train",
                   "n": f"{VAL_KWARGS}.n", "num_inference_steps": f"{VAL_KWARGS}.pipeline.num_inference_steps",
                   "noise_level": f"{VAL_KWARGS}.algo.noise_level", "sde_type": f"{VAL_KWARGS}.algo.sde_type",
                   "seed": f"{VAL_KWARGS}.seed"}
VERL_OMNI_VAL_SEED = 42  # verl-omni's DiffusionSamplingConfig.seed (not in its YAML: `+...val_kwargs.seed=` there)
#: the val_kwargs keys that shape the validation samples: read when validation runs, warned about when it does not
VAL_SAMPLING_KEYS = tuple(key for key in VALIDATION_KEYS.values() if key.startswith(VAL_KWARGS))


def build_validation(keys: RecipeKeys, data: DataSpec, rollout: RolloutConfig) -> ValidationSpec:
    """`trainer.test_freq` / `trainer.val_before_train` and verl-omni's `rollout.val_kwargs` (n, steps, noise level
    and SDE kind, seed) applied to the training rollout's settings; the plan says which prompts and how. With
    validation off the val_kwargs are not built (nothing of them can fail the run) and a changed one warns."""
    with user_keys(VALIDATION_KEYS):
        when = ValidationSpec(test_freq=keys("trainer.test_freq"),
                              before_train=keys("trainer.val_before_train"))
    if not when.enabled:
        values = {key: keys(key) for key in VAL_SAMPLING_KEYS}
        for key in changed_keys(keys, VAL_SAMPLING_KEYS):
            warnings.warn(f"{key}={values[key]!r} has no effect: validation is off (trainer.test_freq <= 0 and "
                          "trainer.val_before_train=false); set trainer.test_freq > 0 or trainer.val_before_train=true "
                          "to validate", UserWarning, stacklevel=3)
        return when
    v = VAL_KWARGS
    sampling = _validation_sampling(keys, rollout)
    with user_keys(VALIDATION_KEYS):
        spec = replace(when, n=keys(f"{v}.n"), rollout=sampling)
    where = "data.val_files" if data.val_files is not None else "the training prompts (data.val_files=null)"
    how = ("deterministic (ODE)" if sampling.sde_type == "ode"
           else f"{sampling.sde_type} noise_level={sampling.noise_level}")
    note = (f"validation: {spec.n} {how} sample(s) per prompt of {where}, {sampling.num_inference_steps} steps, "
            f"seed {sampling.seed}, scored and logged as val-core/<data_source>/reward/mean@{spec.n}"
            f"{' before the first step,' if spec.before_train else ''}"
            f"{f' every {spec.every} step(s) and at the last step' if spec.every else ''}")
    if spec.n > 1:
        note += (f"; each of a prompt's {spec.n} samples has its own noise (from {v}.seed, the prompt and the "
                 "sample's index), where verl-omni seeds every validation request with the seed alone")
    keys.decide(note)
    return spec


def _validation_sampling(keys: RecipeKeys, rollout: RolloutConfig) -> RolloutConfig:
    """The validation samples' RolloutConfig: the training rollout's with val_kwargs' steps, noise level (0: ODE),
    SDE kind and seed. An SDE validation takes the rollout's timestep selection at its own step count; where that
    does not fit, the error names the val_kwargs keys (the training rollout itself was checked already)."""
    v = VAL_KWARGS
    noise = keys(f"{v}.algo.noise_level")
    sde_type = keys(f"{v}.algo.sde_type", rollout.sde_type)
    steps = keys(f"{v}.pipeline.num_inference_steps")
    steps = rollout.num_inference_steps if steps is None else steps
    seed = keys(f"{v}.seed", VERL_OMNI_VAL_SEED)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or noise < 0:
        raise ValueError(f"{v}.algo.noise_level={noise!r} must be a number >= 0 (0: deterministic ODE samples)")
    if noise == 0 and changed_keys(keys, (f"{v}.algo.sde_type",)):
        warnings.warn(f"{v}.algo.sde_type={sde_type!r} has no effect with {v}.algo.noise_level=0: validation samples "
                      f"are deterministic (ODE); set {v}.algo.noise_level > 0 for {sde_type} samples", UserWarning,
                      stacklevel=4)
    mapping = {**ROLLOUT_KEYS, **VALIDATION_KEYS}
    try:
        return replace(rollout, num_inference_steps=steps, sde_type=sde_type if noise > 0 else "ode",
                       noise_level=float(noise), seed=seed, init_same_noise=False)
    except ConfigError as e:
        if e.path in VALIDATION_KEYS:
            raise e.keyed(mapping) from None
        raise ValueError(f"{v}.pipeline.num_inference_steps={steps!r} with {v}.algo.noise_level={noise}: the "
                         f"validation's {sde_type} samples take the training rollout's timestep selection at "
                         f"{steps} steps, where it does not fit ({e.keyed(mapping)}); set "
                         f"{v}.pipeline.num_inference_steps so that it fits, or {v}.algo.noise_level=0 "
                         "(deterministic ODE samples)") from None


def build_logging(keys: RecipeKeys) -> LoggingSpec:
    """verl's Tracking backends (`trainer.logger`; verl-omni's default is [console, wandb]); a backend whose package
    is missing fails here, naming the key, rather than after the workers started."""
    loggers = keys("trainer.logger")
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    for name in loggers:
        package = LOGGER_PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise ValueError(f"trainer.logger={loggers}: {name} needs the {package!r} package, which is not installed; "
                             f"install it, or drop {name} (e.g. trainer.logger=[console,tensorboard])")
    if "wandb" in loggers:
        keys.decide("trainer.logger has wandb (verl-omni's default): wandb.init needs a login (WANDB_API_KEY) or "
                    "WANDB_MODE=offline")
    return LoggingSpec(project_name=str(keys("trainer.project_name")),
                       experiment_name=str(keys("trainer.experiment_name")),
                       loggers=tuple(loggers))


#: trainer.logger backends -> the package verl's Tracking imports for them
LOGGER_PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow", "swanlab": "swanlab",
                   "vemlp_wandb": "volcengine_ml_platform", "clearml": "clearml", "trackio": "trackio"}


def build_checkpoint(keys: RecipeKeys) -> CheckpointSpec:
    try:
        return CheckpointSpec(root=str(keys("trainer.default_local_dir")),
                              save_freq=int(keys("trainer.save_freq") or -1),
                              max_to_keep=keys("trainer.max_actor_ckpt_to_keep"),
                              resume_mode=keys("trainer.resume_mode"),
                              resume_from_path=keys("trainer.resume_from_path"))
    except ConfigError as e:
        raise e.under("trainer") from None
