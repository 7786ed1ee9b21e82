"""The vLLM-Omni rollout engine (`actor_rollout_ref.rollout.name=vllm_omni`): GPU only.

What ran where (honestly):

* **Held to the real vLLM-Omni code on CPU** (the contract tier, `tests/contract/`, run by
  `scripts/test_contract.sh` in a second venv with the pinned vllm / vllm-omni): the exact engine kwargs this
  module passes, through vLLM-Omni's own config resolver (`OmniDiffusionConfig.from_kwargs`, execution-mode
  check); the pipeline class through vLLM-Omni's model loader on a tiny model directory (bf16 default dtype,
  `weights_sources`, `load_weights`); the engine's warm-up request; real `DiffusionRequestBatch`es through
  `forward`; the output through the engine's post-processing and formatter and the msgpack serializer; the
  worker-extension class resolution (`re_init_pipeline` kept); `collective_rpc` results and error dicts as
  vLLM-Omni's stage clients build them; RPC arguments through the msgpack hop; the MASTER_PORT precedence;
  the lazy `AsyncOmni(**kwargs)` start from inside `generate` / `receive_weights` / `checksum` on the engine's
  loop, as far as CPU goes (vLLM-Omni's stage-config resolution: no platform on CPU).
* **Never ran** (no GPU while this was written): a started `AsyncOmni` and its worker processes, the NCCL
  weight group on GPU, and the bucketed CUDA-IPC hand-over of full weights (`verl`'s `BucketedWeightSender` /
  `BucketedWeightReceiver`). They follow vLLM-Omni's code as read in the pinned wheel and verl 0.9.1's proven
  trainer -> rollout path; tests/gpu runs them when a GPU is there.

Importing this module is cheap and safe everywhere: vLLM-Omni is imported only when an `AsyncOmni` client, the
pipeline class (`DigenRLOmniPipeline`) or the worker extension (`DigenRLWorkerExtension`) is built; the last two
resolve lazily through the module's `__getattr__`, which is how vLLM-Omni's `resolve_obj_by_qualname` finds
them. Selecting the engine in the config is validated without this module (`engines.base.VLLM_OMNI`).

Design (what makes this backend produce the same training data as the diffusers path):

* **One SDE module.** The custom pipeline does not re-implement the sampler: `TrajectoryPipelineCore` calls
  `digenrl_verl.diffusion.rollout.rollout` (the function the diffusers generator and TAG use) on our
  `DiffusionAdapter`, loaded inside the vLLM-Omni worker. The trainer recomputes old log-probs whenever the
  engine is not `diffusers` (the config's `recompute_old_log_probs`).
* **One request per prompt** with `num_outputs_per_prompt` = that prompt's samples on this rank; the pipeline
  runs one request at a time (`supports_request_batch = False`, so vLLM-Omni needs `max_num_seqs=1`: the
  batching is inside a request, over the prompt's samples).
* **RL knobs through `extra_args["digenrl"]`**; requests without it (vLLM-Omni's start-up warm-up) are answered
  with `DiffusionOutput(output=None)`.
* **The output** is vLLM-Omni's envelope, `DiffusionOutput(output={"payload": {"image" | "video": uint8},
  "metadata": {"rl": record}}, trajectory_*=..., to_cpu=True)`; `model_class_name="DigenRLOmniPipeline"` keeps
  vLLM-Omni from attaching the architecture's own post-processor to it.
* **Weights.** torch.distributed is already initialised for vLLM's own world inside a vLLM worker, so the
  worker never joins our groups: the generator *actor* joins the trainer -> generator group (`weights.sync`,
  NCCL on GPU) and hands the received tensors into the engine, by `collective_rpc` for LoRA-sized states
  (`RPC_WEIGHTS_MAX_BYTES`; tensors cross vLLM-Omni's msgpack hop) and by bucketed CUDA IPC for full weights.
  The worker stages them; they apply only when no request is in flight, so a trajectory carries one version.
* **A free MASTER_PORT per engine**: the actor inherits verl's worker-group `MASTER_PORT`, which vLLM-Omni reads
  before its own `master_port`; each engine sets a fresh one before it starts.

Tensors produced by `outputs_to_batch` (an `engines.base.Rollout`, as the diffusers engine returns):
latents / next_latents fp32 [B, K, *latent], sigmas / next_sigmas fp32 [B, K], log_probs and
rollout_log_probs fp32 [B, K], step_index int64 [B, K], final_latents fp32 [B, *latent], sample_id int64 [B],
policy_version int64 [B]; images (responses) uint8 [B, 3, H, W] or [B, T, 3, H, W].

Pins (`engines.base.VLLM_PIN` / `VLLM_OMNI_PIN`, the `[vllm]` extra): vllm 0.28.0 + vllm-omni 0.28.0, which
resolve with verl 0.9.1; verl-omni's pair, vllm 0.27.0 + vllm-omni 0.27.0rc1, also works (both are run by the
contract tier).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import uuid
import warnings
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, Trajectory, rollout
from digenrl_verl.engines.base import (BACKEND_KEY, ENGINES, VLLM_OMNI, VLLM_OMNI_PIN, VLLM_PIN, Rollout,
                                       RolloutRows)
from digenrl_verl.engines.spec import PolicySpec
from digenrl_verl.models.base import DiffusionAdapter
from digenrl_verl.models.config import LoraConfig, PipelineConfig
from digenrl_verl.models.registry import load_adapter
from digenrl_verl.weights.state import load_weights_file
from digenrl_verl.weights.sync import CollectiveSpec, Collectives, free_port, state_checksum

__all__ = ["BACKEND_KEY", "VLLM_OMNI_PIN", "VLLM_PIN", "InProcessOmniEngine", "VllmOmniEngine",
           "require_vllm_omni", "unavailable_reason"]

ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm_omni"
PIPELINE_NAME = "DigenRLOmniPipeline"
PIPELINE_CLASS = f"digenrl_verl.engines.vllm_omni.{PIPELINE_NAME}"
WORKER_EXTENSION_CLASS = "digenrl_verl.engines.vllm_omni.DigenRLWorkerExtension"
#: engine kwargs this module sets itself (a user value for them is refused)
OWN_ENGINE_KWARGS = ("model", "custom_pipeline_args", "worker_extension_cls", "model_class_name", "dtype",
                     "master_port")
#: trainable states up to this size go into the engine by `collective_rpc`; larger ones by bucketed CUDA IPC
RPC_WEIGHTS_MAX_BYTES = 256 << 20
IPC_BUCKET_MB = 512


# ------------------------------------------------------------------------------------------ availability
def unavailable_reason() -> str | None:
    """Why the engine cannot run in this process, or None. Never imports vllm / vllm_omni."""
    return VLLM_OMNI.unavailable_reason()


def require_vllm_omni() -> None:
    """ValueError naming `actor_rollout_ref.rollout.name` and the fix when vLLM-Omni cannot run here."""
    VLLM_OMNI.require()


@dataclass(frozen=True)
class VllmOmniApi:
    """The vLLM-Omni names this module uses (checked against the pinned wheels by tests/contract)."""

    AsyncOmni: Any
    SamplingParams: Any
    DiffusionOutput: Any
    CustomPipelineWorkerExtension: Any


def import_vllm_omni(*, require: bool = True) -> VllmOmniApi:
    """The one place that imports vLLM-Omni. `require`: check first that it can run here (a CUDA device), so
    CPU gets the ValueError; the worker-side classes import it without that check (they run where vLLM-Omni
    loads them, and the contract tier imports them on CPU)."""
    if require:
        require_vllm_omni()
    from vllm_omni.diffusion.data import DiffusionOutput
    from vllm_omni.diffusion.worker.diffusion_worker import CustomPipelineWorkerExtension
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    if require:
        from vllm_omni import AsyncOmni
    else:
        AsyncOmni = None  # noqa: N806 - `from vllm_omni import AsyncOmni` needs torchvision (GPU machines only)
    return VllmOmniApi(AsyncOmni, OmniDiffusionSamplingParams, DiffusionOutput, CustomPipelineWorkerExtension)


def build_engine_kwargs(model_path: str, custom_pipeline_args: Mapping[str, Any], user_kwargs: Mapping[str, Any] | None,
                  *, dtype: str, master_port: int | None = None) -> dict[str, Any]:
    """The exact keyword arguments `AsyncOmni(**kwargs)` gets.

    `user_kwargs` (`actor_rollout_ref.rollout.engine_kwargs.vllm_omni`) may tune vLLM-Omni (e.g.
    `gpu_memory_utilization`, `enforce_eager`) but not what this module owns (`OWN_ENGINE_KWARGS`: ValueError);
    `max_num_seqs` other than 1 warns and is clamped to 1 (DigenRL's pipeline does not batch requests; vLLM-Omni
    refuses `max_num_seqs` > 1 for such a pipeline). `enable_dummy_pipeline` is not an engine kwarg (0.30:
    `Unknown diffusion config field`): a custom pipeline is selected by `custom_pipeline_args` alone.
    """
    user = dict(user_kwargs or {})
    own = sorted(set(user) & (set(OWN_ENGINE_KWARGS) | {"enable_dummy_pipeline"}))
    if own:
        raise ValueError(f"{ENGINE_KWARGS_KEY}: {own} are set by DigenRL's vLLM-Omni engine; remove them")
    n = int(user.pop("max_num_seqs", 1))
    if n != 1:
        warnings.warn(f"{ENGINE_KWARGS_KEY}.max_num_seqs={n} is clamped to 1: DigenRL's pipeline runs one request "
                      "(all samples of a prompt) at a time, and vLLM-Omni refuses max_num_seqs > 1 for a pipeline "
                      "without request batching", stacklevel=2)
    kwargs = {"model": model_path, "custom_pipeline_args": dict(custom_pipeline_args),
              "worker_extension_cls": WORKER_EXTENSION_CLASS, "model_class_name": PIPELINE_NAME, "dtype": dtype,
              "max_num_seqs": 1, **user}
    if master_port is not None:
        kwargs["master_port"] = int(master_port)
    return kwargs


def isolate_master_port(host: str = "127.0.0.1") -> int:
    """Give this process's next vLLM-Omni engine a free port of its own: vLLM-Omni reads `MASTER_PORT` before
    its `master_port` argument, and a generator actor inherits verl's worker-group `MASTER_PORT` (several
    generators per node would collide). Returns the port, also to be passed as `master_port`."""
    port = free_port(host)
    os.environ["MASTER_PORT"] = str(port)
    return port



# ------------------------------------------------------------------------------------------ requests
@dataclass
class OmniRequest:
    """One vLLM-Omni request: one prompt and all of its samples held by this generator rank.

    Attributes:
        request_id: unique per request (vLLM needs it).
        prompt / negative_prompt: the text; the pipeline encodes it with the model's own tokenizers.
        sampling: fields of `OmniDiffusionSamplingParams` (height, width, num_frames, num_inference_steps,
            guidance_scale, true_cfg_scale, seed, num_outputs_per_prompt, output_type).
        extra_args: `{"digenrl": {...}}`: rollout config, global step, uid, sample indices, policy version.
        rows: positions of this request's samples in the shard, in output order.
    """

    request_id: str
    prompt: str
    negative_prompt: str
    sampling: dict[str, Any]
    extra_args: dict[str, Any]
    rows: list[int] = field(default_factory=list)

    @property
    def num_outputs(self) -> int:
        return int(self.sampling["num_outputs_per_prompt"])

    def batching_key(self) -> tuple:
        """What vLLM-Omni's request waves group on (size, frames, steps, guidance): must be equal in a step."""
        s = self.sampling
        return (s.get("height"), s.get("width"), s.get("num_frames"), s.get("num_inference_steps"),
                s.get("guidance_scale"), s.get("true_cfg_scale"))


