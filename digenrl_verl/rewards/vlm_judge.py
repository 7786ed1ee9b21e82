"""A generative VLM judge as a reward: verl-omni's `reward.reward_model.enable=True` OCR reward.

verl-omni (a1139baf) serves its reward model (`reward.reward_model.model_path`, a Qwen-VL chat model) as vLLM
replicas behind an OpenAI-compatible router (`reward.reward_model.rollout.name=vllm`), on the training GPUs or, with
`reward.reward_model.enable_resource_pool=True`, on a reward pool of its own (`n_gpus_per_node` x `nnodes` GPUs,
`world_size // tensor_model_parallel_size` replicas); its reward function `genrm_ocr.compute_score_ocr` sends each
image with a fixed instruction ("output only the text content from the image"), reads the transcription, and scores
it against the ground truth with a normalised Levenshtein distance.

Here the judge is a backend behind one interface (`JudgeBackend.transcribe`: PIL images in, answers out), chosen
by `reward.reward_model.rollout.name` (`JudgeConfig.backend`): `transformers` (`TransformersJudge`, transformers'
`generate`, CPU or GPU) or `vllm` (`rewards.judge_vllm.VllmJudge`, `vllm.LLM`, CUDA only). Where it runs is
`JudgeConfig.pool`: None = in-process in each worker that scores (the generators); a `JudgePoolSpec` = replicas as
Ray actors (`workers.judge.JudgePool`), in a pool of their own or colocated on the worker pools' GPUs (a vLLM judge of
`tensor_model_parallel_size` > 1 without a pool, as verl-omni's Qwen-Image OCR recipes serve it), which the scoring
workers reach through `workers.judge.RemoteJudge`, a backend too.

What is kept from verl-omni's recipe: the chat (system "You are a helpful assistant.", user = image + instruction),
the sampling (temperature 0.7, top-p 0.8, no top-k, at most 4096 new tokens, no seed; the same
`GENRM_OCR_TEMPERATURE`, `GENRM_OCR_TOP_P`, `GENRM_OCR_MAX_TOKENS`, `GENRM_OCR_SEED` environment overrides, read by
`JudgeConfig.with_env_overrides` in the driver), the score (`judge_ocr_score`), video frames judged one by one
every `frame_interval` frames and averaged. The target is the sample's ground truth (`reward_model.ground_truth`),
else the quoted text of the prompt (`rewards.ocr.ocr_target`).

Inputs are prepared with the model's own tokenizer, chat template and image processor; the processor step that
expands each image placeholder into one token per merged patch is done here (`JudgeProcessor`), because
transformers' Qwen-VL processor classes need torchvision (their video processor) even for images (vLLM expands the
placeholder itself). Supported families (config.json `model_type`): `JUDGE_FAMILIES`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch
from PIL import Image

from digenrl_verl.rewards.base import Reward, as_frames
from digenrl_verl.rewards.ocr import levenshtein, ocr_target

KEY_ENABLE = "reward.reward_model.enable"
KEY_MODEL_PATH = "reward.reward_model.model_path"
KEY_BACKEND = "reward.reward_model.rollout.name"
KEY_POOL = "reward.reward_model.enable_resource_pool"
KEY_TP = "reward.reward_model.rollout.tensor_model_parallel_size"
#: the judge's backends (`reward.reward_model.rollout.name`; null means transformers, this plugin's default)
JUDGE_BACKENDS = ("transformers", "vllm")
#: vLLM for the `vllm` judge backend: the `[vllm]` extra (its pin: engines.base.VLLM_PIN), held to the real package
#: by tests/contract/test_contract_vllm_judge_on_cpu.py
VLLM_INSTALL_HINT = "pip install 'digenrl-verl[vllm]' on a CUDA machine"
#: the reward name of the judge's OCR score (verl-omni's `genrm_ocr.compute_score_ocr`)
JUDGE_REWARD = "genrm_ocr"
#: verl-omni's judge-backed OCR reward function (file name, function name): with reward.reward_model.enable=True it
#: asks the served judge; here `VLMJudgeReward` scores in its place (the file is not loaded)
JUDGE_FUNCTION = ("genrm_ocr.py", "compute_score_ocr")
#: config.json `model_type`s whose chat template and image processor `JudgeProcessor` handles
JUDGE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
OCR_INSTRUCTION = "Please output only the text content from the image without any additional descriptions or " \
                  "formatting."
SYSTEM_PROMPT = "You are a helpful assistant."
#: verl-omni's environment overrides of the judge's sampling (genrm_ocr), field -> (variable, parser)
SAMPLING_ENV = {"temperature": ("GENRM_OCR_TEMPERATURE", float), "top_p": ("GENRM_OCR_TOP_P", float),
                "max_new_tokens": ("GENRM_OCR_MAX_TOKENS", int), "seed": ("GENRM_OCR_SEED", int)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_judge_function(path: str, function: str) -> bool:
    """True for verl-omni's judge-backed OCR reward function (`JUDGE_FUNCTION`), named by its file and function."""
    return (os.path.basename(str(path)), function) == JUDGE_FUNCTION


