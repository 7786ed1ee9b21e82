"""`VllmOmniEngine`'s lazy `AsyncOmni` start, driven from inside the engine's running loop (issue 23, item 4).

`generate`, `receive_weights` and `checksum` run their coroutines on the engine's loop (`run_until_complete`), and
the client starts lazily inside them. That start must build the real `AsyncOmni` right there (it binds to the
running loop), not call `run_until_complete` again ("This event loop is already running", which every first call
raised). The in-process stand-in never takes that path, so these tests take it:

* the real `AsyncOmni(**kwargs)` with the engine's exact kwargs, on CPU: the engine's CUDA gate is lifted, so
  vLLM-Omni's own constructor runs from inside each entry point and goes as far as CPU lets it, vLLM-Omni's
  stage-config resolution, where the platform is `UnspecifiedOmniPlatform` (no CUDA / NPU / ROCm / XPU / MUSA:
  `get_default_stage_config_path` raises NotImplementedError). That, and not the event-loop error, must surface;
* a recording client standing in for `AsyncOmni` from its constructor on (which needs a running loop, as the real
  one does): started once, on the engine's loop, then serving `generate`, the weight hand-over and `checksum`.
"""

from __future__ import annotations

import asyncio
import traceback
import types

import pytest
import torch

pytest.importorskip("vllm_omni")

from vllm_omni.inputs.data import OmniDiffusionSamplingParams  # noqa: E402

from digenrl_verl.diffusion.rollout import RolloutConfig  # noqa: E402
from digenrl_verl.engines import vllm_omni as vl  # noqa: E402
from digenrl_verl.engines.base import RolloutRows  # noqa: E402
from digenrl_verl.models.config import PipelineConfig  # noqa: E402
from digenrl_verl.weights.sync import state_checksum  # noqa: E402

torch.set_num_threads(1)
PIPE = PipelineConfig(height=32, width=32, num_inference_steps=2, max_sequence_length=16)
CFG = RolloutConfig(num_inference_steps=2, sde_type="sde", noise_level=0.7, seed=3)
EVENT_LOOP_ERROR = "This event loop is already running"


def _rows() -> RolloutRows:
    return RolloutRows(["a red cube", "a red cube"], ["u0", "u0"], [0, 1], [0, 1], 1)


class _JoinedStandIn:
    """What `join` leaves in the actor, for `receive_weights` (the pair group is not what is under test)."""

    spec = types.SimpleNamespace(backend="gloo")

    def receive_weights(self, buffers):
        for t in buffers.values():
            t.fill_(0.25)


def _engine(flux_dir: str) -> vl.VllmOmniEngine:
    return vl.VllmOmniEngine(flux_dir, PIPE, CFG, {"stage_init_timeout": 30, "init_timeout": 60}, dtype="float32",
                             client="async_omni", device="cpu")


# -- the real AsyncOmni, as far as CPU goes ----------------------------------------------------------------------
ENTRY_POINTS = {
    "generate": lambda eng: eng.generate(_rows()),
    "receive_weights": lambda eng: eng.receive_weights(1),
    "checksum": lambda eng: eng.checksum(),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_first_call_builds_the_real_async_omni_on_the_engines_loop(monkeypatch, flux_dir, entry):
    import vllm_omni.platforms as omni_platforms

    # the CPU-only stop this test expects: no vLLM-Omni platform on this host
    assert type(omni_platforms.current_omni_platform).__name__ == "UnspecifiedOmniPlatform"
    monkeypatch.setattr(vl, "require_vllm_omni", lambda: None)  # lift the engine's CUDA gate: the real path runs
    eng = _engine(flux_dir)
    eng.collectives = _JoinedStandIn()
    with pytest.raises(Exception) as info:  # noqa: PT011 - which exception is what the test checks
        ENTRY_POINTS[entry](eng)
    assert EVENT_LOOP_ERROR not in str(info.value), "the lazy start re-entered the engine's running loop"
    frames = [(f.name, f.filename) for f in traceback.extract_tb(info.value.__traceback__)]
    names = [n for n, _ in frames]
    # vLLM-Omni's own constructor ran, called from the engine's coroutine on its loop ...
    assert "start_client" in names and "__init__" in names, frames
    assert any(n == "__init__" and f.endswith("async_omni.py") for n, f in frames), frames
    # ... and stopped where CPU stops it: the platform has no stage configs
    assert isinstance(info.value, NotImplementedError), repr(info.value)
    assert names[-1] == "get_default_stage_config_path", frames
    assert eng._client is None and not eng.loop.is_running()


# -- started once, on the loop, then serving every entry point -----------------------------------------------------
def _recording_async_omni(started: list):
    class RecordingAsyncOmni(vl.InProcessOmniEngine):
        """`AsyncOmni(**kwargs)` from the constructor on: needs a running loop (as the real one's event resolver
        does), and serves requests and RPCs with DigenRL's pipeline and worker methods in this process."""

        def __init__(self, *, model: str, custom_pipeline_args: dict, **kwargs):
            started.append((asyncio.get_running_loop(), dict(kwargs)))
            super().__init__(model, custom_pipeline_args, device="cpu")

    return RecordingAsyncOmni


def test_lazy_client_starts_once_on_the_engines_loop_and_serves_everything(monkeypatch, flux_dir):
    started: list = []
    api = vl.VllmOmniApi(_recording_async_omni(started), OmniDiffusionSamplingParams, None, None)
    monkeypatch.setattr(vl, "import_vllm_omni", lambda **_: api)
    eng = _engine(flux_dir)
    out = eng.generate(_rows())
    assert out.tensors["policy_version"].tolist() == [0, 0]
    assert len(started) == 1 and started[0][0] is eng.loop
    assert started[0][1]["master_port"] > 0 and started[0][1]["worker_extension_cls"] == vl.WORKER_EXTENSION_CLASS
    assert eng.params_cls is OmniDiffusionSamplingParams
    eng.collectives = _JoinedStandIn()
    assert eng.receive_weights(1) == 1
    meta = eng.weights_meta()
    assert eng.checksum() == state_checksum({k: torch.full(s, 0.25, dtype=getattr(torch, d))
                                             for k, (s, d) in meta.items()})
    assert eng.generate(_rows()).tensors["policy_version"].tolist() == [1, 1]
    assert len(started) == 1, "the client started more than once"


def test_client_property_outside_and_inside_the_loop(monkeypatch, flux_dir):
    started: list = []
    api = vl.VllmOmniApi(_recording_async_omni(started), OmniDiffusionSamplingParams, None, None)
    monkeypatch.setattr(vl, "import_vllm_omni", lambda **_: api)
    eng = _engine(flux_dir)

    async def read_on_the_loop():
        return eng.client

    with pytest.raises(RuntimeError, match="await start_client"):
        eng.loop.run_until_complete(read_on_the_loop())
    client = eng.client  # outside the loop: starts it there
    assert started[0][0] is eng.loop and eng.client is client
    assert eng.loop.run_until_complete(read_on_the_loop()) is client
