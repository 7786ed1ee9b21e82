"""Tokenizers for tiny test models, built in memory (nothing is downloaded).

Each builder returns a `transformers` tokenizer that round-trips through `save_pretrained` /
`from_pretrained` with the installed transformers (5.x: tokenizer classes take `vocab=` / `merges=`).

Qwen-Image and HunyuanVideo wrap every prompt in a long system template and then drop a fixed number of
leading tokens (34 and 95: the template length under the real tokenizers). A character-level tokenizer
would leave most of the template in place and push the prompt past `max_sequence_length`, so those two
tokenizers are byte-pair encoders trained on the template itself, cut at the number of merges that makes
the template prefix exactly as long as the pipeline expects. The prompt then starts right after the crop.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from transformers import CLIPTokenizer, LlamaTokenizer, PreTrainedTokenizerBase, Qwen2Tokenizer, T5Tokenizer

# tokenizers / transformers are imported inside the builders: the architecture modules import this module, and
# importing `digenrl_verl.models` must stay cheap (transformers takes seconds to import).

_PRINTABLE = [chr(c) for c in range(33, 127)]

# The system templates as the diffusers pipelines write them (kept here so the builders do not depend on
# private pipeline attributes); `tests/models` checks they still match the installed diffusers.
QWEN_IMAGE_SYSTEM = ("Describe the image by detailing the color, shape, size, texture, quantity, text, spatial "
                     "relationships of the objects and background:")  # also the system turn of verl-omni's OCR data
QWEN_IMAGE_TEMPLATE = (
    f"<|im_start|>system\n{QWEN_IMAGE_SYSTEM}<|im_end|>\n<|im_start|>user\n{{}}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
QWEN_IMAGE_DROP = 34
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The Qwen-VL turn layout (system / user / assistant turns; an image as vision_start image_pad vision_end): Qwen-Image's
# tokenizer ships Qwen2.5-VL's chat template, which verl-omni's agent loop renders a recipe's chat with (its Qwen-Image
# recipes set no custom_chat_template); for plain-text turns this one gives the same string
QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HUNYUAN_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
HUNYUAN_CROP = 95


def clip_tokenizer(model_max_length: int = 77) -> CLIPTokenizer:
    """Byte-level CLIP BPE without merges: 256 byte symbols, their `</w>` forms, start/end tokens (514)."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": len(chars) + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)


def t5_tokenizer(model_max_length: int = 512) -> T5Tokenizer:
    """Unigram over printable ASCII and `▁`+ASCII (193 pieces); serves T5 and UMT5 encoders."""
    from transformers import T5Tokenizer

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -3.0)]
    for c in _PRINTABLE:
        pieces += [(c, -2.0), ("▁" + c, -1.0)]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=model_max_length)


def _train_merges(corpus: str, pre_tokenizer: Any, alphabet: Sequence[str]) -> list[tuple[str, str]]:
    """BPE merges learned from `corpus` under `pre_tokenizer` (a `tokenizers.pre_tokenizers` object) until every
    word is one token (in learning order)."""
    from tokenizers import Tokenizer, models, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=100_000, min_frequency=1, initial_alphabet=list(alphabet), show_progress=False
    )
    tok.train_from_iterator([corpus], trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]  # type: ignore[misc]


def _fit_merges(
    make: Callable[[list[tuple[str, str]]], PreTrainedTokenizerBase],
    merges: list[tuple[str, str]],
    prefix: str,
    target: int,
) -> PreTrainedTokenizerBase:
    """The tokenizer built from the shortest merge list under which `prefix` is `target` tokens long.

    More merges never lengthen the training text, so a bisection over the merge count finds it.
    """

    def count(k: int) -> int:
        return len(make(merges[:k])(prefix).input_ids)

    lo, hi = 0, len(merges)
    if count(hi) > target:
        raise RuntimeError(f"template prefix needs more than {target} tokens even with all merges")
    while lo < hi:
        mid = (lo + hi) // 2
        if count(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    tok = make(merges[:lo])
    got = len(tok(prefix).input_ids)
    if got != target:
        raise RuntimeError(f"no merge count gives a {target}-token template prefix (closest: {got})")
    return tok


def qwen2_tokenizer() -> Qwen2Tokenizer:
    """Byte-level BPE (Qwen2 pre-tokenizer) whose Qwen-Image template prefix is exactly 34 tokens, with the Qwen-VL
    chat template (QWEN_CHAT_TEMPLATE), as Qwen-Image's tokenizer has."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    base = list(bytes_to_unicode().values())
    prefix = QWEN_IMAGE_TEMPLATE.split("{}")[0]
    corpus = prefix
    for s in QWEN_SPECIALS:
        corpus = corpus.replace(s, "\n")
    merges = _train_merges(
        corpus, pre_tokenizers.ByteLevel(add_prefix_space=False), pre_tokenizers.ByteLevel.alphabet()
    )

    def make(ms: list[tuple[str, str]]) -> Qwen2Tokenizer:
        vocab = {c: i for i, c in enumerate(base)}
        for a, b in ms:
            vocab.setdefault(a + b, len(vocab))
        tok = Qwen2Tokenizer(vocab=vocab, merges=list(ms), model_max_length=32768)
        tok.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS[1:]})
        return tok

    tok = _fit_merges(make, merges, prefix, QWEN_IMAGE_DROP)
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok  # type: ignore[return-value]


def llama_tokenizer(template: str) -> LlamaTokenizer:
    """Metaspace BPE with byte fallback whose HunyuanVideo template prefix is exactly 95 tokens (no BOS is added).

    Right padding, as HunyuanVideo's tokenizer: the pipeline crops the template from the left.
    """
    from tokenizers import pre_tokenizers
    from transformers import LlamaTokenizer

    prefix = template.split("{}")[0]
    corpus = prefix
    for s in HUNYUAN_SPECIALS:
        corpus = corpus.replace(s, " ")
    merges = _train_merges(
        corpus,
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True),
        ["▁", "\n", *_PRINTABLE],
    )
    specials = {"<unk>": 0, "<s>": 1, "</s>": 2}

    def make(ms: list[tuple[str, str]]) -> LlamaTokenizer:
        vocab = dict(specials)
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
        for c in ["▁", "\n", *_PRINTABLE]:
            vocab[c] = len(vocab)
        for a, b in ms:
            vocab.setdefault(a + b, len(vocab))
        tok = LlamaTokenizer(
            vocab=vocab, merges=list(ms), padding_side="right", model_max_length=4096, pad_token="</s>"
        )
        tok.add_special_tokens({"additional_special_tokens": HUNYUAN_SPECIALS})
        return tok

    return _fit_merges(make, merges, prefix, HUNYUAN_CROP)  # type: ignore[return-value]
