"""The `vllm` judge backend: the VLM judge as a vLLM `LLM` engine, the way verl-omni serves its reward model.

verl-omni (a1139baf) serves `reward.reward_model.model_path` with vLLM (`reward.reward_model.rollout.name=vllm`,
`tensor_model_parallel_size`, `gpu_memory_utilization`, `enforce_eager`, ...) behind an OpenAI-compatible router,
and its `genrm_ocr` reward posts one chat per image (system prompt, user = image + instruction). Here the same
engine settings build a `vllm.LLM` in the process that judges (a replica of the judge pool, `workers.judge`, or a
scoring worker), and each image becomes one request of the same chat: the checkpoint's chat template rendered with
one image placeholder (`JudgeProcessor.prompt`) plus the image as `multi_modal_data`, which vLLM's Qwen2.5-VL /
Qwen3-VL processors expand into the image's patch tokens. Sampling is genrm_ocr's (`JudgeConfig`: temperature,
top-p, max tokens, seed), special tokens skipped in the answer, as the transformers backend decodes.

vLLM is imported only when a judge is built (it has no CPU execution path here: the config falls back to, or
insists on, the transformers backend without CUDA). Every argument this module passes is checked against the
installed vLLM's real signatures and fields by tests/contract/test_contract_vllm_judge_on_cpu.py.
"""

from __future__ import annotations

from typing import Any, Sequence

from digenrl_verl.rewards.vlm_judge import JudgeConfig, JudgeProcessor, judge_family, register_judge_backend

#: images per request: one (genrm_ocr sends each image, or video frame, as its own chat)
IMAGES_PER_PROMPT = 1


def engine_kwargs(cfg: JudgeConfig) -> dict[str, Any]:
    """The `vllm.LLM(...)` arguments of the judge (`reward.reward_model.rollout.*`). Tensor parallelism > 1 exists
    only for judge replicas as Ray actors (`JudgeConfig` refuses it for an in-process judge, which has its scoring
    worker's one device): a replica runs its ranks as local processes ("mp") on the GPUs its actor sees, reserved in
    one placement bundle of the judge's own pool (`reward.reward_model.enable_resource_pool=True`) or, colocated,
    those of TP workers of its node (`workers.judge.JudgePool.start_colocated`), not as Ray workers of its own."""
    kwargs: dict[str, Any] = {
        "model": cfg.model_path, "tokenizer": cfg.model_path, "dtype": cfg.dtype,
        "tensor_parallel_size": cfg.tensor_parallel_size, "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "enforce_eager": cfg.enforce_eager, "limit_mm_per_prompt": {"image": IMAGES_PER_PROMPT},
    }
    if cfg.tensor_parallel_size > 1:
        kwargs["distributed_executor_backend"] = "mp"
    if cfg.max_model_len is not None:
        kwargs["max_model_len"] = cfg.max_model_len
    if cfg.max_num_seqs is not None:
        kwargs["max_num_seqs"] = cfg.max_num_seqs
    if cfg.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
    return kwargs


def sampling_kwargs(cfg: JudgeConfig) -> dict[str, Any]:
    """The `vllm.SamplingParams(...)` of genrm_ocr's request: temperature, top_p, max_tokens, seed (None: unseeded);
    special tokens are skipped in the answer (vLLM's default, as `TransformersJudge` decodes)."""
    return {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_new_tokens, "seed": cfg.seed,
            "skip_special_tokens": True}


def judge_requests(prompt: str, images: Sequence[Any]) -> list[dict[str, Any]]:
    """One vLLM text prompt (`vllm.inputs.TextPrompt`: `prompt` + `multi_modal_data`) per PIL image."""
    return [{"prompt": prompt, "multi_modal_data": {"image": image}} for image in images]


@register_judge_backend("vllm")
class VllmJudge:
    """The judge as a vLLM engine in this process (CUDA): transcribes images with `LLM.generate`."""

    def __init__(self, cfg: JudgeConfig) -> None:
        # imported when a judge is built, not with the module: `rewards` imports this module in every process
        # (driver, all workers), and vLLM (CUDA only) and transformers take seconds to import
        from transformers import AutoConfig
        from vllm import LLM, SamplingParams

        judge_family(cfg.model_path)
        self.cfg = cfg
        processor = JudgeProcessor(cfg.model_path, AutoConfig.from_pretrained(cfg.model_path).image_token_id)
        self.prompt = processor.prompt(cfg.instruction, cfg.system_prompt)
        self.llm = LLM(**engine_kwargs(cfg))
        self.sampling = SamplingParams(**sampling_kwargs(cfg))

    def transcribe(self, images: Sequence[Any]) -> list[str]:
        """The judge's answer for each PIL image (vLLM batches the requests itself)."""
        outputs = self.llm.generate(judge_requests(self.prompt, images), self.sampling, use_tqdm=False)
        return [out.outputs[0].text for out in outputs]
