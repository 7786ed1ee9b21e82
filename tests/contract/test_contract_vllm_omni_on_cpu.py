"""DigenRL's vLLM-Omni backend (`engines.vllm_omni`) against the real vLLM-Omni code, on CPU.

Each test drives one point of the contract through vLLM-Omni's own code, with the exact arguments the engine
passes and a tiny FLUX model directory: the config resolver (engine kwargs, request batching), the model loader,
the start-up warm-up request, a real `DiffusionRequestBatch` through `forward`, post-processing + formatter +
msgpack serializer, the worker-extension class resolution, `collective_rpc` results and error dicts as the stage
client and stage pool build them, RPC arguments through the msgpack hop, MASTER_PORT precedence; and the
in-process client's stand-ins against the real classes. `AsyncOmni` itself and a worker process need CUDA.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import types

import pytest
import torch

pytest.importorskip("vllm_omni")

from vllm_omni.diffusion.data import DiffusionOutput, OmniDiffusionConfig  # noqa: E402
from vllm_omni.diffusion.diffusion_engine import DiffusionEngine  # noqa: E402
from vllm_omni.diffusion.request import OmniDiffusionRequest  # noqa: E402
from vllm_omni.diffusion.worker.diffusion_worker import (CustomPipelineWorkerExtension, DiffusionWorker,  # noqa: E402
                                                         WorkerWrapperBase)
from vllm_omni.diffusion.worker.request_batch import DiffusionRequestBatch  # noqa: E402
from vllm_omni.inputs.data import OmniDiffusionSamplingParams  # noqa: E402

from digenrl_verl.diffusion.noise import SampleKey  # noqa: E402
from digenrl_verl.diffusion.rollout import RolloutConfig, rollout  # noqa: E402
from digenrl_verl.engines import vllm_omni as vl  # noqa: E402
from digenrl_verl.engines.base import RolloutRows  # noqa: E402
from digenrl_verl.models.config import PipelineConfig  # noqa: E402
from digenrl_verl.weights.sync import CollectiveSpec, free_port, state_checksum  # noqa: E402

torch.set_num_threads(1)
PIPE = PipelineConfig(height=32, width=32, num_inference_steps=4, max_sequence_length=16)
CFG = RolloutConfig(num_inference_steps=4, sde_type="sde", noise_level=0.7, timestep_selection="window",
                    sde_window_size=2, sde_window_range=(0, 3), seed=3)
PROMPTS = ["a red cube", "a blue ball", "a red cube", "a blue ball"]
UIDS = ["u0", "u1", "u0", "u1"]
INDEX = [0, 1, 1, 0]


def custom_args(model: str) -> dict:
    return {"pipeline_class": vl.PIPELINE_CLASS, "model": model, "dtype": "float32", "start_version": 0,
            "lora": None, "pipeline": {k: v for k, v in dataclasses.asdict(PIPE).items() if v is not None}}


@pytest.fixture(scope="module")
def kwargs(flux_dir):
    """The exact kwargs `VllmOmniEngine` gives `AsyncOmni` (a user's max_num_seqs=8 included: clamped)."""
    with pytest.warns(UserWarning, match="max_num_seqs=8 is clamped to 1"):
        return vl.build_engine_kwargs(flux_dir, custom_args(flux_dir), {"max_num_seqs": 8}, dtype="float32",
                                      master_port=free_port())


@pytest.fixture(scope="module")
def od_config(kwargs):
    """The config vLLM-Omni's stage process builds: `from_kwargs`, then `enrich_config` (model_index.json)."""
    od = OmniDiffusionConfig.from_kwargs(**kwargs)
    od.enrich_config()
    return od


@pytest.fixture(scope="module")
def engine(od_config):
    """vLLM-Omni's `DiffusionEngine` with its real request/post-process hooks (no executor: that needs CUDA)."""
    eng = object.__new__(DiffusionEngine)
    eng.od_config = od_config
    eng._init_process_hooks(od_config)
    return eng


@pytest.fixture(scope="module")
def pipeline(od_config):
    """Our pipeline class, loaded by vLLM-Omni's own loader from the tiny directory (as `re_init_pipeline` does)."""
    from vllm.config import LoadConfig
    from vllm_omni.diffusion.model_loader.diffusers_loader import DiffusersPipelineLoader

    loader = DiffusersPipelineLoader(LoadConfig(), od_config=od_config)
    return loader.load_model(load_device="cpu", load_format="custom_pipeline",
                             custom_pipeline_name=od_config.custom_pipeline_args["pipeline_class"],
                             device=torch.device("cpu"))


def real_request(req: vl.OmniRequest) -> OmniDiffusionRequest:
    """What AsyncOmni hands the worker for one of our requests: a dict prompt, real sampling params."""
    return OmniDiffusionRequest(prompt={"prompt": req.prompt, "negative_prompt": req.negative_prompt},
                                sampling_params=OmniDiffusionSamplingParams(**req.sampling, extra_args=req.extra_args),
                                request_id=req.request_id)


def real_format(engine):
    def fmt(request, output):
        outs = engine.postprocess_output(request, output)
        assert len(outs) == 1
        return outs[0]

    return fmt


# -- point 1 and 2: the engine kwargs through vLLM-Omni's config resolver ----------------------------------------
def test_engine_kwargs_are_known_config_fields_and_resolve(kwargs, od_config):
    assert "enable_dummy_pipeline" not in kwargs  # 0.30: ValueError "Unknown diffusion config field(s)"
    known = {f.name for f in dataclasses.fields(OmniDiffusionConfig)}
    assert set(kwargs) <= known, f"from_kwargs would drop {set(kwargs) - known} (0.30 raises for them)"
    assert od_config.custom_pipeline_args == kwargs["custom_pipeline_args"]
    assert od_config.worker_extension_cls == vl.WORKER_EXTENSION_CLASS
    assert od_config.model_class_name == vl.PIPELINE_NAME
    assert od_config.max_num_seqs == 1


def test_request_batching_needs_max_num_seqs_1(kwargs, od_config):
    eng = object.__new__(DiffusionEngine)
    eng._resolve_execution_mode(od_config)  # our kwargs: accepted
    assert eng.supports_request_batch is False
    eight = OmniDiffusionConfig.from_kwargs(**{**kwargs, "max_num_seqs": 8})
    with pytest.raises(ValueError, match="does not support request-level batching"):
        object.__new__(DiffusionEngine)._resolve_execution_mode(eight)


def test_user_cannot_override_what_the_engine_owns(flux_dir):
    for key in ("enable_dummy_pipeline", "worker_extension_cls", "custom_pipeline_args", "model_class_name"):
        with pytest.raises(ValueError, match=key):
            vl.build_engine_kwargs(flux_dir, {}, {key: 1}, dtype="float32")


# -- point 6: vLLM-Omni's model loader ----------------------------------------------------------------------------
def test_loader_builds_the_pipeline_under_its_default_dtype(pipeline):
    assert type(pipeline).__name__ == vl.PIPELINE_NAME and isinstance(pipeline, torch.nn.Module)
    assert pipeline.weights_sources == ()
    state = pipeline.core.adapter.trainable_state()
    assert state and all(v.dtype == torch.float32 for v in state.values())  # our dtype, not the loader's bf16
    assert torch.get_default_dtype() == torch.float32


def test_load_weights_takes_buckets_of_trainable_weights(pipeline):
    version, state = pipeline.core.current_weights()
    name = sorted(state)[0]
    assert pipeline.load_weights(iter([(name, state[name] + 1)])) == {name}
    assert torch.equal(pipeline.core.current_weights()[1][name], state[name] + 1)
    pipeline.load_weights([(name, state[name])])
    with pytest.raises(ValueError, match="not trainable weights"):
        pipeline.load_weights([("nope.weight", torch.zeros(1))])


# -- point 8: the start-up warm-up request -----------------------------------------------------------------------
def test_warm_up_request_is_answered_with_an_empty_output(engine, pipeline):
    """vLLM-Omni's own `_dummy_run` (engine start-up), its request handed to our pipeline as the worker would."""
    seen = []

    def run(req):
        seen.append(req)
        return pipeline.forward(DiffusionRequestBatch([req]))

    engine.add_req_and_wait_for_response = run
    engine._dummy_run()  # raises "Dummy run failed" on an error output: engine init would abort
    (req,) = seen
    assert req.prompt == {"prompt": "dummy run"} and "digenrl" not in (req.sampling_params.extra_args or {})
    out = run(req)
    assert isinstance(out, DiffusionOutput) and out.output is None and not out.error
    assert engine.postprocess_output(req, out)[0].images == []


# -- points 4, 5, 7 and the post-processor: forward -> DiffusionOutput -> formatter -> serializer -----------------
def test_forward_output_formatter_and_serializer_round_trip(engine, pipeline):
    from vllm_omni.distributed.omni_connectors.utils.serialization import OmniMsgpackDecoder, OmniMsgpackEncoder

    reqs = vl.build_requests(PROMPTS, UIDS, INDEX, step=5, version=0, pipeline=PIPE, rollout=CFG)
    outs = []
    for r in reqs:
        request = real_request(r)
        out = pipeline.forward(DiffusionRequestBatch([request]))
        assert isinstance(out, DiffusionOutput)
        assert set(out.output) == {"payload", "metadata"} and set(out.output["payload"]) == {"image"}
        formatted = engine.postprocess_output(request, out)[0]
        wire = OmniMsgpackDecoder().decode(OmniMsgpackEncoder().encode({"type": "result", "output": formatted}))
        received = wire["output"]
        images, rl = vl.read_request_output(received)
        assert images.dtype == torch.uint8 and images.shape[0] == r.num_outputs
        assert rl["sample_indices"] == r.extra_args["digenrl"]["sample_indices"]
        assert torch.equal(received.trajectory_log_probs, rl["log_probs"])
        outs.append({"trajectory": vl.Trajectory.from_tensors(rl, rl["sde_type"], rl["noise_level"]),
                     "images": images, "policy_version": rl["policy_version"],
                     "sample_indices": rl["sample_indices"]})
    tensors, images = vl.outputs_to_batch(reqs, outs, list(range(4)), 4)
    adapter = pipeline.core.adapter
    ref = rollout(adapter, adapter.encode_prompts(PROMPTS), [SampleKey(5, u, i) for u, i in zip(UIDS, INDEX)], CFG)
    assert torch.equal(tensors["step_index"], ref.step_index)
    torch.testing.assert_close(tensors["log_probs"], ref.log_probs, rtol=1e-4, atol=1e-5)


def test_flux_post_processor_rejects_the_envelope_without_our_model_class_name(kwargs, pipeline):
    od = OmniDiffusionConfig.from_kwargs(**{k: v for k, v in kwargs.items() if k != "model_class_name"})
    od.enrich_config()
    assert od.model_class_name == "FluxPipeline"  # what vLLM-Omni reads from model_index.json
    eng = object.__new__(DiffusionEngine)
    eng.od_config = od
    eng._init_process_hooks(od)
    r = vl.build_requests(PROMPTS[:1], UIDS[:1], INDEX[:1], step=0, version=0, pipeline=PIPE, rollout=CFG)[0]
    request = real_request(r)
    with pytest.raises(Exception):  # noqa: B017 - whatever FLUX's post-processor raises on a dict
        eng.postprocess_output(request, pipeline.forward(DiffusionRequestBatch([request])))


# -- point 3: worker-extension class resolution ----------------------------------------------------------------
def test_worker_extension_keeps_re_init_pipeline(kwargs):
    wrapper = object.__new__(WorkerWrapperBase)
    wrapper.base_worker_class = DiffusionWorker
    wrapper.worker_extension_cls = kwargs["worker_extension_cls"]
    wrapper.custom_pipeline_args = kwargs["custom_pipeline_args"]
    cls = wrapper._prepare_worker_class()
    assert issubclass(cls, CustomPipelineWorkerExtension) and issubclass(cls, DiffusionWorker)
    assert cls.re_init_pipeline is CustomPipelineWorkerExtension.re_init_pipeline
    for m in ("digenrl_stage_weights", "digenrl_receive_ipc", "digenrl_trainable_state", "digenrl_load_weights",
              "digenrl_weights_meta", "digenrl_version"):
        assert callable(getattr(cls, m))


def test_worker_extension_finds_the_loaded_pipeline(pipeline):
    ext = object.__new__(vl.make_worker_extension_class())
    ext.model_runner = types.SimpleNamespace(pipeline=pipeline)
    meta = ext.digenrl_weights_meta()
    version, state = pipeline.core.current_weights()
    assert set(meta) == set(state) and all(m[1] == "float32" for m in meta.values())
    new = {k: v + 0.5 for k, v in state.items()}
    assert ext.digenrl_stage_weights(new, version + 1) == version + 1
    got = ext.digenrl_trainable_state()
    assert got["version"] == version + 1 and state_checksum(got["state"]) == state_checksum(new)
    ext.digenrl_stage_weights(state, version)  # restore for the other tests


# -- point 9: collective_rpc results and error dicts ----------------------------------------------------------
def _drain(messages, pending):
    """vLLM-Omni's stage client routing messages from its subprocess (`_drain_responses`), on encoded bytes."""
    import zmq
    from vllm_omni.diffusion.stage_diffusion_client import StageDiffusionClient
    from vllm_omni.distributed.omni_connectors.utils.serialization import OmniMsgpackDecoder, OmniMsgpackEncoder

    raw = [OmniMsgpackEncoder().encode(m) for m in messages]

    class Socket:
        def recv(self, flags=0):
            if not raw:
                raise zmq.Again()
            return raw.pop(0)

    client = object.__new__(StageDiffusionClient)
    client._response_socket, client._decoder = Socket(), OmniMsgpackDecoder()
    client._pending_rpcs, client._rpc_results = set(pending), {}
    client._output_queue = asyncio.Queue()
    client.stage_id = client.replica_id = 0
    client._engine_dead = False
    client._drain_responses()
    return client._rpc_results


def test_collective_rpc_results_unwrap_and_errors_raise():
    results = _drain([{"type": "rpc_result", "rpc_id": "a", "result": [{"version": 3}]},
                      {"type": "error", "rpc_id": "b", "error": "ValueError: boom"}], {"a", "b"})
    assert vl.unwrap_rpc_result("m", [results["a"]]) == {"version": 3}  # AsyncOmni: one entry per stage
    assert results["b"] == {"error": True, "reason": "ValueError: boom"}
    with pytest.raises(vl.VllmOmniRpcError, match="failed in m: ValueError: boom"):
        vl.unwrap_rpc_result("m", [results["b"]])


def test_stage_pool_failure_dict_raises():
    from vllm_omni.engine.stage_pool import StagePool

    class Failing:
        async def collective_rpc_async(self, **kw):
            raise RuntimeError("worker has no method digenrl_x")

    class DiffusionStagePool(StagePool):  # the real collective_rpc; only the stage type is fixed
        stage_type = "diffusion"

    pool = object.__new__(DiffusionStagePool)
    pool.clients, pool.stage_id = [Failing()], 0
    answer = asyncio.run(pool.collective_rpc(0, "digenrl_x"))
    assert answer["supported"] is False
    with pytest.raises(vl.VllmOmniRpcError, match="no method digenrl_x"):
        vl.unwrap_rpc_result("digenrl_x", [answer])


# -- RPC arguments through the msgpack hop -----------------------------------------------------------------------
def test_rpc_arguments_are_plain_data_through_msgpack():
    from vllm_omni.distributed.omni_connectors.utils.serialization import OmniMsgpackDecoder, OmniMsgpackEncoder

    state = {"a.weight": torch.randn(3, 2), "b.weight": torch.randn(4).to(torch.bfloat16)}
    sent = [("digenrl_stage_weights", (state, 3)), ("digenrl_load_weights", ("/ckpt/step_2", 2)),
            ("digenrl_receive_ipc", ("ipc:///tmp/x.sock", 4, False)), ("digenrl_trainable_state", ())]
    for method, args in sent:
        msg = {"type": "collective_rpc", "rpc_id": "r", "method": method, "args": list(vl.plain_rpc_args(args)),
               "kwargs": {}}
        got = OmniMsgpackDecoder().decode(OmniMsgpackEncoder().encode(msg))["args"]
        assert len(got) == len(args)
        for a, b in zip(args, got):
            if isinstance(a, dict):
                assert state_checksum(a) == state_checksum(b)
            else:
                assert a == b
    spec = CollectiveSpec("127.0.0.1", 1, 1, 1)
    got = OmniMsgpackDecoder().decode(OmniMsgpackEncoder().encode({"args": [spec]}))["args"][0]
    assert not isinstance(got, CollectiveSpec)  # what a dataclass becomes on the way: why we refuse it
    with pytest.raises(TypeError, match="dataclass"):
        vl.plain_rpc_args((spec,))


# -- MASTER_PORT -----------------------------------------------------------------------------------------------
def test_master_port_env_wins_so_each_engine_sets_its_own(monkeypatch, kwargs):
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # inherited from verl's worker group
    od = OmniDiffusionConfig.from_kwargs(**kwargs)
    inherited = int(__import__("os").environ["MASTER_PORT"])
    assert od.master_port != kwargs["master_port"] and od.master_port >= inherited
    port = vl.isolate_master_port()
    assert OmniDiffusionConfig.from_kwargs(**{**kwargs, "master_port": port}).master_port == port


# -- the in-process client held to the real classes and signatures ------------------------------------------------
def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_stand_ins_are_subsets_of_the_real_classes():
    assert _fields(vl.SamplingParams) <= _fields(OmniDiffusionSamplingParams)
    assert _fields(vl.StandInRequest) <= _fields(OmniDiffusionRequest)
    assert _fields(vl.StandInDiffusionOutput) <= _fields(DiffusionOutput)
    assert _fields(vl.StandInRequestBatch) == _fields(DiffusionRequestBatch)
    for member in ("prompts", "sampling_params", "request_id", "is_dummy_run"):
        assert hasattr(DiffusionRequestBatch, member)
    from vllm_omni.diffusion.request import DUMMY_DIFFUSION_REQUEST_ID

    assert vl.DUMMY_REQUEST_ID == DUMMY_DIFFUSION_REQUEST_ID


def test_in_process_client_has_async_omnis_signatures():
    src = inspect.getsource(__import__("vllm_omni.entrypoints.async_omni", fromlist=["x"]))
    assert "def collective_rpc(" in src and "async def generate(" in src or "def generate(" in src
    real_rpc = ["self", "method", "timeout", "args", "kwargs", "stage_ids"]
    assert list(inspect.signature(vl.InProcessOmniEngine.collective_rpc).parameters) == real_rpc
    assert "self,\n        method: str,\n        timeout: float | None = None,\n        args: tuple" in src
    assert list(inspect.signature(vl.InProcessOmniEngine.generate).parameters)[:4] == [
        "self", "prompt", "sampling_params", "request_id"]


def _rows():
    return RolloutRows(PROMPTS, UIDS, INDEX, [0, 1, 2, 3], 5)


def test_in_process_engine_with_the_real_classes_matches_the_stand_ins(flux_dir, engine):
    real = vl.OmniClasses(request=OmniDiffusionRequest, request_batch=DiffusionRequestBatch, output=DiffusionOutput,
                          format=real_format(engine))
    out = {}
    for name, classes in (("stand_in", None), ("real", real)):
        eng = vl.VllmOmniEngine(flux_dir, PIPE, CFG, dtype="float32", client="inprocess", device="cpu")
        if classes is not None:
            eng._client = vl.InProcessOmniEngine(flux_dir, eng.custom, "cpu", classes=classes)
            eng.params_cls = OmniDiffusionSamplingParams
        out[name] = eng.generate(_rows())
        # weights hand-over by RPC (the LoRA-sized path) and the answers' shapes
        _, state = eng._client.core.current_weights()
        eng.hand_over({k: v * 0.5 for k, v in state.items()}, 1)
        eng.version = 1
        assert eng.checksum() == state_checksum({k: v * 0.5 for k, v in state.items()})
        with pytest.raises(vl.VllmOmniRpcError, match="FileNotFoundError|No such file"):
            eng.rpc("digenrl_load_weights", "/nonexistent", 2)
    for k in ("latents", "next_latents", "rollout_log_probs", "step_index", "policy_version"):
        assert torch.equal(out["stand_in"].tensors[k], out["real"].tensors[k]), k
    assert torch.equal(out["stand_in"].images, out["real"].images)
