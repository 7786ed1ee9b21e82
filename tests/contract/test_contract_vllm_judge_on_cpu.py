"""The `vllm` judge backend (`rewards.judge_vllm`) against the real vLLM (0.28.0 in `.venv-contract`), on CPU.

Every call `VllmJudge` makes is held to the installed package: the `LLM(...)` arguments (its signature, else a field
of `EngineArgs`, where `LLM` sends its **kwargs; and `EngineArgs` built with them), the `SamplingParams(...)` fields,
the request dicts (`vllm.inputs.TextPrompt` keys, the `image` modality), `LLM.generate`'s parameters and the
`RequestOutput` / `CompletionOutput` fields read back, and the prompt: the tiny judges' chat carries exactly the image
placeholder that vLLM's own Qwen2.5-VL / Qwen3-VL classes expand (their `get_placeholder_str`, run from the installed
source: importing those modules needs torchvision, a CUDA build here), for architectures vLLM registers.
`LLM` itself needs CUDA.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.inputs import TextPrompt  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402

from digenrl_verl.rewards import judge_vllm as jv  # noqa: E402
from digenrl_verl.rewards.tiny_judge import TINY_FAMILIES, build_tiny_judge_dir  # noqa: E402
from digenrl_verl.rewards.vlm_judge import JudgeConfig, JudgePoolSpec  # noqa: E402

# the vLLM model module of each judge family (config.json model_type)
VLLM_MODULES = {family: f"vllm.model_executor.models.{family}" for family in ("qwen2_5_vl", "qwen3_vl")}


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def judge_dir(request, tmp_path_factory) -> str:
    return str(build_tiny_judge_dir(tmp_path_factory.mktemp("judges") / request.param, request.param, seed=0))


def _full(path: str, **kw) -> JudgeConfig:
    """A vllm judge config with every optional engine setting given (so every keyword `engine_kwargs` can write)."""
    return JudgeConfig(path, backend="vllm", tensor_parallel_size=2, gpu_memory_utilization=0.6, enforce_eager=True,
                       dtype="bfloat16", max_model_len=4096, max_num_seqs=64, max_num_batched_tokens=8192, seed=3,
                       pool=JudgePoolSpec(1, 2, use_gpu=True, devices_per_replica=2), **kw)


def test_llm_arguments_are_llm_parameters_or_engine_args_fields(judge_dir):
    kwargs = jv.engine_kwargs(_full(judge_dir))
    params = set(inspect.signature(LLM.__init__).parameters) - {"self", "kwargs"}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(kwargs) - params - fields == set()
    assert {"model", "tensor_parallel_size", "dtype", "gpu_memory_utilization", "enforce_eager"} <= params
    assert {"limit_mm_per_prompt", "distributed_executor_backend", "max_model_len", "max_num_seqs",
            "max_num_batched_tokens"} <= fields
    # `LLM` builds EngineArgs(model=..., **everything): the same arguments build the real dataclass
    args = EngineArgs(**kwargs)
    assert (args.tensor_parallel_size, args.gpu_memory_utilization, args.enforce_eager, args.max_model_len) == \
        (2, 0.6, True, 4096)
    assert args.limit_mm_per_prompt == {"image": 1} and args.distributed_executor_backend == "mp"
    one = jv.engine_kwargs(JudgeConfig(judge_dir, backend="vllm"))  # TP 1: vLLM picks its executor itself
    assert "distributed_executor_backend" not in one and "max_model_len" not in one
    EngineArgs(**one)


def test_sampling_params_are_genrm_ocrs(judge_dir):
    cfg = _full(judge_dir, temperature=0.7, top_p=0.8, max_new_tokens=4096)
    sampling = SamplingParams(**jv.sampling_kwargs(cfg))
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed) == (0.7, 0.8, 4096, 3)
    assert sampling.skip_special_tokens is True and sampling.n == 1
    assert SamplingParams(**jv.sampling_kwargs(JudgeConfig(judge_dir, backend="vllm"))).seed is None


def test_requests_and_outputs_have_vllms_shapes():
    from PIL import Image

    requests = jv.judge_requests("p", [Image.new("RGB", (28, 28))] * 2)
    allowed = TextPrompt.__required_keys__ | TextPrompt.__optional_keys__
    assert all(set(r) <= allowed and TextPrompt.__required_keys__ <= set(r) for r in requests)
    from vllm.inputs.llm import MultiModalDataBuiltins

    assert set(requests[0]["multi_modal_data"]) <= set(MultiModalDataBuiltins.__annotations__)
    generate = inspect.signature(LLM.generate).parameters
    assert list(generate)[1:3] == ["prompts", "sampling_params"] and "use_tqdm" in generate
    assert "outputs" in inspect.signature(RequestOutput.__init__).parameters
    assert "text" in {f.name for f in dataclasses.fields(CompletionOutput)}


def _placeholder(module: str) -> str:
    """vLLM's `get_placeholder_str("image", 0)` of a model module, run from its installed source."""
    source = Path(importlib.util.find_spec(module).origin).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "get_placeholder_str":
            node.decorator_list = []
            namespace: dict = {}
            exec(compile(ast.Module(body=[node], type_ignores=[]), module, "exec"), namespace)  # noqa: S102
            return namespace["get_placeholder_str"](None, "image", 0)
    raise AssertionError(f"{module} has no get_placeholder_str")


def test_the_judge_prompt_carries_the_placeholder_vllm_expands(judge_dir):
    from transformers import AutoConfig

    from digenrl_verl.rewards.vlm_judge import OCR_INSTRUCTION, SYSTEM_PROMPT, JudgeProcessor

    config = json.loads((Path(judge_dir) / "config.json").read_text())
    placeholder = _placeholder(VLLM_MODULES[config["model_type"]])
    prompt = JudgeProcessor(judge_dir, AutoConfig.from_pretrained(judge_dir).image_token_id).prompt(
        OCR_INSTRUCTION, SYSTEM_PROMPT)
    assert prompt.count(placeholder) == 1 and prompt.index(placeholder) < prompt.index(OCR_INSTRUCTION)
    assert prompt.startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n") and prompt.endswith("assistant\n")
    from vllm.model_executor.models.registry import ModelRegistry

    assert set(config["architectures"]) <= set(ModelRegistry.get_supported_archs())
