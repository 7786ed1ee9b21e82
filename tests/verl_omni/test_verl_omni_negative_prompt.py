"""The negative prompt of verl-omni's Qwen-Image data (issue 30), against its own code: its OCR data
(`examples/flowgrpo_trainer/data_process/qwenimage_ocr.py`) gives each row a `negative_prompt` chat (system turn +
user `" "`); its dataset hands it on as `raw_negative_prompt` (`RLHFDataset.__getitem__`), verl's collate function
puts it in the batch, and `DiffusionSingleTurnAgentLoop.run` renders it with the model tokenizer's chat template
(`AgentLoopBase.apply_chat_template`) into the `negative_prompt_ids` it sends the vLLM-Omni server, whose Qwen-Image
rollout adapter encodes them for true CFG.

Here that chain runs for real (the dataset, the collate function, the agent loop's `run` with a stand-in server
manager that records the request) on a parquet file in that layout, and the flag's run is built from the same file
(`build_run`, tiny Qwen-Image model, true_cfg_scale=4): the negative text the run takes, rendered as the flag's two
Qwen-Image generators render it (diffusers' `QwenImagePipeline` template and tokenizer from the run's model
directory; verl-omni's own `_tokenize_text_prompt` behind `integrations.verl_omni_rollout._qwen_fields`), gives
verl-omni's ids for every row. No model runs.
"""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import tiny_qwen_dir  # noqa: E402

from digenrl_verl.main import TINY_CPU, compose  # noqa: E402
from digenrl_verl.models._tiny_tokenizers import QWEN_IMAGE_DROP  # noqa: E402
from digenrl_verl.models._tiny_tokenizers import QWEN_IMAGE_SYSTEM as SYSTEM  # noqa: E402
from digenrl_verl.trainer.config import build_run  # noqa: E402

A = "actor_rollout_ref"
WORDS = ("HELLO", "RL", "GPU")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> str:
    return tiny_qwen_dir(tmp_path_factory, "negative_prompt_qwen")


def _ocr_parquet(path) -> str:
    """verl-omni's qwenimage_ocr.py layout: prompt and negative_prompt chats, each with Qwen-Image's system turn."""
    pd.DataFrame([{"data_source": "jpeg_compressibility",
                   "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f'A sign "{w}"'}],
                   "negative_prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": " "}],
                   "reward_model": {"style": "rule", "ground_truth": w}} for w in WORDS]).to_parquet(path)
    return str(path)


def _verl_omnis_negative_ids(path: str, tokenizer) -> list[list[int]]:
    """Each row's `negative_prompt_ids` as verl-omni's agent loop sends them to its vLLM-Omni server."""
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl_omni.agent_loop.single_turn_agent_loop import DiffusionSingleTurnAgentLoop
    from verl_omni.utils.dataset.rl_dataset import create_rl_dataset

    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": False})
    dataset = create_rl_dataset([path], config, tokenizer=tokenizer, processor=None)
    batch = collate_fn([dataset[i] for i in range(len(dataset))])  # the non-tensor batch: object arrays
    sent: list[dict] = []

    async def generate(**request):
        sent.append(request)
        return SimpleNamespace(diffusion_output=torch.zeros(3, 2, 2, dtype=torch.uint8), log_probs=None,
                               num_preempted=None, extra_fields={})

    agent = object.__new__(DiffusionSingleTurnAgentLoop)  # the fields its `run` reads (the worker sets them)
    agent.__dict__.update(loop=asyncio.new_event_loop(), tokenizer=tokenizer, processor=None,
                          apply_chat_template_kwargs={}, extra_tokenizer_map={}, system_prompt=[],
                          rollout_config=SimpleNamespace(prompt_length=512),
                          server_manager=SimpleNamespace(generate=generate))
    for i in range(len(dataset)):
        row = {k: v[i] for k, v in batch.items() if not isinstance(v, torch.Tensor)}
        agent.loop.run_until_complete(agent.run({}, **row))
    agent.loop.close()
    return [list(r["negative_prompt_ids"]) for r in sent]


def test_the_flags_negative_prompt_gives_verl_omnis_negative_ids(qwen_dir, tmp_path):
    from diffusers import QwenImagePipeline
    from verl_omni.pipelines.qwen_image_flow_grpo.vllm_omni_rollout_adapter import QwenImagePipelineWithLogProb

    from digenrl_verl.integrations.verl_omni_rollout import _qwen_fields

    path = _ocr_parquet(tmp_path / "train.parquet")
    spec = build_run(compose([TINY_CPU, f"{A}.model.path={qwen_dir}", f"data.train_files={path}",
                              "data.train_batch_size=3", f"{A}.rollout.pipeline.true_cfg_scale=4.0"]))
    negative = spec.policy.pipeline.negative_prompt
    pipe = QwenImagePipeline.from_pretrained(qwen_dir, transformer=None, vae=None, text_encoder=None)
    theirs = _verl_omnis_negative_ids(path, pipe.tokenizer)  # the run's model tokenizer, its chat template
    assert len(theirs) == len(WORDS)
    # the package's generator: diffusers' encode_prompt tokenizes its template around the text
    ours = pipe.tokenizer(pipe.prompt_template_encode.format(negative))["input_ids"]
    assert theirs == [ours] * len(WORDS)
    assert pipe.tokenizer.decode(ours[QWEN_IMAGE_DROP:]).startswith(" <|im_end|>")  # what the encoder keeps
    # the flag's vLLM-Omni generator: verl-omni's adapter tokenizes the text (its template, as its dummy run does)
    adapter = SimpleNamespace(prompt_template_encode=pipe.prompt_template_encode, tokenizer=pipe.tokenizer,
                              tokenizer_max_length=1024, prompt_template_encode_start_idx=QWEN_IMAGE_DROP,
                              device="cpu")
    adapter._tokenize_text_prompt = types.MethodType(QwenImagePipelineWithLogProb._tokenize_text_prompt, adapter)
    assert _qwen_fields(adapter, "a sign", negative, 32)["negative_prompt_ids"] == theirs[0]
    assert any(d.startswith(f"negative prompt: {negative!r}, the user text of every row's 'negative_prompt' chat")
               for d in spec.decisions), spec.decisions  # the plan says where it came from


def test_without_the_column_verl_omni_sends_no_negative_and_the_flag_keeps_its_key(qwen_dir, tmp_path):
    """The other side of the rule: no column, no `raw_negative_prompt` (verl-omni's Qwen-Image adapter then runs no
    true CFG); the flag keeps `rollout.pipeline.negative_prompt` (today's behaviour, said in the plan)."""
    from verl_omni.utils.dataset.rl_dataset import create_rl_dataset

    path = tmp_path / "train.parquet"
    pd.read_parquet(_ocr_parquet(path)).drop(columns=["negative_prompt"]).to_parquet(path)
    config = OmegaConf.create({"prompt_key": "prompt", "filter_overlong_prompts": False})
    assert "raw_negative_prompt" not in create_rl_dataset([str(path)], config, tokenizer=None, processor=None)[0]
    spec = build_run(compose([TINY_CPU, f"{A}.model.path={qwen_dir}", f"data.train_files={path}",
                              "data.train_batch_size=3", f"{A}.rollout.pipeline.true_cfg_scale=4.0"]))
    assert spec.policy.pipeline.negative_prompt == ""
    assert f"negative prompt: {A}.rollout.pipeline.negative_prompt='' (no prompt file" in "\n".join(spec.decisions)
