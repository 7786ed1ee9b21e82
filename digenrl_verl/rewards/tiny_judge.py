"""Tiny random-init Qwen-VL judge directories, written offline, that load through the real `from_pretrained` path.

`build_tiny_judge_dir(path, family, seed)` writes config.json + weights (`save_pretrained` of a random-init
`Qwen2_5_VLForConditionalGeneration` or `Qwen3VLForConditionalGeneration`), a byte-level Qwen2 tokenizer built in
memory (the Qwen chat and vision special tokens, no merges), a chat template with the Qwen-VL turn layout, and the
Qwen2-VL image processor config (at most 2×2 merged patches per image). Nothing is downloaded. The judge reads
such a directory exactly as it reads a real checkpoint (`rewards.vlm_judge.TransformersJudge`; on a GPU also
`rewards.judge_vllm.VllmJudge`); its answers are random text.

CLI: `python -m digenrl_verl.rewards.tiny_judge <dir> [--family qwen2_5_vl|qwen3_vl] [--seed N]`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from digenrl_verl.models._tiny_tokenizers import QWEN_CHAT_TEMPLATE

TINY_FAMILIES = ("qwen2_5_vl", "qwen3_vl")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
# The Qwen-VL turn layout, written for these tiny directories (the tiny Qwen-Image tokenizer's, as the real ones share
# it); real checkpoints ship their own template, which the judge uses instead.
CHAT_TEMPLATE = QWEN_CHAT_TEMPLATE


def tiny_tokenizer() -> Any:
    """Byte-level Qwen2 BPE without merges (256 byte symbols) plus the Qwen chat / vision special tokens."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], model_max_length=32768, unk_token=None,
                         pad_token="<|endoftext|>", eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _model(family: str, tok: Any) -> torch.nn.Module:
    ids = dict(zip(SPECIALS, tok.convert_tokens_to_ids(SPECIALS)))
    text = dict(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=4096, bos_token_id=ids["<|im_start|>"],
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]}
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16, patch_size=14,
                      fullatt_block_indexes=[0])
        return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens))
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text.update(head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                             "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16, patch_size=14,
                  num_position_embeddings=64, deepstack_visual_indexes=[1])
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision, **tokens))


def build_tiny_judge_dir(path: str | Path, family: str = "qwen2_5_vl", seed: int = 0) -> Path:
    """Write a tiny random judge directory of `family` (one of `TINY_FAMILIES`) under `path`; returns the path.
    The same (family, seed) always writes the same weights; the global RNG state is restored after."""
    from transformers import Qwen2VLImageProcessorPil

    if family not in TINY_FAMILIES:
        raise ValueError(f"build_tiny_judge_dir: unknown family {family!r}; valid: {list(TINY_FAMILIES)}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model(family, tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, min_pixels=28 * 28, max_pixels=56 * 56).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--family", default="qwen2_5_vl", choices=TINY_FAMILIES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_judge_dir(args.path, args.family, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
