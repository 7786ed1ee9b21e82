"""Prompts and data_source as the real verl-omni processes them (issue 21, part 3), against its own code.

verl-omni's dataset (`verl_omni.utils.dataset.rl_dataset.RLHFDataset`) hands the agent loop a row's chat messages
(`raw_prompt`) and its `data_source`; the agent loop renders the chat with the model tokenizer's template (or
`actor_rollout_ref.model.custom_chat_template`) and tokenizes it (`AgentLoopBase.apply_chat_template`, and
`DiffusionSingleTurnAgentLoop._tokenize_per_encoder` for `model.extra_tokenizers`); the rollout adapter encodes
those ids. Here, per model family verl-omni has a pipeline for, a verl-omni recipe's row goes through verl-omni's
dataset and tokenization, and the same row through ours (`load_prompts`: `chat_text`) and the tokenization the
diffusers pipeline applies to that text: the ids are the same. The tokenizers are the tiny in-memory ones of
`models._tiny_tokenizers` (the Qwen one gives Qwen-Image's template prefix exactly its 34 tokens), with a ChatML
template standing in for the Qwen2.5-VL tokenizer's (identical on a chat that has its system turn, as the recipe
data has). Also: the training dataloader's batches (verl-omni's create_rl_sampler, drop_last=True) and the default
reward's dispatch by data_source (verl-omni's default_compute_score_image).
"""

from __future__ import annotations

import asyncio
import pkgutil
from types import SimpleNamespace

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from digenrl_verl.models._tiny_tokenizers import (QWEN_IMAGE_TEMPLATE, clip_tokenizer,  # noqa: E402
                                                  qwen2_tokenizer, t5_tokenizer)
from digenrl_verl.rewards import get_reward  # noqa: E402
from digenrl_verl.rewards.data_source import default_reward  # noqa: E402
from digenrl_verl.trainer.data import PromptStream, load_prompts  # noqa: E402

from digenrl_verl.models._tiny_tokenizers import QWEN_IMAGE_SYSTEM as SYSTEM  # noqa: E402
# verl-omni's recipes' actor_rollout_ref.model.custom_chat_template values (examples/flowgrpo_trainer/sd35/*.sh,
# examples/dancegrpo_trainer/wan22/*.sh)
SD35_TEMPLATE = "{% for message in messages %}{% if message['role'] == 'user' %}{{ message['content'] }}{% endif %}" \
                "{% endfor %}"
WAN_TEMPLATE = '{% if messages %}{% for message in messages %}{% if message["role"] == "user" %}' \
               '{{ message["content"] }}{% endif %}{% endfor %}{% endif %}</s>'
TEXTS = ['A storefront sign that reads "OPEN 24 HOURS"', "a cat sitting on a red mat, studio light"]


def _rows(tmp_path, system: str, source: str):
    """A verl-omni recipe's parquet (its data_process scripts' layout) → (verl-omni's dataset rows, our prompts and
    data sources)."""
    from verl_omni.utils.dataset.rl_dataset import create_rl_dataset

    path = tmp_path / "train.parquet"
    pd.DataFrame({"data_source": [source] * len(TEXTS),
                  "prompt": [[{"role": "system", "content": system}, {"role": "user", "content": t}] for t in TEXTS],
                  "reward_model": [{"style": "rule", "ground_truth": ""}] * len(TEXTS)}).to_parquet(path)
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": False,
                               "cache_dir": str(tmp_path / "cache"), "shuffle": False})
    dataset = create_rl_dataset([str(path)], config, tokenizer=None, processor=None)
    return [dataset[i] for i in range(len(dataset))], load_prompts(str(path))


def _agent_loop(tokenizer, extra=None):
    """A stand-in `self` for verl-omni's agent-loop methods: the fields they read (prompt_length: data.max_prompt_length
    of the recipes, larger than these prompts)."""
    return SimpleNamespace(loop=asyncio.get_event_loop_policy().new_event_loop(), tokenizer=tokenizer, processor=None,
                           apply_chat_template_kwargs={}, extra_tokenizer_map=extra or {},
                           rollout_config=SimpleNamespace(prompt_length=512), system_prompt=[])


def _verl_omni_ids(agent, messages) -> list[int]:
    from verl_omni.agent_loop.single_turn_agent_loop import DiffusionSingleTurnAgentLoop

    return agent.loop.run_until_complete(DiffusionSingleTurnAgentLoop.apply_chat_template(agent, messages))


def test_qwen_image_the_text_encoder_gets_verl_omnis_ids(tmp_path):
    """verl-omni's Qwen-Image OCR data: [system: Qwen-Image's describe prompt, user: text], rendered by the tiny
    tokenizer's own chat template → the ids QwenImagePipeline builds around our prompt text with its own template."""
    theirs, (ours, sources) = _rows(tmp_path, SYSTEM, "flow_grpo/ocr")
    tok = qwen2_tokenizer()  # with its own chat template, as Qwen-Image's tokenizer (verl-omni's recipe sets none)
    agent = _agent_loop(tok)
    assert sources == [row["data_source"] for row in theirs] == ["flow_grpo/ocr"] * 2
    for row, text in zip(theirs, ours):
        ids = _verl_omni_ids(agent, row["raw_prompt"])
        assert ids == tok(QWEN_IMAGE_TEMPLATE.format(text))["input_ids"]  # QwenImagePipeline._get_qwen_prompt_embeds
        assert tok.decode(ids[34:]).startswith(text)  # what is left after the 34 dropped tokens


