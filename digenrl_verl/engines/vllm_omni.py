"""The vLLM-Omni rollout engine (`actor_rollout_ref.rollout.name=vllm_omni`): GPU only.

Status, honestly: the parts that touch vLLM — `make_pipeline_class`, the `AsyncOmni` client of
`VllmOmniEngine`, `collective_rpc` as vLLM-Omni implements it — are **written, never run**: vLLM-Omni has no
CPU execution path (its platforms are cuda/rocm/npu/xpu/musa, and sleep mode needs the CUDA allocator), and no
GPU was available while this module was written. They follow the API
names of the `vllm-omni` 0.30.0 wheel and of verl-omni at commit a1139baf as *read*, not executed; expect to adjust
names on first contact. Everything else runs on CPU and is tested there: request building, the trajectory
pipeline core and its `pipeline_output` record, the output → DataProto mapping, the worker extension's weight
path, and `VllmOmniEngine` held by the generator worker (`workers.roles.GeneratorWorker`) end to end in a
Ray run, on `InProcessOmniEngine` — a vLLM-free client with the `AsyncOmni` interface the engine uses, which
runs the same pipeline core in-process (tests/trainer/test_trainer_vllm_omni_backend_on_cpu.py: same rewards and
weights as the diffusers backend, weights delivered through the extension at every step).

Importing this module is cheap and safe everywhere: only `import_vllm_omni()` imports `vllm_omni`, when an
`AsyncOmni` client or the pipeline class is built. Selecting the engine in the config is validated without this
module: `RolloutEngineSpec(name="vllm_omni")` checks `engines.base.VLLM_OMNI` (packages found, a CUDA device),
which fails on CPU with a ValueError naming the key and the fix; `require_vllm_omni()` here is the same check.

Design (what makes this backend produce the same training data as the diffusers path):

* **One SDE module.** The custom pipeline does not re-implement the sampler: `TrajectoryPipelineCore` calls
  `digenrl_verl.diffusion.rollout.rollout` — the function the diffusers generator and TAG use — on our
  `DiffusionAdapter` loaded inside the vLLM-Omni worker. Step kinds, per-sample noise (`SampleKey` seeds) and
  timestep selection are therefore the same code, so rollout log-probs and the trainer's recomputed log-probs
  agree up to the numerics of the two devices/dtypes (the trainer recomputes old log-probs whenever the
  engine is not `diffusers`, see the config's `recompute_old_log_probs`).
* **One request per prompt.** `build_requests` groups a shard's rows by prompt uid and sends one request per
  prompt with `num_outputs_per_prompt` = the number of that prompt's samples on this rank (= rollout.n when a
  rank holds whole groups), never n requests of batch 1 (verl-omni#83, UniRL#108). Every request of a step has
  the same sampling-parameter key (size, frames, steps, guidance), so vLLM-Omni's request waves can form.
* **RL knobs through `extra_args["digenrl"]`**: the rollout config, the global step and the sample indices;
  the pipeline rebuilds the `SampleKey`s from them.
* **Weights through a worker extension.** `DigenRLWorkerExtension` (passed as `worker_extension_cls`) joins
  the trainer → generator process group (`weights.sync`, NCCL on GPU) and receives the trainable
  weights after each optimizer step. Weights are *staged* and applied only when no request is in flight,
  so a trajectory is always generated under one policy version.
* **Versions per sample.** Every output carries the policy version its trajectory was generated with; the
  generator puts it in `policy_version` [B] of the DataProto, as the diffusers path does.

Tensors produced by `outputs_to_batch` (an `engines.base.Rollout`, as the diffusers engine returns):
latents / next_latents fp32 [B, K, *latent], sigmas / next_sigmas fp32 [B, K], log_probs and
rollout_log_probs fp32 [B, K], step_index int64 [B, K], final_latents fp32 [B, *latent], sample_id int64 [B],
policy_version int64 [B]; images (responses) uint8 [B, 3, H, W] or [B, T, 3, H, W].

Pins for GPU use (verl-omni a1139baf's `.github/vllm_omni_pin.txt` and `gpu` extra): vllm==0.27.0 with
vllm-omni at git 444485650b19; pair vllm X.Y with vllm-omni X.Y (`engines.base.VLLM_PIN`, `VLLM_OMNI_GIT_PIN`).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import torch

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, Trajectory, rollout
from digenrl_verl.engines.base import (BACKEND_KEY, ENGINES, VLLM_OMNI, VLLM_OMNI_API_VERSION, VLLM_OMNI_GIT_PIN,
                                       VLLM_PIN, Rollout, RolloutRows)
from digenrl_verl.engines.spec import PolicySpec
from digenrl_verl.models.base import DiffusionAdapter
from digenrl_verl.models.config import LoraConfig, PipelineConfig
from digenrl_verl.models.registry import load_adapter
from digenrl_verl.weights.state import load_weights_file
from digenrl_verl.weights.sync import CollectiveSpec, Collectives, state_checksum

__all__ = ["BACKEND_KEY", "VLLM_OMNI_API_VERSION", "VLLM_OMNI_GIT_PIN", "VLLM_PIN", "InProcessOmniEngine",
           "VllmOmniEngine", "require_vllm_omni", "unavailable_reason"]

ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm_omni"
PIPELINE_CLASS = "digenrl_verl.engines.vllm_omni.DigenRLOmniPipeline"
WORKER_EXTENSION_CLASS = "digenrl_verl.engines.vllm_omni.DigenRLWorkerExtension"


# ------------------------------------------------------------------------------------------ availability
def unavailable_reason() -> str | None:
    """Why the engine cannot run in this process, or None. Never imports vllm / vllm_omni."""
    return VLLM_OMNI.unavailable_reason()


def require_vllm_omni() -> None:
    """ValueError naming `actor_rollout_ref.rollout.name` and the fix when vLLM-Omni cannot run here."""
    VLLM_OMNI.require()


@dataclass(frozen=True)
class VllmOmniApi:
    """The vLLM-Omni names this module uses (per vllm-omni 0.30.0; unverified)."""

    AsyncOmni: Any
    SamplingParams: Any
    DiffusionOutput: Any


def import_vllm_omni() -> VllmOmniApi:
    """The one place that imports vLLM-Omni (GPU machines only; checked first, so CPU gets the ValueError)."""
    require_vllm_omni()
    from vllm_omni import AsyncOmni
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams
    from vllm_omni.outputs import DiffusionOutput

    return VllmOmniApi(AsyncOmni, OmniDiffusionSamplingParams, DiffusionOutput)


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


# ------------------------------------------------------------------------------------------ vLLM glue (GPU)
def make_pipeline_class():
    """The vLLM-Omni custom pipeline class (imports vllm_omni: GPU machines only). UNTESTED.

    Loaded by vLLM-Omni through `enable_dummy_pipeline=True, custom_pipeline_args={"pipeline_class":
    PIPELINE_CLASS}`. It wraps a `TrajectoryPipelineCore` over our adapter and fills the trajectory fields of
    vLLM-Omni's `DiffusionOutput` (`trajectory_latents`, `trajectory_timesteps`, `trajectory_log_probs`) plus
    `metadata["rl"]` with the full per-sample record.
    """
    api = import_vllm_omni()

    class _DigenRLOmniPipeline(torch.nn.Module):
        """vLLM-Omni pipeline: one request = one prompt × num_outputs_per_prompt trajectories."""

        supports_request_batch = False  # one request runs at a time; prompts batch inside a request

        def __init__(self, od_config: Any, **kwargs: Any) -> None:
            super().__init__()
            args = dict(getattr(od_config, "custom_pipeline_args", None) or {})
            args.setdefault("model", getattr(od_config, "model", None))
            self.core = build_core(args, "cuda")

        @torch.no_grad()
        def forward(self, req: Any) -> Any:
            params = req.sampling_params
            images, rl = pipeline_output(self.core, req.prompt, int(params.num_outputs_per_prompt),
                                         dict(params.extra_args or {}))
            return api.DiffusionOutput(images=images, trajectory_latents=rl["next_latents"],
                                   trajectory_timesteps=rl["sigmas"], trajectory_log_probs=rl["log_probs"],
                                   multimodal_output={"metadata": {"rl": rl}})

    return _DigenRLOmniPipeline


def __getattr__(name: str) -> Any:  # `DigenRLOmniPipeline` resolves lazily (vLLM-Omni imports it by name)
    if name == "DigenRLOmniPipeline":
        return make_pipeline_class()
    raise AttributeError(name)


class DigenRLWorkerExtension:
    """Mixed into vLLM-Omni's worker (`worker_extension_cls=WORKER_EXTENSION_CLASS`); called through
    `collective_rpc`. UNTESTED inside vLLM; the same methods run on CPU under `InProcessOmniEngine` (weights over
    gloo from the trainer, staged, then used by the next request).

    The extension finds the pipeline core of its process through the module registry, so it does not depend
    on vLLM-Omni's worker internals.

    Known gap (found in review, not run): a vLLM worker process has already initialised torch.distributed for
    vLLM's own world, so `Collectives` would skip its `init_process_group` and build its subgroups on vLLM's
    world instead of the trainer → generator group. A GPU run needs a separate (stateless) group for this link,
    e.g. vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`, as verl's checkpoint engine does. The in-process
    engine does not have this problem (the generator actor has no other process group).
    """

    _digenrl_collectives: Collectives | None = None  # class defaults: vLLM builds the worker, not this mixin
    _digenrl_core: TrajectoryPipelineCore | None = None

    def digenrl_attach_core(self, core: TrajectoryPipelineCore) -> None:
        """Serve `core` (the in-process engine's); vLLM workers find theirs in the module registry."""
        self._digenrl_core = core

    def digenrl_join(self, spec: CollectiveSpec, generator_rank: int) -> int:
        """Join the trainer → generator process group as generator `generator_rank` (NCCL on GPU)."""
        self._digenrl_collectives = Collectives(spec, "generator", generator_rank)
        return self._digenrl_collectives.global_rank

    def _digenrl_active_core(self) -> TrajectoryPipelineCore:
        return self._digenrl_core if self._digenrl_core is not None else _active_core()

    def digenrl_receive_weights(self, version: int) -> int:
        """Receive the trainable weights broadcast by trainer rank 0 and stage them as `version`."""
        if self._digenrl_collectives is None:
            raise RuntimeError("the vLLM-Omni worker received weights before digenrl_join")
        core = self._digenrl_active_core()
        buffers = {k: v.detach().clone() for k, v in core.adapter.trainable_state(device=None).items()}
        self._digenrl_collectives.receive_weights(buffers)
        core.stage_weights(buffers, version)
        return version

    def digenrl_version(self) -> int:
        return self._digenrl_active_core().version

    def digenrl_trainable_state(self) -> dict[str, Any]:
        """`{"version", "state"}`: the weights the next request will use, on the CPU."""
        version, state = self._digenrl_active_core().current_weights()
        return {"version": version, "state": state}

    def digenrl_load_weights(self, path: str, version: int) -> int:
        """Stage the trainable weights of a checkpoint directory as `version` (resume)."""
        core = self._digenrl_active_core()
        core.stage_weights(load_weights_file(path), version)
        return version


def _active_core() -> TrajectoryPipelineCore:
    if len(_CORES) != 1:
        raise RuntimeError(f"expected one DigenRL pipeline core in this vLLM-Omni worker, found {len(_CORES)}")
    return _CORES[0]


@ENGINES.register("vllm_omni")
class VllmOmniEngine:
    """The `RolloutEngine` of `actor_rollout_ref.rollout.name=vllm_omni`: the driver side of a vLLM-Omni engine.

    One request per prompt to its client (`build_requests`), outputs mapped back to the rows' order
    (`outputs_to_batch`); the policy weights live in the client's worker process, which joins the trainer →
    generator process group and receives the weights through `DigenRLWorkerExtension` (`collective_rpc`).
    `version` is the version this side expects the client to hold; every request names it, and `checksum`
    checks it. With the `async_omni` client UNTESTED; with `inprocess` tested on CPU in a Ray run.

    Args:
        model_path: the diffusers directory (`actor_rollout_ref.model.path`).
        pipeline / rollout: the run's `PipelineConfig` / `RolloutConfig`.
        engine_kwargs: `actor_rollout_ref.rollout.engine_kwargs.vllm_omni` (e.g. max_num_seqs, step_execution).
        dtype: the model dtype of the client's pipeline.
        start_version: the policy version of the weights the client loads.
        lora: the policy's LoRA config (the client's model must have the trainer's trainable parameters).
        client: `async_omni` (vLLM-Omni's AsyncOmni) or `inprocess` (`InProcessOmniEngine`).
        device: where the in-process client runs (vLLM-Omni places its own workers).
    """

    def __init__(self, model_path: str, pipeline: PipelineConfig, rollout: RolloutConfig,
                 engine_kwargs: Mapping[str, Any] | None = None, dtype: str = "bfloat16", start_version: int = 0,
                 *, lora: LoraConfig | None = None, client: str = "async_omni", device: str = "cuda") -> None:
        self.pipeline, self.rollout = pipeline, rollout
        self.version = int(start_version)
        custom = {"pipeline_class": PIPELINE_CLASS, "model": model_path, "dtype": dtype,
                  "start_version": start_version, "lora": asdict(lora) if lora is not None else None,
                  "pipeline": {k: v for k, v in asdict(pipeline).items() if v is not None}}
        kwargs = {"max_num_seqs": 8, **dict(engine_kwargs or {})}
        if client == "inprocess":
            self.client: Any = InProcessOmniEngine(model=model_path, custom_pipeline_args=custom, device=device)
            self.params_cls: Any = SamplingParams
        elif client == "async_omni":
            api = import_vllm_omni()
            self.client = api.AsyncOmni(model=model_path, enable_dummy_pipeline=True, custom_pipeline_args=custom,
                                        worker_extension_cls=WORKER_EXTENSION_CLASS, **kwargs)
            self.params_cls = api.SamplingParams
        else:
            raise ValueError(f"unknown vLLM-Omni client {client!r}; valid: ['async_omni', 'inprocess']")
        self.loop = asyncio.new_event_loop()  # one loop for every call: an async client binds to the first one

    @classmethod
    def from_policy(cls, spec: PolicySpec) -> "VllmOmniEngine":
        """A generator's engine. The `inprocess` client samples in the policy's dtype on the policy's device
        (so it matches the diffusers engine bit for bit); `async_omni` in `actor_rollout_ref.rollout.dtype`."""
        engine = spec.engine
        dtype = engine.dtype if engine.client == "async_omni" else spec.dtype
        return cls(spec.model_path, spec.pipeline, spec.rollout, engine.engine_kwargs, dtype=dtype,
                   start_version=spec.start_version, lora=spec.lora, client=engine.client, device=spec.device)

    async def _generate(self, rows: RolloutRows) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """All requests of the rows concurrently; (tensors, images) in row order."""
        requests = build_requests(rows.prompts, rows.uids, rows.sample_indices, step=rows.step, version=self.version,
                                  pipeline=self.pipeline, rollout=self.rollout)

        async def one(req: OmniRequest) -> Mapping[str, Any]:
            params = self.params_cls(**req.sampling, extra_args=req.extra_args)
            final = None
            async for out in self.client.generate({"prompt": req.prompt, "negative_prompt": req.negative_prompt},
                                                  params, request_id=req.request_id):
                final = out
            rl = final.multimodal_output["metadata"]["rl"]
            traj = Trajectory.from_tensors(rl, rl["sde_type"], rl["noise_level"])
            return {"trajectory": traj, "images": final.images, "policy_version": rl["policy_version"],
                    "sample_indices": rl["sample_indices"]}

        outputs = await asyncio.gather(*(one(r) for r in requests))
        return outputs_to_batch(requests, outputs, rows.sample_ids, len(rows))

    def generate(self, rows: RolloutRows) -> Rollout:
        """One request per prompt of the rows, run to completion on this engine's event loop."""
        tensors, images = self.loop.run_until_complete(self._generate(rows))
        return Rollout(tensors, images)

    def rpc(self, method: str, *args: Any) -> Any:
        """`collective_rpc` into the worker extension; the answer of the client's first worker."""
        out = self.client.collective_rpc(method, args=args)
        if inspect.isawaitable(out):  # AsyncOmni's collective_rpc may be a coroutine
            out = self.loop.run_until_complete(_await(out))
        return out[0] if isinstance(out, (list, tuple)) else out

    def join(self, spec: CollectiveSpec, generator_rank: int) -> int:
        return int(self.rpc("digenrl_join", spec, generator_rank))

    def receive_weights(self, version: int) -> int:
        self.rpc("digenrl_receive_weights", version)
        self.version = version
        return version

    def load_weights(self, path: str, version: int) -> int:
        self.rpc("digenrl_load_weights", path, version)
        self.version = version
        return version

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The client's weights (those its next request uses)."""
        return self.rpc("digenrl_trainable_state")["state"]

    def checksum(self) -> str:
        """Checksum of the client's weights, which must be `version`."""
        answer = self.rpc("digenrl_trainable_state")
        if answer["version"] != self.version:
            raise RuntimeError(f"vLLM-Omni engine expected to hold version {self.version}, its worker holds "
                               f"{answer['version']}")
        return state_checksum(answer["state"])


async def _await(x: Any) -> Any:
    return await x


# ------------------------------------------------------------------------------------------ in-process engine
@dataclass
class SamplingParams:
    """The fields of vLLM-Omni's `OmniDiffusionSamplingParams` the DigenRL pipeline reads."""

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


@dataclass
class InProcessOutput:
    """What the in-process engine streams per request (the `DiffusionOutput` fields the generator reads)."""

    images: Any
    multimodal_output: dict[str, Any]


class InProcessOmniEngine:
    """A vLLM-free client with the interface `VllmOmniEngine` uses from `AsyncOmni`: `generate` streams one
    output per request, `collective_rpc` calls the `DigenRLWorkerExtension`. It runs the same pipeline core and
    the same `pipeline_output` record as the vLLM-Omni pipeline, one request at a time, in this process.

    It is the reference engine of the backend on machines without vLLM-Omni (CPU tests of everything between
    the generator worker and the pipeline: requests, extra args, the rl record, the row mapping, per-sample
    versions, weight staging through the extension). It is not selectable from the config; vLLM's request
    scheduling and its process layout are exactly what it does not exercise.
    """

    def __init__(self, model: str, custom_pipeline_args: Mapping[str, Any], device: str = "cpu") -> None:
        self.core = build_core({"model": model, **dict(custom_pipeline_args)}, device, register=False)
        self.extension = DigenRLWorkerExtension()
        self.extension.digenrl_attach_core(self.core)

    async def generate(self, prompt: Mapping[str, Any], params: SamplingParams, request_id: str):
        images, rl = pipeline_output(self.core, prompt["prompt"], int(params.num_outputs_per_prompt),
                                     dict(params.extra_args or {}))
        yield InProcessOutput(images=images, multimodal_output={"metadata": {"rl": rl}})

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        return [getattr(self.extension, method)(*args)]
