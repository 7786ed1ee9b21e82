"""Generators on verl-omni's own rollout replica (rollout engine ``verl_omni_replica``, issue 29 item 2): each
generator rank starts one `vLLMOmniReplica` on its own placement-group bundle, the way verl starts a rollout replica
beside the processes of a resource pool (`RolloutReplica.init_colocated`: a worker group of verl's
`CheckpointEngineWorker` on the bundle, verl-omni's `vLLMOmniHttpServer` actor, vLLM-Omni's `AsyncOmni`, its spawned
diffusion workers loading verl-omni's registered rollout pipeline on the worker's device), and samples through the
server's `generate`, the call verl-omni's agent loop makes. The rank and its replica share the bundle's device
(`workers.pools.PoolSpec.hosts_replica`: the rank's worker and the replica's worker take half of it each), so a
generator rank costs one GPU, its replica included.

Requests are the ``verl_omni`` engine's (`verl_omni_rollout.server_requests`: the same prompt fields, verl-omni's
sampling dict and per-rollout seeds from the row's position in the step batch), so a row draws the same sample on
either engine and on any replica. The server returns the window's trajectory (``all_latents``, ``log_probs``,
``all_timesteps``) and the uint8 sample; the rows' σ come from verl-omni's training scheduler for the model
(`DiffusionModelBase.build_scheduler`: what the trainer checks them against), and the window is located in it as
the in-process engine locates it (`trajectory_rows`).

Weights (`InPlaceWeights`, as the ``verl_omni`` engine): trainer rank 0's broadcast, a checkpoint or a hand-over land
in the trainers' transformer shadow in this process, then go to the replica the way verl's rollout server adapter
sends them (`ServerAdapter.update_weights`): the server's `collective_rpc` starts verl-omni's worker extension
`update_weights_from_ipc` in every diffusion worker, and verl's `BucketedWeightSender` streams the pipeline weights
(`pipeline_weights`: LoRA merged) to each worker's ZMQ handle (shared memory; a per-update handle), then the server
clears its cache. Each request carries its own ``global_steps`` (verl-omni's count, in its sampling dict), so the
server's step is not set. Not verl's checkpoint engine yet (tests/verl_omni/test_verl_omni_replica_on_cpu.py sends
through it with the package's gloo backend); the weights cross this process once per update.

A run takes this engine with ``actor_rollout_ref.rollout.name=vllm_omni``: on CUDA by default, on CPU with
``trainer.digenrl.generator_replicas=true`` (`config.verl_omni.generator_engine_name`; null = auto, the CPU default
being verl-omni's pipeline in the generator's process, ``verl_omni``). On CPU the replica's devices are Ray's
logical GPUs (`platform.cpu.logical_gpus`, which the run turns on in its generators' environment:
`trainer.runner.worker_env`; the generator bundles hold one each) and vLLM-Omni takes one request per batch
(``max_num_seqs=1``: its 0.27 request-batch race on CPU, patches/vllm-omni-0.27.0rc1); on CUDA Ray's GPUs and
vLLM-Omni's defaults. Limits, refused by name when the run is planned
(`engines.spec.check_replica_policy`, from `PolicySpec`): architectures whose prompts are tokenized here without the
pipeline (`PROMPT_PIPES`: Wan2.2, Qwen-Image, and SD3 with verl-omni's per-encoder ids, ``extra_prompt_ids``), window
timestep selection, verl-omni's SDE kinds.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Sequence

import torch

from digenrl_verl.engines.base import ENGINES, InPlaceWeights, Rollout, RolloutRows
from digenrl_verl.engines.spec import REPLICAS_KEY, VERL_OMNI_SDE_KINDS, PolicySpec, check_replica_policy
from digenrl_verl.integrations.verl_omni_rollout import (
    pipeline_weights, sampling_dict, server_requests, shadow_transformer, stack_rollout, trajectory_rows)
from digenrl_verl.models.pipeline_adapter import to_uint8
from digenrl_verl.models.registry import read_model_index
from digenrl_verl.workers.pools import BUNDLE_VAR

ENGINE_NAME = "verl_omni_replica"
KEY = f"actor_rollout_ref.rollout.name={ENGINE_NAME}"
#: the ZMQ bucket of a weight update, MiB (verl's ``checkpoint_engine.update_weights_bucket_megabytes`` default)
BUCKET_MB = 512


@dataclass(frozen=True)
class ReplicaConfig:
    """What one replica is started with (verl-omni's rollout and model configs are composed from it).

    Args:
        model: the diffusers model directory.
        algorithm: verl-omni's algorithm (``flow_grpo`` / ``dance_grpo``), which picks its rollout pipeline.
        height / width / steps: the pipeline's size and step count (its schedule).
        tp: ``rollout.tensor_model_parallel_size`` (the replica's devices: Ray's logical GPUs on CPU).
        dtype: the replica's weights' dtype.
        replica_rank: the replica's rank (names its Ray actors and ZMQ handles; one per generator rank).
        engine_kwargs: ``actor_rollout_ref.rollout.engine_kwargs.vllm_omni`` as (key, value) pairs: the replica's
            rollout config takes them as verl-omni's does (its server passes them to `AsyncOmni`).
    """

    model: str
    algorithm: str
    height: int
    width: int
    steps: int
    tp: int = 1
    dtype: str = "float32"
    replica_rank: int = 0
    engine_kwargs: tuple[tuple[str, Any], ...] = ()


def cuda_host() -> bool:
    return torch.cuda.is_available()


def checkpoint_engine_overrides() -> list[str]:
    """verl-omni's `nccl` on GPUs; on CPU the package's gloo backend, registered as a user's config registers it."""
    if cuda_host():
        return ["checkpoint_engine.backend=nccl"]
    return ["checkpoint_engine.backend=gloo",
            "checkpoint_engine.custom_backend_module=digenrl_verl.weights.gloo_checkpoint_engine"]


def engine_kwargs_overrides(user: Iterable[tuple[str, Any]]) -> list[str]:
    """The user's ``engine_kwargs.vllm_omni`` as overrides of the replica's rollout config; on CPU with one request per
    vLLM-Omni batch, as the CPU tests of verl-omni's own trainer run it: vLLM-Omni 0.27's result pump can file a
    batch's outputs before the per-request ids exist (patches/vllm-omni-0.27.0rc1/README.md), and the server's
    `generate` then stops in its 30 s wait. On GPUs, the user's values over vLLM-Omni's defaults."""
    kwargs = {**dict(user), **({} if cuda_host() else {"max_num_seqs": 1})}
    return [f"++engine_kwargs.vllm_omni.{k}={json.dumps(v)}" for k, v in sorted(kwargs.items())]


def replica_configs(cfg: ReplicaConfig) -> tuple[Any, Any]:
    """verl-omni's rollout and model configs (its Hydra files) for `cfg` (OmegaConf, as its trainer passes them)."""
    import verl_omni
    from hydra import compose, initialize_config_dir

    root = Path(verl_omni.__file__).parent / "trainer" / "config" / "diffusion"
    size = [f"pipeline.height={cfg.height}", f"pipeline.width={cfg.width}",
            f"pipeline.num_inference_steps={cfg.steps}"]
    with initialize_config_dir(config_dir=str(root / "model"), version_base=None):
        model = compose(config_name="diffusion_model", overrides=[
            f"path={cfg.model}", f"tokenizer_path={cfg.model}/tokenizer", f"algorithm={cfg.algorithm}",
            "attn_backend=native", *size])
    with initialize_config_dir(config_dir=str(root / "rollout"), version_base=None):
        rollout = compose(config_name="diffusion_rollout", overrides=[
            "name=vllm_omni", f"tensor_model_parallel_size={cfg.tp}", f"dtype={cfg.dtype}", "load_format=auto",
            "nnodes=1", f"n_gpus_per_node={cfg.tp}", "rollout_attn_backend=null", "enforce_eager=true", *size,
            *checkpoint_engine_overrides(), *engine_kwargs_overrides(cfg.engine_kwargs)])
    return rollout, model


def run_async(coro: Any) -> Any:
    """Run `coro` to completion from synchronous code (in a thread of its own when this thread runs a loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(out=asyncio.run(coro)))
    thread.start()
    thread.join()
    return box["out"]


def start_replica(cfg: ReplicaConfig) -> Any:
    """verl-omni's `vLLMOmniReplica` for `cfg`, started on this generator rank's own placement-group bundle, as
    verl's colocated rollout mode starts a replica beside the processes of a resource pool
    (`RolloutReplica.init_colocated` on `own_bundle_pool`): its `CheckpointEngineWorker` takes the other half of
    the bundle's device, and verl-omni's server runs vLLM-Omni on that device (``CUDA_VISIBLE_DEVICES`` of the
    worker). RuntimeError naming what to set when Ray is not up, this process is not on a bundle with a device, or,
    on CPU, not in the logical-GPU mode."""
    import ray
    from verl_omni.workers.rollout.vllm_rollout.vllm_omni_async_server import vLLMOmniReplica

    from digenrl_verl.platform.cpu import LOGICAL_GPUS_VAR, logical_gpus

    if not ray.is_initialized():
        raise RuntimeError(f"{KEY} starts verl-omni's replica on the Ray cluster of this process; none is connected "
                           "(the generator workers run inside one)")
    if not cuda_host() and not logical_gpus():
        raise RuntimeError(f"{KEY} on CPU: the replica's devices are Ray's logical GPUs, and this process is not in "
                           f"their mode ({LOGICAL_GPUS_VAR}=1, which a run sets in its generators' environment when "
                           f"{REPLICAS_KEY}=true); start the generators through the run")
    pool = own_bundle_pool(cfg)
    rollout, model = replica_configs(cfg)
    replica = vLLMOmniReplica(cfg.replica_rank, rollout, model, gpus_per_node=cfg.tp)
    # its actors' names are global in the Ray cluster: a rank's replacement (elastic pool) starts its own
    replica.name_suffix = f"_{uuid.uuid4().hex[:6]}"
    run_async(replica.init_colocated(pool))
    return replica


def own_bundle_pool(cfg: ReplicaConfig) -> Any:
    """verl's `SubRayResourcePool` of this process's own bundle (`workers.pools.BUNDLE_VAR` in its placement group):
    the replica's worker asks half of the bundle's GPU share (``max_colocate_count``), this process holds the
    other half (`PoolSpec.hosts_replica`)."""
    from ray.util.placement_group import get_current_placement_group
    from verl.single_controller.ray.base import SubRayResourcePool

    pg, index = get_current_placement_group(), os.environ.get(BUNDLE_VAR)
    gpus = pg.bundle_specs[int(index)].get("GPU", 0.0) if pg is not None and index is not None else 0.0
    if not gpus:
        raise RuntimeError(f"{KEY}: the replica shares its generator rank's placement-group bundle, and this process "
                           f"is on none with a GPU share (placement group {pg}, {BUNDLE_VAR}={index}); start the "
                           "generators through the run (their pool's bundles then hold the replicas' devices)")
    if cfg.tp != 1:
        raise RuntimeError(f"{KEY}: a replica of tensor_model_parallel_size={cfg.tp} spans {cfg.tp} devices, and a "
                           "generator rank's bundle holds one; set actor_rollout_ref.rollout.tensor_model_parallel_size"
                           "=1")
    return SubRayResourcePool(placement_groups=[pg], start_bundle_index=int(index), subgroup_world_size=cfg.tp,
                              process_on_nodes=[pg.bundle_count], use_gpu=True, max_colocate_count=round(2 / gpus),
                              name_prefix=f"digenrl_replica_{cfg.replica_rank}_")


def server_facts() -> dict:
    """Run inside the server actor (`__ray_call__`): its vLLM-Omni platform, whether the in-process harness was
    imported there, and the names and process ids of its child processes (vLLM-Omni's diffusion workers)."""
    import sys

    import psutil
    import vllm_omni.platforms as omni_platforms

    return {"platform": type(omni_platforms.current_omni_platform).__qualname__,
            "harness_imported": "digenrl_verl.integrations.vllm_omni_cpu" in sys.modules,
            "workers": [p.name() for p in psutil.Process().children(recursive=True)],
            "worker_pids": [p.pid for p in psutil.Process().children(recursive=True)]}


def serve(server: Any, requests: Sequence[dict]) -> list[Any]:
    """verl-omni's `DiffusionOutput`s of the server's `generate` for `requests` (`server_requests`), in order."""
    import ray

    optional = ("negative_prompt_ids", "extra_prompt_ids", "negative_extra_prompt_ids")  # SD3: per-encoder ids
    return ray.get([server.generate.remote(
        request_id=r["request_id"], prompt_ids=r["prompt"]["prompt_token_ids"], sampling_params=r["sampling_params"],
        **{k: r["prompt"].get(k) for k in optional}) for r in requests])


def send_weights(server: Any, weights: Iterable[tuple[str, torch.Tensor]], *, replica_rank: int, tp: int,
                 update_id: str, bucket_mb: int = BUCKET_MB) -> None:
    """verl's `ServerAdapter.update_weights` for every rank of one replica, from this process: the server's
    `collective_rpc` runs verl-omni's `update_weights_from_ipc` in each diffusion worker (shared memory, the
    per-update handle `update_id`), verl's `BucketedWeightSender` streams `weights` to each worker's handle."""
    import ray
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender
    from verl_omni.workers.rollout.vllm_rollout.zmq_utils import make_update_zmq_handle

    weights = [(n, t.detach().contiguous()) for n, t in weights]
    job = ray.get_runtime_context().get_job_id()  # the server actor exports its job's id to its workers
    receiving = server.collective_rpc.remote("update_weights_from_ipc",
                                             kwargs={"use_shm": True, "zmq_update_id": update_id})
    errors: list[BaseException] = []

    def push(rank: int) -> None:
        base = f"ipc:///tmp/rl-colocate-zmq-{job}-replica-{replica_rank}-rank-{rank}.sock"
        sender = BucketedWeightSender(zmq_handle=make_update_zmq_handle(base, update_id), bucket_size_mb=bucket_mb,
                                      use_shm=True)
        try:
            asyncio.run(sender.async_send_weights(iter(weights)))
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the RPC
            errors.append(e)

    threads = [threading.Thread(target=push, args=(rank,), daemon=True) for rank in range(tp)]
    for t in threads:
        t.start()
    _join_unless_the_rpc_fails(threads, receiving)
    ray.get(receiving)
    if errors:
        raise errors[0]


def _join_unless_the_rpc_fails(threads: list[threading.Thread], receiving: Any, poll_s: float = 1.0) -> None:
    """Wait for the sending threads; if the receiving RPC ends first with an error (a diffusion worker died: its
    sender would wait for its reply forever), raise that error now (the daemon threads are left behind)."""
    import ray

    while any(t.is_alive() for t in threads):
        done, _ = ray.wait([receiving], timeout=poll_s)
        if done:
            ray.get(receiving)  # raises the worker's failure; a success lets the senders finish
            for t in threads:
                t.join()
            return


def served_media(output: Any) -> torch.Tensor:
    """The server's decoded sample (`DiffusionOutput.diffusion_output`, uint8) as the `Rollout`'s media: [3, H, W]
    for an image, [T, 3, H, W] for a video (channels found by their size, 3)."""
    media = torch.as_tensor(output.diffusion_output)
    if media.dtype != torch.uint8:
        media = to_uint8(media)
    while media.dim() > 4 and media.shape[0] == 1:
        media = media[0]
    if media.dim() == 3 and media.shape[0] != 3:
        media = media.permute(2, 0, 1)
    elif media.dim() == 4 and media.shape[1] != 3:
        media = media.permute(1, 0, 2, 3) if media.shape[0] == 3 else media.permute(0, 3, 1, 2)
    return media.contiguous()


def _wan_prompt_pipe(model_path: str) -> Any:
    """What `verl_omni_rollout._wan_fields` reads of the pipeline: its T5 tokenizer, loaded as vLLM-Omni's Wan2.2
    pipeline loads it (`AutoTokenizer`, the model's ``tokenizer`` folder)."""
    from transformers import AutoTokenizer

    return SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(model_path, subfolder="tokenizer"))


#: the length vLLM-Omni's Qwen-Image pipeline truncates a prompt to, before its template's first tokens are dropped
QWEN_MAX_TOKENS = 1024


class _QwenPromptPipe:
    """What `verl_omni_rollout._qwen_fields` reads of verl-omni's Qwen-Image pipeline: its text tokenization (the
    pipeline's prompt template, `models._tiny_tokenizers.QWEN_IMAGE_TEMPLATE`: tests/models holds it to diffusers'
    pipeline, the replica engine test to vLLM-Omni's; the model's Qwen2 tokenizer; truncated as the pipeline
    truncates)."""

    def __init__(self, model_path: str) -> None:
        from transformers import Qwen2Tokenizer

        self.tokenizer = Qwen2Tokenizer.from_pretrained(model_path, subfolder="tokenizer")

    def _tokenize_text_prompt(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        from digenrl_verl.models._tiny_tokenizers import QWEN_IMAGE_DROP, QWEN_IMAGE_TEMPLATE

        tokens = self.tokenizer([QWEN_IMAGE_TEMPLATE.format(text)], max_length=QWEN_MAX_TOKENS + QWEN_IMAGE_DROP,
                                padding=True, truncation=True, return_tensors="pt")
        return tokens.input_ids, tokens.attention_mask


def _sd3_prompt_pipe(model_path: str) -> Any:
    """What `verl_omni_rollout._sd3_fields` reads of the pipeline: its CLIP and T5 tokenizers, loaded as vLLM-Omni's
    SD3 pipeline loads them (`CLIPTokenizer` from ``tokenizer``, `T5Tokenizer` from ``tokenizer_3``)."""
    from transformers import CLIPTokenizer, T5Tokenizer

    return SimpleNamespace(tokenizer=CLIPTokenizer.from_pretrained(model_path, subfolder="tokenizer"),
                           tokenizer_3=T5Tokenizer.from_pretrained(model_path, subfolder="tokenizer_3"))


#: architecture -> the tokenizer(s) the request fields are built with, without loading the pipeline
PROMPT_PIPES = {"WanPipeline": _wan_prompt_pipe, "QwenImagePipeline": _QwenPromptPipe,
                "StableDiffusion3Pipeline": _sd3_prompt_pipe}


def training_schedule(model_config: Any, architecture: str, algorithm: str) -> torch.Tensor:
    """σ_0..σ_N of verl-omni's training scheduler for the model (its registered `DiffusionModelBase`), fp32;
    ValueError naming the key when verl-omni registers no model for the architecture with that algorithm."""
    import verl_omni.pipelines  # noqa: F401  (registers the training adapters)
    from verl.utils.config import omega_conf_to_dataclass
    from verl_omni.pipelines.model_base import DiffusionModelBase

    try:
        adapter = DiffusionModelBase.get_class_by_name(architecture, algorithm)
    except NotImplementedError as e:
        kinds = sorted(k for k, (algo, _) in VERL_OMNI_SDE_KINDS.items() if algo != algorithm)
        raise ValueError(f"actor_rollout_ref.rollout.algo.sde_type gives verl-omni's algorithm {algorithm}, for which "
                         f"verl-omni registers no {architecture} ({e}); set sde_type to one of {kinds} if verl-omni "
                         "registers the model for that algorithm, or actor_rollout_ref.rollout.name=diffusers") from e
    scheduler = adapter.build_scheduler(omega_conf_to_dataclass(model_config))
    return torch.as_tensor(scheduler.sigmas).detach().cpu().float()


def generator_rank() -> int:
    """This generator's rank (verl's worker sets ``RANK`` in its process; 0 outside a worker group): the replica's
    rank, which names its Ray actors and ZMQ handles, so each generator rank's replica is its own."""
    return int(os.environ.get("RANK", "0"))


@ENGINES.register(ENGINE_NAME)
class VerlOmniReplicaEngine(InPlaceWeights):
    """Samples with one of verl-omni's rollout replicas, on this generator rank's own bundle (module docstring).

    Args:
        replica: the started `vLLMOmniReplica` (`start_replica`).
        config: what it was started with.
        spec: the policy (`check_replica_policy` passed).
        prompt_pipe: the tokenizer(s) the requests are built with (`PROMPT_PIPES`).
        schedule: σ_0..σ_N of verl-omni's training scheduler (`training_schedule`).
        shadow: the trainers' transformer (`verl_omni_rollout.shadow_transformer`); its trainable parameters are
            where arriving weights land before they go to the replica.
        version: the policy version the replica holds.
    """

    def __init__(self, replica: Any, config: ReplicaConfig, spec: PolicySpec, prompt_pipe: Any,
                 schedule: torch.Tensor, shadow: torch.nn.Module, version: int = 0) -> None:
        self.replica, self.config, self.spec = replica, config, spec
        self.prompt_pipe, self.schedule, self.shadow = prompt_pipe, schedule, shadow
        self.state = {n: p for n, p in shadow.named_parameters() if p.requires_grad}  # live: received in place
        self.version = int(version)
        self.architecture = read_model_index(spec.model_path)["_class_name"]
        self.sampling = sampling_dict(spec, VERL_OMNI_SDE_KINDS[spec.rollout.sde_type][1])
        self._updates = itertools.count()
        self.replicas_started = 1  # and one more per replacement (`replace_replica`)
        self.weights_received()  # the replica holds exactly the shadow's weights from the start (LoRA merged)

    @classmethod
    def from_policy(cls, spec: PolicySpec) -> "VerlOmniReplicaEngine":
        """Start this generator rank's replica (`generator_rank`, one logical GPU on CPU) for the policy's model and
        algorithm, at `spec.start_version`, in the rollout's dtype."""
        architecture, algorithm = check_replica_policy(spec)
        p = spec.pipeline
        config = ReplicaConfig(model=spec.model_path, algorithm=algorithm, height=p.height, width=p.width,
                               steps=spec.rollout.num_inference_steps, dtype=spec.engine.dtype,
                               replica_rank=generator_rank(), engine_kwargs=tuple(spec.engine.engine_kwargs.items()))
        # first: a model verl-omni does not register for the algorithm is refused before a replica starts
        schedule = training_schedule(replica_configs(config)[1], architecture, algorithm)
        replica = start_replica(config)
        return cls(replica, config, spec, PROMPT_PIPES[architecture](spec.model_path), schedule,
                   shadow_transformer(spec), spec.start_version)

    @property
    def server(self) -> Any:
        return self.replica.server_handle

    def server_requests(self, rows: RolloutRows) -> list[dict[str, Any]]:
        """The ``verl_omni`` engine's server requests for `rows` (`verl_omni_rollout.server_requests`)."""
        return server_requests(self.prompt_pipe, self.architecture, self.spec, self.sampling, rows)

    def generate(self, rows: RolloutRows) -> Rollout:
        """The rows' samples from the replica; if one of its actors has died (the server, or the worker holding its
        device), a new replica on the same bundle with the weights this engine holds, and the rows again: the same
        requests and seeds draw the same samples, so nothing is lost (`replace_replica`, once per call)."""
        from ray.exceptions import RayActorError

        requests = self.server_requests(rows)
        try:
            outputs = serve(self.server, requests)
        except RayActorError as e:
            self.replace_replica(e)
            outputs = serve(self.server, requests)
        for o in outputs:
            if o.log_probs is None or "all_latents" not in o.extra_fields:
                raise RuntimeError(f"verl-omni's replica returned no trajectory (stop reason {o.stop_reason!r})")
        parts = [trajectory_rows(o.extra_fields["all_latents"], o.log_probs, o.extra_fields["all_timesteps"],
                                 self.schedule) for o in outputs]
        return stack_rollout(parts, [served_media(o) for o in outputs], self.version)

    # -- weights (`InPlaceWeights`: broadcast, checkpoints and hand-overs land in the shadow, then the replica) ---
    def trainable(self) -> dict[str, torch.Tensor]:
        return self.state

    def weights_received(self) -> None:
        """Send the shadow's weights to the replica's workers (`send_weights`) and tell the server the step."""
        import ray

        with torch.no_grad():
            send_weights(self.server, pipeline_weights(self.shadow, self.spec.lora.enabled),
                         replica_rank=self.config.replica_rank, tp=self.config.tp,
                         update_id=f"digenrl-{next(self._updates)}")
        ray.get(self.server.clear_kv_cache.remote())

    def replace_replica(self, cause: BaseException) -> None:
        """Stop what is left of the replica (its half of the bundle's device is freed with its worker), start a new
        one on the same bundle (`start_replica`) and hand it the weights of the version this engine holds."""
        import logging

        logging.getLogger(__name__).warning(
            "generator rank %d: verl-omni's replica lost an actor (%s); starting a new one on the rank's bundle at "
            "version %d", self.config.replica_rank, type(cause).__name__, self.version)
        self.shutdown()
        self.replica = start_replica(self.config)
        self.replicas_started += 1
        self.weights_received()

    def shutdown(self) -> None:
        """Stop the replica's server and worker actors (their diffusion workers exit with them)."""
        import ray

        for actor in [*self.replica.servers, *self.replica.workers]:
            ray.kill(actor, no_restart=True)