def test_sd35_the_clip_and_t5_tokenizers_get_verl_omnis_ids(tmp_path):
    """verl-omni's SD3.5 recipes: the user-only custom_chat_template, tokenized per encoder by
    model.extra_tokenizers {clip: 77, t5: 256} → the ids StableDiffusion3Pipeline's tokenizers give our text."""
    from verl_omni.agent_loop.single_turn_agent_loop import DiffusionSingleTurnAgentLoop

    theirs, (ours, _) = _rows(tmp_path, SYSTEM, "flow_grpo/ocr")
    clip, t5 = clip_tokenizer(), t5_tokenizer()
    clip.chat_template = SD35_TEMPLATE  # the model's tokenizer/ gets custom_chat_template
    agent = _agent_loop(clip, {"clip": {"tokenizer": clip, "max_length": 77}, "t5": {"tokenizer": t5,
                                                                                      "max_length": 256}})
    for row, text in zip(theirs, ours):
        per_encoder = agent.loop.run_until_complete(
            DiffusionSingleTurnAgentLoop._tokenize_per_encoder(agent, row["raw_prompt"]))
        assert per_encoder["clip"] == clip(text, max_length=77, truncation=True)["input_ids"]
        assert per_encoder["t5"] == t5(text, max_length=256, truncation=True, add_special_tokens=True)["input_ids"]


def test_wan_the_t5_encoder_gets_verl_omnis_ids(tmp_path):
    """verl-omni's Wan2.2 recipe: custom_chat_template = the user text + `</s>` → the ids WanPipeline's T5 tokenizer
    gives our text (it appends the same end token)."""
    theirs, (ours, _) = _rows(tmp_path, "", "dance_grpo/hpsv3")
    t5 = t5_tokenizer()
    t5.chat_template = WAN_TEMPLATE
    agent = _agent_loop(t5)
    for row, text in zip(theirs, ours):
        assert _verl_omni_ids(agent, row["raw_prompt"]) == t5(text, add_special_tokens=True)["input_ids"]


def test_verl_omni_has_no_flux_or_hunyuan_video_pipeline():
    """FLUX and HunyuanVideo: no verl-omni pipeline to compare with (our rule, the user text, applies)."""
    import verl_omni.pipelines as pipelines

    names = [m.name for m in pkgutil.iter_modules(pipelines.__path__)]
    assert "qwen_image_flow_grpo" in names and "sd3_flow_grpo" in names and "wan22_dance_grpo" in names
    assert not [n for n in names if "flux" in n or "hunyuan" in n]


def test_the_training_batches_are_verl_omnis_dataloaders():
    """verl-omni's create_rl_sampler (data.shuffle, data.seed) in a StatefulDataLoader with drop_last=True, as its
    trainers build it, over 4 epochs: the same batches as PromptStream's steps."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl_omni.utils.dataset.rl_dataset import create_rl_sampler

    for n, batch, seed, shuffle in ((13, 4, 42, True), (10, 5, 3, True), (7, 2, 0, False)):
        items = list(range(n))
        sampler = create_rl_sampler(OmegaConf.create({"shuffle": shuffle, "seed": seed}), items)
        loader = StatefulDataLoader(dataset=items, batch_size=batch, num_workers=0, drop_last=True,
                                    collate_fn=lambda rows: rows, sampler=sampler)
        theirs = [b for _ in range(4) for b in loader]
        stream = PromptStream([str(i) for i in items], ["s"] * n, batch, seed=seed, shuffle=shuffle)
        assert [[int(p) for p in stream.next_batch()[0]] for _ in theirs] == theirs


@pytest.mark.parametrize("source", ["jpeg_compressibility", "flow_grpo/ocr", "dance_grpo/hpsv3", "builtin"])
def test_the_default_reward_scores_the_sources_verl_omnis_default_scores(source):
    """verl-omni's default_compute_score_image raises NotImplementedError exactly for the sources default_reward
    refuses; where it scores, the score is our routed reward's."""
    from verl_omni.utils.reward_score import default_compute_score_image

    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    try:
        theirs = default_compute_score_image(source, image, ground_truth="")
    except NotImplementedError:
        with pytest.raises(ValueError, match=f"data_source '{source}'"):
            default_reward({source: 1}, 0)
        return
    weights, _ = default_reward({source: 1}, 0)
    (name,) = weights
    ours = float(get_reward(name).score(image[None], [""])[0])
    assert ours == pytest.approx(float(theirs["score"] if isinstance(theirs, dict) else theirs), rel=1e-6)