def rollout_config_to_dict(cfg: RolloutConfig) -> dict[str, Any]:
    d = asdict(cfg)
    if d.get("sde_window_range") is not None:
        d["sde_window_range"] = list(d["sde_window_range"])
    return d


def rollout_config_from_dict(d: Mapping[str, Any]) -> RolloutConfig:
    d = dict(d)
    if d.get("sde_window_range") is not None:
        d["sde_window_range"] = tuple(d["sde_window_range"])
    return RolloutConfig(**d)  # validates


def build_requests(prompts: Sequence[str], uids: Sequence[str], sample_indices: Sequence[int], *, step: int,
                   version: int, pipeline: PipelineConfig, rollout: RolloutConfig) -> list[OmniRequest]:
    """One request per distinct prompt uid of a shard (rows of one uid must share the prompt).

    Args:
        prompts, uids, sample_indices: the shard's rows (`raw_prompt`, `uid`, `sample_index` of the step batch).
        step: the global step (part of every sample's `SampleKey`).
        version: the policy version the schedule expects the generator to hold.
        pipeline: the resolved sampling settings (same for every request, so waves form).
        rollout: the rollout config (SDE kind, noise level, selection, seed).
    """
    if not (len(prompts) == len(uids) == len(sample_indices)):
        raise ValueError(f"build_requests: {len(prompts)} prompts, {len(uids)} uids, {len(sample_indices)} indices")
    by_uid: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        by_uid.setdefault(str(uid), []).append(row)
    requests = []
    for uid, rows in by_uid.items():
        texts = {prompts[r] for r in rows}
        if len(texts) != 1:
            raise ValueError(f"rows of prompt uid {uid!r} carry different prompts: {sorted(texts)}")
        sampling = {k: v for k, v in dict(
            height=pipeline.height, width=pipeline.width, num_frames=pipeline.num_frames,
            num_inference_steps=rollout.num_inference_steps, guidance_scale=pipeline.guidance_scale,
            true_cfg_scale=pipeline.true_cfg_scale, seed=rollout.seed, num_outputs_per_prompt=len(rows),
            output_type="pt").items() if v is not None}
        extra = {"digenrl": {"step": int(step), "uid": uid, "sample_indices": [int(sample_indices[r]) for r in rows],
                             "version": int(version), "rollout": rollout_config_to_dict(rollout)}}
        requests.append(OmniRequest(f"digenrl-{step}-{uid}-{uuid.uuid4().hex[:8]}", prompts[rows[0]],
                                    pipeline.negative_prompt, sampling, extra, rows))
    return requests