def resolve_judge_path(path: str) -> str:
    """A local directory as given, or a Hugging Face model id resolved from the local cache (nothing is
    downloaded); ValueError naming `reward.reward_model.model_path` and the fix otherwise."""
    if not path:
        raise ValueError(f"{KEY_ENABLE}=True needs {KEY_MODEL_PATH}: a local model directory or a cached Hugging "
                         "Face id (e.g. Qwen/Qwen2.5-VL-3B-Instruct); build a tiny one with `python -m "
                         "digenrl_verl.rewards.tiny_judge <dir>`")
    p = Path(os.path.expanduser(path))
    if p.is_dir():
        return str(p)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(path, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError) as err:
        raise ValueError(f"{KEY_ENABLE}=True: {KEY_MODEL_PATH}={path!r} is neither a local directory nor a model in "
                         f"the Hugging Face cache ({type(err).__name__}); download it first (`hf download {path}`), "
                         f"give a local directory, or set {KEY_ENABLE}=false") from None


def judge_family(path: str) -> str:
    """The `model_type` of a judge directory, checked against `JUDGE_FAMILIES` (ValueError naming the key)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise ValueError(f"{KEY_MODEL_PATH}={path!r} has no config.json: not a transformers model directory")
    family = json.loads(cfg.read_text()).get("model_type")
    if family not in JUDGE_FAMILIES:
        raise ValueError(f"{KEY_MODEL_PATH}={path!r} is a {family!r} model; the VLM judge supports the Qwen-VL chat "
                         f"families {list(JUDGE_FAMILIES)} (verl-omni's OCR recipes use Qwen2.5-VL / Qwen3-VL)")
    return family


@dataclass(frozen=True)
class JudgePoolSpec:
    """Where the judge's replicas run: its own Ray pool (`reward.reward_model.enable_resource_pool=True`, verl-omni's
    `reward_pool`), or, `colocated`, on the worker pools' own devices (verl-omni's `global_pool` placement of the
    reward model when `enable_resource_pool=false` and a replica spans several GPUs).

    `nnodes` x `per_node` devices (GPUs, or CPU worker processes with `use_gpu=False`); each replica of the judge
    takes `devices_per_replica` devices of one node (vLLM's tensor_parallel_size; 1 for transformers in its own pool),
    so there are `per_node // devices_per_replica` replicas per node, as verl's RewardModelManager counts them (world
    size // replica size; the remainder stays unused). A colocated replica reserves nothing from Ray: it shares the
    GPUs of the workers on its node (`workers.judge.JudgePool.start_colocated`)."""

    nnodes: int
    per_node: int
    use_gpu: bool = False
    devices_per_replica: int = 1
    colocated: bool = False

    def __post_init__(self) -> None:
        for key, value in (("reward.reward_model.nnodes", self.nnodes),
                           ("reward.reward_model.n_gpus_per_node", self.per_node)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r} must be an integer >= 1 with {KEY_POOL}=True (the reward pool is "
                                 "n_gpus_per_node x nnodes devices)")
        if not 1 <= self.devices_per_replica <= self.per_node:
            raise ValueError(f"{KEY_TP}={self.devices_per_replica}: a judge replica needs that many devices of one "
                             f"node, reward.reward_model.n_gpus_per_node={self.per_node} has fewer; raise "
                             f"n_gpus_per_node or lower {KEY_TP}")

    @property
    def replicas_per_node(self) -> int:
        return self.per_node // self.devices_per_replica

    @property
    def replicas(self) -> int:
        return self.nnodes * self.replicas_per_node

    @property
    def unused_per_node(self) -> int:
        return self.per_node - self.replicas_per_node * self.devices_per_replica

    def bundle(self) -> dict[str, float]:
        """The Ray placement bundle of one replica: one CPU, and its GPUs on a GPU pool."""
        return {"CPU": 1.0, "GPU": float(self.devices_per_replica)} if self.use_gpu else {"CPU": 1.0}

    def describe(self) -> str:
        unit = "GPU(s)" if self.use_gpu else "CPU worker process(es)"
        unused = f", {self.unused_per_node} {unit} per node unused" if self.unused_per_node else ""
        where = " of the worker pools (shared with their workers)" if self.colocated else ""
        return (f"{self.replicas} judge replica(s) of {self.devices_per_replica} {unit} on {self.nnodes} node(s) x "
                f"{self.per_node}{where}{unused}")


@dataclass(frozen=True)
class JudgeConfig:
    """Args:
        model_path: a local directory (resolve ids with `resolve_judge_path` first).
        instruction, system_prompt: the judge's chat (verl-omni's genrm_ocr text by default).
        temperature, top_p, max_new_tokens, seed: sampling (genrm_ocr's defaults; seed None = unseeded, as there).
        micro_batch_size: images per `generate` call.
        device: "auto" (the worker's GPU when it has one, else CPU), "cpu" or "cuda".
        dtype: "auto" (bfloat16 on GPU, float32 on CPU), or one of `DTYPES`.
        backend: one of `JUDGE_BACKENDS` (`reward.reward_model.rollout.name`).
        tensor_parallel_size, gpu_memory_utilization, enforce_eager, max_model_len, max_num_seqs,
            max_num_batched_tokens: the vLLM engine's settings (`reward.reward_model.rollout.*`; backend `vllm`
            only, `tensor_parallel_size` 1 otherwise).
        pool: where the replicas run (the judge's own Ray pool, or colocated on the worker pools' devices), or None
            (in-process in every worker that scores).
    """

    model_path: str
    instruction: str = OCR_INSTRUCTION
    system_prompt: str = SYSTEM_PROMPT
    temperature: float = 0.7
    top_p: float = 0.8
    max_new_tokens: int = 4096
    seed: int | None = None
    micro_batch_size: int = 8
    device: str = "auto"
    dtype: str = "auto"
    backend: str = "transformers"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = False
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    pool: JudgePoolSpec | None = None

    def __post_init__(self) -> None:
        if self.backend not in JUDGE_BACKENDS:
            raise ValueError(f"unknown {KEY_BACKEND}={self.backend!r}; valid: {list(JUDGE_BACKENDS)} (null: "
                             "transformers)")
        if self.tensor_parallel_size < 1 or (self.backend != "vllm" and self.tensor_parallel_size != 1):
            raise ValueError(f"{KEY_TP}={self.tensor_parallel_size}: the {self.backend} judge holds one whole model "
                             "per replica (1); tensor parallelism is the vllm backend's")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"reward.reward_model.rollout.gpu_memory_utilization={self.gpu_memory_utilization} must "
                             "be in (0, 1]")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"reward.reward_model.rollout.{name}={value} must be >= 1 or null")
        if self.backend == "vllm" and self.pool is None and self.tensor_parallel_size != 1:
            raise ValueError(f"{KEY_TP}={self.tensor_parallel_size} with {KEY_POOL}=false: the vLLM judge would run "
                             "in each scoring worker, on that worker's one device; set it to 1, give the config "
                             "colocated replicas (JudgePoolSpec(colocated=True), what the verl-omni adapter builds), "
                             f"or set {KEY_POOL}=true (the reward pool gives each replica {self.tensor_parallel_size} "
                             "GPUs)")
        if self.pool is not None and (self.pool.use_gpu or not self.pool.colocated) and \
                self.pool.devices_per_replica != (self.tensor_parallel_size if self.pool.use_gpu else 1):
            raise ValueError(f"JudgeConfig: a replica of the pool takes {self.pool.devices_per_replica} device(s), "
                             f"{KEY_TP}={self.tensor_parallel_size}")
        if not self.model_path:
            raise ValueError(f"JudgeConfig: model_path is empty; set {KEY_MODEL_PATH}")
        if self.max_new_tokens < 1 or self.micro_batch_size < 1:
            raise ValueError(f"JudgeConfig: max_new_tokens={self.max_new_tokens} and micro_batch_size="
                             f"{self.micro_batch_size} must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"JudgeConfig: temperature={self.temperature} must be >= 0 and top_p={self.top_p} in "
                             "(0, 1]")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"JudgeConfig: device={self.device!r}; valid: ['auto', 'cpu', 'cuda']")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"JudgeConfig: dtype={self.dtype!r}; valid: {['auto', *DTYPES]}")

    def with_env_overrides(self, environ: Mapping[str, str] | None = None) -> "JudgeConfig":
        """A copy with verl-omni's `GENRM_OCR_*` sampling overrides applied (`SAMPLING_ENV`)."""
        environ = os.environ if environ is None else environ
        found = {}
        for name, (var, parse) in SAMPLING_ENV.items():
            if environ.get(var) is not None:
                try:
                    found[name] = parse(environ[var])
                except ValueError:
                    raise ValueError(f"{var}={environ[var]!r} is not a valid {parse.__name__}") from None
        return replace(self, **found)

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]