# ------------------------------------------------------------------------------------------ pipeline core
_CORES: list["TrajectoryPipelineCore"] = []  # the cores of this process (the worker extension finds them here)


class TrajectoryPipelineCore:
    """The RL part of the custom vLLM-Omni pipeline, free of vLLM: one request in, trajectories out.

    Runs `digenrl_verl.diffusion.rollout.rollout` on our adapter, so the SDE math, the per-sample noise and
    the timestep selection are those of the diffusers path. Weight updates are staged and applied between
    requests (`begin_request`), so every trajectory carries exactly one policy version.
    """

    def __init__(self, adapter: DiffusionAdapter, *, version: int = 0, register: bool = True) -> None:
        self.adapter = adapter
        self.version = int(version)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None
        if register:
            _CORES.append(self)

    # -- weights --------------------------------------------------------------------------------------
    def stage_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Hold new trainable weights; they apply before the next request starts (at once if idle)."""
        with self._lock:
            self._staged = (dict(state), int(version))
            if self._in_flight == 0:
                self._apply_staged()

    def current_weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, trainable weights on the CPU) the next request will use (staged ones applied first when idle)."""
        with self._lock:
            if self._in_flight == 0:
                self._apply_staged()
            return self.version, self.adapter.trainable_state(device="cpu")

    def _apply_staged(self) -> None:
        if self._staged is not None:
            state, version = self._staged
            self.adapter.load_trainable_state(state)
            self.version, self._staged = version, None

    # -- requests -------------------------------------------------------------------------------------
    def run(self, prompt: str, num_outputs: int, extra_args: Mapping[str, Any]) -> dict[str, Any]:
        """Sample `num_outputs` trajectories of `prompt`.

        Returns a dict: `trajectory` (Trajectory tensors, see the module docstring), `images` uint8,
        `policy_version` (int), `sample_indices` (list[int]), `step` (int), `uid` (str).
        """
        rl = dict(extra_args.get("digenrl") or {})
        missing = {"step", "uid", "sample_indices", "rollout"} - set(rl)
        if missing:
            raise ValueError(f"request extra_args['digenrl'] is missing {sorted(missing)}")
        indices = [int(i) for i in rl["sample_indices"]]
        if len(indices) != num_outputs:
            raise ValueError(f"num_outputs_per_prompt={num_outputs} but {len(indices)} sample indices were sent")
        cfg = rollout_config_from_dict(rl["rollout"])
        with self._lock:
            if self._in_flight == 0:  # never swap weights under a request that is still running
                self._apply_staged()
            self._in_flight += 1
            version = self.version
        try:
            want = rl.get("version")
            if want is not None and int(want) != version:
                raise RuntimeError(f"vLLM-Omni generator holds policy version {version} but the request asks for "
                                   f"{want}: a trajectory must carry one version (sync weights first)")
            keys = [SampleKey(int(rl["step"]), str(rl["uid"]), i) for i in indices]
            cond = self.adapter.encode_prompts([prompt] * num_outputs)
            traj = rollout(self.adapter, cond, keys, cfg)
            images = self.adapter.decode(traj.final_latents)
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._apply_staged()
        return {"trajectory": traj, "images": images, "policy_version": version, "sample_indices": indices,
                "step": int(rl["step"]), "uid": str(rl["uid"])}


def outputs_to_batch(requests: Sequence[OmniRequest], outputs: Sequence[Mapping[str, Any]],
                     sample_ids: Sequence[int], num_rows: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Map per-request outputs back to the shard's row order.

    Returns (tensors, images): the DataProto tensors of the module docstring (rows in shard order) and the
    decoded images [B, ...] uint8.
    """
    if len(requests) != len(outputs):
        raise ValueError(f"{len(requests)} requests but {len(outputs)} outputs")
    order: list[int] = []
    parts, images, versions = [], [], []
    for req, out in zip(requests, outputs):
        if list(out["sample_indices"]) != list(req.extra_args["digenrl"]["sample_indices"]):
            raise ValueError(f"request {req.request_id}: outputs for samples {out['sample_indices']}, asked "
                             f"{req.extra_args['digenrl']['sample_indices']}")
        order.extend(req.rows)
        parts.append(out["trajectory"])
        images.append(out["images"])
        versions.extend([int(out["policy_version"])] * len(req.rows))
    if sorted(order) != list(range(num_rows)):
        raise ValueError(f"requests cover rows {sorted(order)}, expected 0..{num_rows - 1}")
    inverse = torch.empty(num_rows, dtype=torch.long)
    inverse[torch.as_tensor(order)] = torch.arange(num_rows)
    traj = Trajectory.cat(parts).index_select(inverse)
    tensors = traj.tensors()
    tensors.update(rollout_log_probs=traj.log_probs, sample_id=torch.as_tensor(list(sample_ids), dtype=torch.int64),
                   policy_version=torch.as_tensor(versions, dtype=torch.int64)[inverse])
    return tensors, torch.cat(images)[inverse]


def pipeline_output(core: TrajectoryPipelineCore, prompt: str, num_outputs: int,
                    extra_args: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """What the pipeline returns for one request: (images uint8, `rl` record). `rl` holds the Trajectory tensors
    on the CPU plus `policy_version`, `sample_indices`, `sde_type`, `noise_level`; it travels in vLLM-Omni's
    `DiffusionOutput.multimodal_output["metadata"]["rl"]` (the in-process engine passes it the same way)."""
    out = core.run(prompt, num_outputs, extra_args)
    traj = out["trajectory"]
    rl: dict[str, Any] = {k: v.cpu() for k, v in traj.tensors().items()}
    rl.update(policy_version=out["policy_version"], sample_indices=out["sample_indices"],
              sde_type=traj.sde_type, noise_level=traj.noise_level)
    return out["images"].cpu(), rl


def build_core(custom_args: Mapping[str, Any], device: str, *, register: bool = True) -> TrajectoryPipelineCore:
    """The pipeline core a vLLM-Omni worker builds from `custom_pipeline_args` (see `VllmOmniEngine`)."""
    args = dict(custom_args)
    lora = args.get("lora")
    if lora is not None:
        lora = LoraConfig(**lora)
    adapter = load_adapter(args["model"], lora=lora, pipeline=PipelineConfig.from_dict(args.get("pipeline", {})),
                           dtype=getattr(torch, args.get("dtype", "bfloat16")), device=device, keep_reference=False)
    return TrajectoryPipelineCore(adapter, version=int(args.get("start_version", 0)), register=register)


def worker_device() -> torch.device:
    """The device a vLLM-Omni worker runs its pipeline on (the worker has set its CUDA device); CPU elsewhere."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ------------------------------------------------------------------------------------------ pipeline (worker side)
def prompt_text(prompt: Any) -> str:
    """The text of a vLLM-Omni prompt: a string, or an `OmniTextPrompt` dict (`{"prompt", "negative_prompt"}`)."""
    if isinstance(prompt, Mapping):
        return str(prompt["prompt"])
    return str(prompt)


def media_key(images: torch.Tensor) -> str:
    return "video" if images.dim() == 5 else "image"


class DigenRLPipelineMethods:
    """What the vLLM-Omni custom pipeline does, free of vLLM (the class vLLM-Omni loads, `DigenRLOmniPipeline`,
    is this plus `torch.nn.Module`; `InProcessOmniEngine` runs it in-process).

    vLLM-Omni's loader builds it as `cls(od_config=...)` under its default dtype (bf16), reads `weights_sources`
    and calls `load_weights(weights)`; its worker calls `forward(batch)` with a `DiffusionRequestBatch` (one
    request here: `supports_request_batch = False`), first with the start-up warm-up request.
    """

    supports_request_batch = False
    #: the weights come from the model directory through our adapter's `from_pretrained` in `__init__`; vLLM-Omni's
    #: loader has nothing to stream (empty sources), and calls `load_weights` with no tensors
    weights_sources: tuple = ()
    core: TrajectoryPipelineCore
    output_cls: Any = None  # the DiffusionOutput class (vLLM-Omni's, or the in-process stand-in)

    def _digenrl_init(self, od_config: Any, output_cls: Any, device: torch.device | str) -> None:
        args = dict(getattr(od_config, "custom_pipeline_args", None) or {})
        args.pop("pipeline_class", None)
        args.setdefault("model", getattr(od_config, "model", None))
        self.output_cls = output_cls
        # the loader sets a bf16 default dtype around this constructor; our adapter loads in its own dtype and the
        # SDE math is fp32, so build under the dtype torch starts with
        with _default_dtype(torch.float32):
            self.core = build_core(args, str(device))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM-Omni's loader entry (no tensors at start-up), and verl-omni's full-weight update entry (one bucket of
        (name, tensor) pairs). Tensors are staged with the core's current version; the version moves with
        `DigenRLWorkerExtension.digenrl_stage_weights`. Returns the names loaded."""
        got = {name: tensor for name, tensor in weights}
        if got:
            version, current = self.core.current_weights()
            unknown = sorted(set(got) - set(current))
            if unknown:
                raise ValueError(f"load_weights: {unknown[:5]} are not trainable weights of the DigenRL pipeline")
            self.core.stage_weights({**current, **got}, version)
        return set(got)

    @torch.no_grad()
    def forward(self, req: Any) -> Any:
        """One `DiffusionRequestBatch` (`.requests`, `.prompts`, `.sampling_params`, `.is_dummy_run()`)."""
        if req.is_dummy_run():
            return self.output_cls(output=None)
        if len(req.requests) != 1:
            raise ValueError(f"DigenRL's pipeline runs one request at a time, got {len(req.requests)} (max_num_seqs=1)")
        params = req.sampling_params
        extra = dict(params.extra_args or {})
        if "digenrl" not in extra:  # a request that is not a DigenRL rollout (warm-up variants): nothing to do
            return self.output_cls(output=None)
        images, rl = pipeline_output(self.core, prompt_text(req.prompts[0]), int(params.num_outputs_per_prompt),
                                     extra)
        return self.output_cls(output={"payload": {media_key(images): images}, "metadata": {"rl": rl}},
                               trajectory_latents=rl["next_latents"], trajectory_timesteps=rl["sigmas"],
                               trajectory_log_probs=rl["log_probs"], to_cpu=True)


class _default_dtype:
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        self.saved = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc: Any) -> None:
        torch.set_default_dtype(self.saved)


def read_request_output(out: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """(images uint8, rl record) from what the client streams for one request (vLLM-Omni's `OmniRequestOutput`:
    `images` is the payload as a list, the envelope's metadata is in `multimodal_output["metadata"]`)."""
    mm = getattr(out, "multimodal_output", None) or {}
    rl = (mm.get("metadata") or {}).get("rl")
    if rl is None:
        raise RuntimeError(f"vLLM-Omni output of request {getattr(out, 'request_id', '?')} carries no DigenRL record "
                           f"(multimodal_output keys {sorted(mm)}, error {getattr(out, 'error', None)!r})")
    images = list(getattr(out, "images", None) or [])
    if len(images) != 1 or not isinstance(images[0], torch.Tensor):
        raise RuntimeError(f"vLLM-Omni output carries {len(images)} payloads, expected one uint8 tensor")
    return images[0], rl


# ------------------------------------------------------------------------------------------ worker extension
class DigenRLWorkerMethods:
    """The `collective_rpc` methods of DigenRL's worker extension, free of vLLM (`DigenRLWorkerExtension` is this
    plus vLLM-Omni's `CustomPipelineWorkerExtension`, whose `re_init_pipeline` the worker calls at start).

    Arguments and results are plain data (ints, strings, dicts of tensors): they cross vLLM-Omni's msgpack hop.
    The pipeline core is found on the worker's `model_runner.pipeline`, else in this process's registry.
    """

    _digenrl_core: TrajectoryPipelineCore | None = None

    def digenrl_attach_core(self, core: TrajectoryPipelineCore) -> None:
        """Serve `core` (the in-process engine's)."""
        self._digenrl_core = core

    def _digenrl_active_core(self) -> TrajectoryPipelineCore:
        if self._digenrl_core is not None:
            return self._digenrl_core
        pipeline = getattr(getattr(self, "model_runner", None), "pipeline", None)
        core = getattr(pipeline, "core", None)
        return core if isinstance(core, TrajectoryPipelineCore) else _active_core()

    def digenrl_weights_meta(self) -> dict[str, list]:
        """`{name: [shape, dtype name]}` of the trainable weights (the actor allocates its receive buffers)."""
        _, state = self._digenrl_active_core().current_weights()
        return {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state.items()}

    def digenrl_stage_weights(self, state: Mapping[str, torch.Tensor], version: int) -> int:
        """Stage a whole trainable state as `version` (the LoRA-sized path: the tensors came by RPC)."""
        core = self._digenrl_active_core()
        device = next(iter(core.adapter.trainable_state(device=None).values())).device
        core.stage_weights({k: v.to(device) for k, v in state.items()}, int(version))
        return int(version)

    def digenrl_receive_ipc(self, zmq_handle: str, version: int, use_shm: bool = False) -> int:
        """Receive a whole trainable state in buckets over CUDA IPC (verl's `BucketedWeightReceiver`, the actor
        runs the sender) and stage it as `version`. UNTESTED (needs CUDA)."""
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

        received: dict[str, torch.Tensor] = {}
        receiver = BucketedWeightReceiver(zmq_handle=zmq_handle, device=worker_device(), use_shm=use_shm)
        # bucket views die with the bucket: clone what is kept
        receiver.receive_weights(lambda weights, *_: received.update({k: v.clone() for k, v in weights}))
        return self.digenrl_stage_weights(received, version)

    def digenrl_version(self) -> int:
        return self._digenrl_active_core().version

    def digenrl_trainable_state(self) -> dict[str, Any]:
        """`{"version", "state"}`: the weights the next request will use, on the CPU."""
        version, state = self._digenrl_active_core().current_weights()
        return {"version": version, "state": state}

    def digenrl_load_weights(self, path: str, version: int) -> int:
        """Stage the trainable weights of a checkpoint directory as `version` (resume)."""
        self._digenrl_active_core().stage_weights(load_weights_file(path), int(version))
        return int(version)


def _active_core() -> TrajectoryPipelineCore:
    if len(_CORES) != 1:
        raise RuntimeError(f"expected one DigenRL pipeline core in this vLLM-Omni worker, found {len(_CORES)}")
    return _CORES[0]


_LAZY: dict[str, type] = {}


def make_pipeline_class() -> type:
    """`DigenRLOmniPipeline`: `DigenRLPipelineMethods` + `torch.nn.Module`, returning vLLM-Omni's `DiffusionOutput`
    (imports vllm_omni). Loaded by vLLM-Omni through `custom_pipeline_args={"pipeline_class": PIPELINE_CLASS}`."""
    if PIPELINE_NAME not in _LAZY:
        api = import_vllm_omni(require=False)

        class DigenRLOmniPipeline(DigenRLPipelineMethods, torch.nn.Module):
            def __init__(self, *, od_config: Any, prefix: str = "") -> None:
                torch.nn.Module.__init__(self)
                self._digenrl_init(od_config, api.DiffusionOutput, worker_device())

        DigenRLOmniPipeline.__module__ = __name__
        DigenRLOmniPipeline.__qualname__ = PIPELINE_NAME
        _LAZY[PIPELINE_NAME] = DigenRLOmniPipeline
    return _LAZY[PIPELINE_NAME]


def make_worker_extension_class() -> type:
    """`DigenRLWorkerExtension`: `DigenRLWorkerMethods` on top of vLLM-Omni's `CustomPipelineWorkerExtension`
    (passing `worker_extension_cls` replaces that class, whose `re_init_pipeline` loads our pipeline at start)."""
    if "DigenRLWorkerExtension" not in _LAZY:
        api = import_vllm_omni(require=False)
        cls = type("DigenRLWorkerExtension", (DigenRLWorkerMethods, api.CustomPipelineWorkerExtension),
                   {"__module__": __name__, "__doc__": DigenRLWorkerMethods.__doc__})
        _LAZY["DigenRLWorkerExtension"] = cls
    return _LAZY["DigenRLWorkerExtension"]


def __getattr__(name: str) -> Any:  # vLLM-Omni resolves both classes by qualified name in its worker
    if name == PIPELINE_NAME:
        return make_pipeline_class()
    if name == "DigenRLWorkerExtension":
        return make_worker_extension_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------------ RPC contract
class VllmOmniRpcError(RuntimeError):
    """A worker-side failure that vLLM-Omni's `collective_rpc` returned as a dict instead of raising."""


def _error_of(result: Any) -> str | None:
    if isinstance(result, Mapping) and (result.get("error") is True or result.get("supported") is False):
        return str(result.get("reason") or result.get("error") or result)
    return None


def unwrap_rpc_result(method: str, results: Any) -> Any:
    """The first worker's answer of `collective_rpc(method)`, raising on vLLM-Omni's error dicts.

    `AsyncOmni.collective_rpc` returns one entry per stage; a diffusion stage's entry is the list of its workers'
    results (`[[worker_result]]`), or, when the worker failed, `{"error": True, "reason": ...}` (the stage
    client) or `{"supported": False, "error": ...}` (the stage pool).
    """
    if not isinstance(results, (list, tuple)) or not results:
        raise VllmOmniRpcError(f"collective_rpc({method!r}) returned {results!r}, expected one entry per stage")
    stage = results[0]
    why = _error_of(stage)
    if why is None and isinstance(stage, (list, tuple)):
        if not stage:
            raise VllmOmniRpcError(f"collective_rpc({method!r}): the stage returned no worker result")
        errors = [e for e in map(_error_of, stage) if e is not None]
        why = errors[0] if errors else None
        stage = stage[0]
    if why is not None:
        raise VllmOmniRpcError(f"vLLM-Omni worker failed in {method}: {why}")
    return stage


def plain_rpc_args(args: Sequence[Any]) -> tuple:
    """RPC arguments cross vLLM-Omni's msgpack hop, where a dataclass arrives as a dict: only plain data (None,
    bool, int, float, str, tensors, lists / tuples / dicts of those) may go. TypeError otherwise."""

    def check(x: Any, where: str) -> None:
        if x is None or isinstance(x, (bool, int, float, str, torch.Tensor)):
            return
        if isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                check(v, f"{where}[{i}]")
            return
        if isinstance(x, Mapping):
            for k, v in x.items():
                if not isinstance(k, str):
                    raise TypeError(f"RPC argument {where} has a non-string key {k!r}")
                check(v, f"{where}[{k!r}]")
            return
        kind = "a dataclass (it would arrive as a dict)" if is_dataclass(x) else type(x).__name__
        raise TypeError(f"RPC argument {where} is {kind}: send plain data across vLLM-Omni's msgpack hop")

    for i, a in enumerate(args):
        check(a, f"args[{i}]")
    return tuple(args)


# ------------------------------------------------------------------------------------------ engine (actor side)
@ENGINES.register("vllm_omni")
class VllmOmniEngine:
    """The `RolloutEngine` of `actor_rollout_ref.rollout.name=vllm_omni`: the generator actor's side.

    One request per prompt to its client (`build_requests`), outputs mapped back to the rows' order
    (`outputs_to_batch`). The actor joins the trainer -> generator group itself (`join`), receives each new
    version there and hands it to the engine's worker (`receive_weights`). `version` is the version this side
    expects the worker to hold; every request names it, and `checksum` checks it.

    Args:
        model_path: the diffusers directory (`actor_rollout_ref.model.path`).
        pipeline / rollout: the run's `PipelineConfig` / `RolloutConfig`.
        engine_kwargs: `actor_rollout_ref.rollout.engine_kwargs.vllm_omni` (see `build_engine_kwargs`).
        dtype: the model dtype of the worker's pipeline.
        start_version: the policy version of the weights the worker loads.
        lora: the policy's LoRA config (the worker's model must have the trainer's trainable parameters).
        client: `async_omni` (vLLM-Omni's AsyncOmni, started on first use, after `join`) or `inprocess`.
        device: where the in-process client runs, and where received weights live in the actor.
    """

    def __init__(self, model_path: str, pipeline: PipelineConfig, rollout: RolloutConfig,
                 engine_kwargs: Mapping[str, Any] | None = None, dtype: str = "bfloat16", start_version: int = 0,
                 *, lora: LoraConfig | None = None, client: str = "async_omni", device: str = "cuda") -> None:
        self.pipeline, self.rollout = pipeline, rollout
        self.version = int(start_version)
        self.device = device
        self.custom = {"pipeline_class": PIPELINE_CLASS, "model": model_path, "dtype": dtype,
                       "start_version": int(start_version), "lora": asdict(lora) if lora is not None else None,
                       "pipeline": {k: v for k, v in asdict(pipeline).items() if v is not None}}
        self.kwargs = build_engine_kwargs(model_path, self.custom, engine_kwargs, dtype=dtype)
        self.collectives: Collectives | None = None
        self._meta: dict[str, list] | None = None
        self._client: Any = None
        self.loop = asyncio.new_event_loop()  # one loop for every call: an async client binds to the first one
        if client == "inprocess":
            self._client = InProcessOmniEngine(model=model_path, custom_pipeline_args=self.custom, device=device)
            self.params_cls: Any = SamplingParams
        elif client == "async_omni":
            self.params_cls = None  # vLLM-Omni's, once the client starts
        else:
            raise ValueError(f"unknown vLLM-Omni client {client!r}; valid: ['async_omni', 'inprocess']")

    @classmethod
    def from_policy(cls, spec: PolicySpec) -> "VllmOmniEngine":
        """A generator's engine. The `inprocess` client samples in the policy's dtype on the policy's device
        (so it matches the diffusers engine bit for bit); `async_omni` in `actor_rollout_ref.rollout.dtype`."""
        engine = spec.engine
        dtype = engine.dtype if engine.client == "async_omni" else spec.dtype
        return cls(spec.model_path, spec.pipeline, spec.rollout, engine.engine_kwargs, dtype=dtype,
                   start_version=spec.start_version, lora=spec.lora, client=engine.client, device=spec.device)

    async def start_client(self) -> Any:
        """The engine client, awaited on this engine's loop (`_generate`, `_rpc` do); `AsyncOmni` starts here on
        first use (after `join`; the weight sync's pair group is a bare process group, independent of any
        torch.distributed world vLLM-Omni starts in-process), with a free MASTER_PORT of its own.

        `AsyncOmni` must be built inside a running loop (it binds to `asyncio.get_running_loop()`), and the
        callers already run on `self.loop`: it is built right here, never through `run_until_complete` (which
        raised "This event loop is already running"). No await between the check and the assignment, so
        concurrent callers on the loop start one client."""
        if self._client is None:
            api = import_vllm_omni()
            kwargs = dict(self.kwargs, master_port=isolate_master_port())
            self._client = api.AsyncOmni(**kwargs)
            self.params_cls = api.SamplingParams
        return self._client

    @property
    def client(self) -> Any:
        """The engine client, from outside the engine's loop (starts it there on first use); on the loop, await
        `start_client()`."""
        if self._client is None:
            if self.loop.is_running():
                raise RuntimeError("VllmOmniEngine.client read on the engine's running loop before the client "
                                   "started: await start_client() there")
            self.loop.run_until_complete(self.start_client())
        return self._client

    async def _generate(self, rows: RolloutRows) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """All requests of the rows concurrently; (tensors, images) in row order."""
        requests = build_requests(rows.prompts, rows.uids, rows.sample_indices, step=rows.step, version=self.version,
                                  pipeline=self.pipeline, rollout=self.rollout)
        client = await self.start_client()

        async def one(req: OmniRequest) -> Mapping[str, Any]:
            params = self.params_cls(**req.sampling, extra_args=req.extra_args)
            final = None
            async for out in client.generate({"prompt": req.prompt, "negative_prompt": req.negative_prompt},
                                             params, request_id=req.request_id):
                final = out
            images, rl = read_request_output(final)
            traj = Trajectory.from_tensors(rl, rl["sde_type"], rl["noise_level"])
            return {"trajectory": traj, "images": images, "policy_version": rl["policy_version"],
                    "sample_indices": rl["sample_indices"]}

        outputs = await asyncio.gather(*(one(r) for r in requests))
        return outputs_to_batch(requests, outputs, rows.sample_ids, len(rows))

    def generate(self, rows: RolloutRows) -> Rollout:
        """One request per prompt of the rows, run to completion on this engine's event loop."""
        tensors, images = self.loop.run_until_complete(self._generate(rows))
        return Rollout(tensors, images)

    async def _rpc(self, method: str, *args: Any) -> Any:
        client = await self.start_client()
        out = client.collective_rpc(method, args=plain_rpc_args(args))
        if inspect.isawaitable(out):
            out = await out
        return unwrap_rpc_result(method, out)

    def rpc(self, method: str, *args: Any) -> Any:
        """`collective_rpc` into the worker extension; the first worker's answer (errors raise)."""
        return self.loop.run_until_complete(self._rpc(method, *args))

    # -- weights ----------------------------------------------------------------------------------------
    def join(self, spec: CollectiveSpec, generator_rank: int, epoch: int = 0) -> int:
        """Join the trainer -> generator group in this actor (torch.distributed is free here, unlike inside a
        vLLM worker); the engine's worker never joins."""
        if dist.is_initialized() and self.collectives is None:
            raise RuntimeError("torch.distributed is already initialised in the vLLM-Omni generator actor: it would "
                               "join that world instead of the trainer -> generator group")
        self.collectives = Collectives(spec, "generator", generator_rank, epoch)
        return self.collectives.global_rank

    def weights_meta(self) -> dict[str, list]:
        """`{name: [shape, dtype]}` of the worker's trainable weights (asked once)."""
        if self._meta is None:
            self._meta = dict(self.rpc("digenrl_weights_meta"))
        return self._meta

    def receive_weights(self, version: int) -> int:
        """Receive `version` from trainer rank 0 into buffers of this actor, then hand them to the worker."""
        if self.collectives is None:
            raise RuntimeError("the vLLM-Omni generator received weights before join")
        device = "cuda" if self.collectives.spec.backend == "nccl" else "cpu"
        buffers = {k: torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                   for k, (shape, dtype) in self.weights_meta().items()}
        self.collectives.receive_weights(buffers)
        self.hand_over(buffers, version)
        self.version = int(version)
        return int(version)

    def hand_over(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Into the engine's worker: by RPC (CPU tensors through the msgpack hop) up to `RPC_WEIGHTS_MAX_BYTES`
        or when the tensors are not on CUDA; else by bucketed CUDA IPC (UNTESTED: needs CUDA)."""
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        on_cuda = any(t.is_cuda for t in state.values())
        if nbytes <= RPC_WEIGHTS_MAX_BYTES or not on_cuda:
            self.rpc("digenrl_stage_weights", {k: v.detach().cpu() for k, v in state.items()}, int(version))
            return
        self.loop.run_until_complete(self._hand_over_ipc(state, int(version)))

    async def _hand_over_ipc(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

        handle = f"ipc:///tmp/digenrl-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
        sender = BucketedWeightSender(zmq_handle=handle, bucket_size_mb=IPC_BUCKET_MB, use_shm=False)
        # the sender blocks on its zmq socket: it runs on a thread of its own while the RPC that starts the
        # worker's receiver is awaited here
        send = asyncio.to_thread(lambda: asyncio.run(sender.async_send_weights(iter(list(state.items())))))
        await asyncio.gather(self._rpc("digenrl_receive_ipc", handle, version, False), send)

    def load_weights(self, path: str, version: int) -> int:
        self.rpc("digenrl_load_weights", str(path), int(version))
        self.version = int(version)
        return int(version)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The worker's weights (those its next request uses)."""
        return self.rpc("digenrl_trainable_state")["state"]

    def checksum(self) -> str:
        """Checksum of the worker's weights, which must be `version`."""
        answer = self.rpc("digenrl_trainable_state")
        if answer["version"] != self.version:
            raise RuntimeError(f"vLLM-Omni engine expected to hold version {self.version}, its worker holds "
                               f"{answer['version']}")
        return state_checksum(answer["state"])


# ------------------------------------------------------------------------------------------ in-process client
@dataclass
class SamplingParams:
    """Stand-in for vLLM-Omni's `OmniDiffusionSamplingParams` (the fields DigenRL sends; the contract tier checks
    they are fields of the real class)."""

    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    true_cfg_scale: float | None = None
    seed: int | None = None
    num_outputs_per_prompt: int = 1
    output_type: str = "pt"
    extra_args: dict[str, Any] = field(default_factory=dict)


DUMMY_REQUEST_ID = "dummy_req_id"  # vLLM-Omni's warm-up request id (`vllm_omni.diffusion.request`)


@dataclass
class StandInRequest:
    """Stand-in for `OmniDiffusionRequest` (fields checked against the real class by the contract tier)."""

    prompt: Any
    sampling_params: Any
    request_id: str

    @classmethod
    def is_dummy_run_request_id(cls, request_id: str | None) -> bool:
        return request_id == DUMMY_REQUEST_ID or (isinstance(request_id, str)
                                                  and request_id.startswith(DUMMY_REQUEST_ID + "/"))


@dataclass
class StandInRequestBatch:
    """Stand-in for `DiffusionRequestBatch`: the members the pipeline reads."""

    requests: list

    @property
    def prompts(self) -> list:
        return [r.prompt for r in self.requests]

    @property
    def sampling_params(self) -> Any:
        assert len(self.requests) == 1, "RequestBatch with multiple requests does not have a single sampling_params"
        return self.requests[0].sampling_params

    @property
    def request_id(self) -> str:
        return self.requests[0].request_id

    def is_dummy_run(self) -> bool:
        return self.requests[0].is_dummy_run_request_id(self.request_id)


@dataclass
class StandInDiffusionOutput:
    """Stand-in for `vllm_omni.diffusion.data.DiffusionOutput`: the fields the pipeline sets."""

    output: Any = None
    trajectory_timesteps: Any = None
    trajectory_latents: Any = None
    trajectory_log_probs: Any = None
    trajectory_decoded: Any = None
    to_cpu: bool = False


@dataclass
class StandInRequestOutput:
    """Stand-in for the `OmniRequestOutput` vLLM-Omni's formatter makes of an envelope output."""

    request_id: str
    images: list
    multimodal_output: dict


def stand_in_format(request: Any, output: Any) -> StandInRequestOutput:
    """What vLLM-Omni's post-processing + formatter make of the pipeline's output, when no post-processor is
    attached (`model_class_name=DigenRLOmniPipeline`): payload -> `images` list, metadata -> `multimodal_output`.
    The contract tier checks it against the real formatter."""
    if output.output is None:
        return StandInRequestOutput(request.request_id, [], {})
    payload, metadata = output.output["payload"], output.output.get("metadata") or {}
    primary = next(k for k in ("video", "image") if k in payload)
    return StandInRequestOutput(request.request_id, [payload[primary]], {"metadata": metadata} if metadata else {})


@dataclass(frozen=True)
class OmniClasses:
    """The vLLM-Omni classes `InProcessOmniEngine` builds its requests and outputs with: the stand-ins above, or,
    in the contract tier, the real ones (`request`, `request_batch`, `output`, and `format(request, output)`)."""

    request: Any = StandInRequest
    request_batch: Any = StandInRequestBatch
    output: Any = StandInDiffusionOutput
    format: Any = stand_in_format


class InProcessPipeline(DigenRLPipelineMethods):
    """The pipeline's methods on a plain object (no `torch.nn.Module`, no vLLM)."""

    def __init__(self, od_config: Any, output_cls: Any, device: str) -> None:
        self._digenrl_init(od_config, output_cls, device)


@dataclass
class InProcessConfig:
    """The two `OmniDiffusionConfig` fields the pipeline reads."""

    model: str
    custom_pipeline_args: dict


class InProcessOmniEngine:
    """A client with `AsyncOmni`'s interface (`generate`, `collective_rpc`, same signatures: checked by the
    contract tier) that runs DigenRL's pipeline methods and worker-extension methods in this process.

    It is the CPU reference of the backend inside a Ray run (tests/trainer): requests built like vLLM-Omni builds
    them (`OmniClasses`: stand-ins, or the real classes in the contract tier), one `forward` per request, the
    output formatted like vLLM-Omni formats it, RPC answers shaped like `AsyncOmni.collective_rpc`'s
    (`[[worker_result]]`, worker errors as `{"error": True, "reason": ...}`). Not selectable from the config;
    vLLM's scheduling, processes and msgpack hop are what it does not run.
    """

    def __init__(self, model: str, custom_pipeline_args: Mapping[str, Any], device: str = "cpu",
                 classes: OmniClasses | None = None) -> None:
        self.classes = classes or OmniClasses()
        self.pipeline = InProcessPipeline(InProcessConfig(model, dict(custom_pipeline_args)), self.classes.output,
                                          device)
        self.core = self.pipeline.core
        self.worker = DigenRLWorkerMethods()
        self.worker.digenrl_attach_core(self.core)

    async def generate(self, prompt: Any, sampling_params: Any = None, request_id: str = "", **kwargs: Any):
        request = self.classes.request(prompt=prompt, sampling_params=sampling_params, request_id=request_id)
        output = self.pipeline.forward(self.classes.request_batch(requests=[request]))
        yield self.classes.format(request, output)

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                             kwargs: dict | None = None, stage_ids: list[int] | None = None) -> list[Any]:
        try:
            result = getattr(self.worker, method)(*args, **(kwargs or {}))
        except Exception as e:  # noqa: BLE001 - vLLM-Omni reports worker exceptions as data, not raises
            return [{"error": True, "reason": f"{type(e).__name__}: {e}"}]
        return [[result]]