def judge_ocr_score(text: str, target: str) -> float:
    """verl-omni's genrm_ocr score: whitespace removed, lower case; 1 when the target appears in the text, else
    1 − min(Levenshtein, len(target)) / len(target); an empty target scores 1 only for an empty text."""
    gt = "".join(target.split()).lower()
    got = "".join(text.split()).lower()
    if not gt:
        return 1.0 if not got else 0.0
    dist = 0 if gt in got else min(levenshtein(got, gt), len(gt))
    return 1.0 - dist / len(gt)


def _chat_template(path: Path, tokenizer: Any) -> str:
    """The processor's chat template of a checkpoint (chat_template.jinja / .json), else the tokenizer's."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    if (path / "chat_template.json").is_file():
        return json.loads((path / "chat_template.json").read_text())["chat_template"]
    if tokenizer.chat_template:
        return tokenizer.chat_template
    raise ValueError(f"{KEY_MODEL_PATH}={str(path)!r} has no chat template (chat_template.jinja / .json, or the "
                     "tokenizer's)")


class JudgeProcessor:
    """Chat messages + PIL images → the judge's model inputs (input_ids, attention_mask, pixel_values,
    image_grid_thw), with the checkpoint's tokenizer (left padding), chat template and image processor."""

    def __init__(self, path: str, image_token_id: int) -> None:
        from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
        self.chat_template = _chat_template(Path(path), self.tokenizer)
        self.image_token = self.tokenizer.convert_ids_to_tokens(image_token_id)

    def messages(self, instruction: str, system_prompt: str) -> list[dict[str, Any]]:
        """verl-omni's judge chat for one image (the image itself goes to the image processor)."""
        return [{"role": "system", "content": system_prompt},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}]

    def prompt(self, instruction: str, system_prompt: str) -> str:
        """The chat for one image as text, with the template's single image placeholder not expanded (what vLLM
        takes with the image as `multi_modal_data`; it expands the placeholder itself)."""
        chat = self.tokenizer.apply_chat_template(self.messages(instruction, system_prompt),
                                                  chat_template=self.chat_template, add_generation_prompt=True,
                                                  tokenize=False)
        if chat.count(self.image_token) != 1:
            raise ValueError(f"the judge's chat template wrote {chat.count(self.image_token)} image placeholders "
                             f"({self.image_token!r}) for one image")
        return chat

    def __call__(self, images: Sequence[Any], instruction: str, system_prompt: str) -> dict[str, torch.Tensor]:
        vision = self.image_processor(images=list(images), return_tensors="pt")
        grid = vision["image_grid_thw"]
        per_image = (grid.prod(-1) // self.image_processor.merge_size ** 2).tolist()
        head, tail = self.prompt(instruction, system_prompt).split(self.image_token)
        texts = [head + self.image_token * n + tail for n in per_image]
        text = self.tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")  # template has them
        return {"input_ids": text["input_ids"], "attention_mask": text["attention_mask"],
                "pixel_values": vision["pixel_values"], "image_grid_thw": grid}


class JudgeBackend(Protocol):
    """What the judge reward needs from a judge: one answer per image (PIL RGB), in order."""

    def transcribe(self, images: Sequence[Any]) -> list[str]:
        ...


_BACKENDS: dict[str, Callable[[JudgeConfig], JudgeBackend]] = {}


def register_judge_backend(name: str) -> Callable[[type], type]:
    """Class decorator binding a name of `JUDGE_BACKENDS` to the class built from a `JudgeConfig` (once)."""

    def bind(cls: type) -> type:
        if name not in JUDGE_BACKENDS or name in _BACKENDS:
            raise ValueError(f"judge backend {name!r}: not one of {list(JUDGE_BACKENDS)} or bound twice")
        _BACKENDS[name] = cls
        return cls

    return bind


def judge_backend_unavailable(name: str) -> str | None:
    """Why the judge backend `name` cannot run in this process (packages found, never imported), or None."""
    if name != "vllm":
        return None
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (vLLM's LLM engine has no CPU execution path here)"
    return None


def make_judge_backend(cfg: JudgeConfig) -> JudgeBackend:
    """The in-process judge `cfg.backend` names (`rewards.judge_vllm` binds `vllm` when imported: `rewards`
    imports it)."""
    if cfg.backend not in _BACKENDS:
        raise ValueError(f"{KEY_BACKEND}={cfg.backend!r} has no judge class bound; bound: {sorted(_BACKENDS)}")
    return _BACKENDS[cfg.backend](cfg)


@register_judge_backend("transformers")
class TransformersJudge:
    """The judge model in this process: transcribes images with transformers' `generate`."""

    def __init__(self, cfg: JudgeConfig) -> None:
        from transformers import AutoConfig, AutoModelForImageTextToText

        judge_family(cfg.model_path)
        self.cfg = cfg
        self.device = cfg.torch_device()
        model_cfg = AutoConfig.from_pretrained(cfg.model_path)
        self.processor = JudgeProcessor(cfg.model_path, model_cfg.image_token_id)
        self.model = AutoModelForImageTextToText.from_pretrained(cfg.model_path,
                                                                 dtype=cfg.torch_dtype(self.device)).to(self.device)
        self.model.eval()

    @torch.no_grad()
    def transcribe(self, images: Sequence[Any]) -> list[str]:
        """The judge's answer for each PIL image, `micro_batch_size` images per `generate` call."""
        out: list[str] = []
        for i in range(0, len(images), self.cfg.micro_batch_size):
            out += self._generate(images[i:i + self.cfg.micro_batch_size])
        return out

    def _generate(self, images: Sequence[Any]) -> list[str]:
        cfg = self.cfg
        inputs = {k: v.to(self.device) for k, v in self.processor(images, cfg.instruction, cfg.system_prompt).items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        sample = cfg.temperature > 0
        kwargs = dict(max_new_tokens=cfg.max_new_tokens, do_sample=sample,
                      pad_token_id=self.processor.tokenizer.pad_token_id)
        if sample:
            kwargs.update(temperature=cfg.temperature, top_p=cfg.top_p, top_k=None)
        if cfg.seed is None:
            ids = self.model.generate(**inputs, **kwargs)
        else:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(cfg.seed)
                ids = self.model.generate(**inputs, **kwargs)
        new = ids[:, inputs["input_ids"].shape[1]:]
        return self.processor.tokenizer.batch_decode(new, skip_special_tokens=True)


class VLMJudgeReward(Reward):
    """verl-omni's genrm_ocr reward: the mean `judge_ocr_score` of the judged frames.

    `judge`: the backend that answers (None: the in-process one `cfg.backend` names; a judge in its own pool,
    `cfg.pool`, is reached through the backend the worker gives, `workers.judge.RemoteJudge`).
    Images are judged whole; a video every `extra_info["frame_interval"]` frames (default 4, as verl-omni)."""

    name = JUDGE_REWARD

    def __init__(self, cfg: JudgeConfig, judge: JudgeBackend | None = None) -> None:
        if judge is None and cfg.pool is not None:
            where = f"as colocated replicas ({KEY_TP} > 1, {KEY_POOL}=false)" if cfg.pool.colocated else \
                f"in its own pool ({KEY_POOL}=True)"
            raise RuntimeError(f"the judge runs {where}, and this worker was given no handle to it "
                               "(workers.judge.RemoteJudge)")
        self.judge = judge if judge is not None else make_judge_backend(cfg)
        self.last_answers: list[str] = []

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              extra: Sequence[Mapping[str, Any]] | None = None) -> torch.Tensor:
        video = images.ndim == 5
        frames, extra = as_frames(images, prompts, extra)
        targets = [ocr_target(p, e) for p, e in zip(prompts, extra)]  # before the judge runs: fail fast
        owner, pil = [], []
        for row, (clip, e) in enumerate(zip(frames, extra)):
            step = int((e.get("extra_info") or {}).get("frame_interval", 4 if video else 1))
            for frame in clip[::max(step, 1)]:
                owner.append(row)
                pil.append(Image.fromarray(frame.permute(1, 2, 0).contiguous().numpy(), "RGB"))
        self.last_answers = self.judge.transcribe(pil)
        total = torch.zeros(len(prompts), dtype=torch.float64)
        count = torch.zeros(len(prompts), dtype=torch.float64)
        for row, answer in zip(owner, self.last_answers):
            total[row] += judge_ocr_score(answer, targets[row])
            count[row] += 1
        return (total / count).to(torch.float32)
