"""verl-omni's own rollout replica on CPU (issue 29 item 2): `vLLMOmniReplica.init_standalone`, the way verl-omni's
separate mode starts its generators, in a fresh interpreter with Ray's logical GPUs as the device slots
(`_replica_child.py`). It starts verl's worker group and verl-omni's `vLLMOmniHttpServer`, whose `AsyncOmni` spawns
vLLM-Omni's diffusion worker; requests go through the server's `generate` (verl-omni's agent-loop API) with
verl-omni's sampling dict and the per-sample seeds, built by the `verl_omni` rollout engine's `server_requests`.
Its samples equal the in-process pipeline's for the same requests (trajectory latents, log-probs), and after new
weights go through verl-omni's checkpoint-engine manager over the package's gloo backend into the replica's own
`CheckpointEngineWorker`, its next samples are the in-process pipeline's with those weights, not the old ones'.

Qwen-Image with ``rollout.tensor_model_parallel_size=2`` (two vLLM-Omni workers over gloo, on two of Ray's logical
GPUs), and on CUDA Wan2.2, Qwen-Image and SD3.5 with one worker; their requests are token ids, as the server takes
them (SD3.5: per-encoder ids, ``extra_prompt_ids``, as verl-omni's agent loop sends them).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import failure_summary  # noqa: E402
from test_verl_omni_cpu_platform import ROWS, TOL, _in_process, _rel, _spec  # noqa: E402

from digenrl_verl.engines.base import ENGINES  # noqa: E402
from digenrl_verl.engines.spec import VERL_OMNI_SDE_KINDS  # noqa: E402
from digenrl_verl.integrations.verl_omni_rollout import pipeline_weights  # noqa: E402
from digenrl_verl.models import build_tiny_model_dir  # noqa: E402

HERE = Path(__file__).resolve().parent
# (architecture, rollout.tensor_model_parallel_size): TP 2 is two vLLM-Omni workers over gloo on two logical GPUs.
# On CPU (~60-130 s a replica start) the TP 2 case alone: a one-worker Wan2.2 replica starts in
# test_verl_omni_replica_engine.py (the same server, its samples against the in-process pipeline's, new weights
# followed, through the rollout engine), and the TP 2 case takes this test's checkpoint-engine path with two workers.
# On CUDA (tests/gpu/run_replica_check.sh) each is a case here, Qwen-Image at TP 1 too.
CASES = (("QwenImagePipeline", 2), *((("WanPipeline", 1), ("QwenImagePipeline", 1), ("StableDiffusion3Pipeline", 1))
                                     if torch.cuda.is_available() else ()))


def _unbatched(value) -> torch.Tensor:
    value = torch.as_tensor(value)
    return value[0] if value.dim() > 0 and value.shape[0] == 1 else value  # the server's `_maybe_unbatch`


def _errors(got: list[dict], want: list[dict]) -> dict[str, float]:
    assert len(got) == len(want)
    return {k: max(_rel(g[k], _unbatched(w[k])) for g, w in zip(got, want)) for k in ("latents", "log_probs")}


def references(arch: str, tp: int, work: Path) -> tuple[dict, dict]:
    """The replica child's job (its requests, the new weights' file) and the in-process pipeline's samples it is held
    to (before, after the update, the old weights' after), drawn by the ``verl_omni`` engine in this process."""
    spec = _spec(arch, str(build_tiny_model_dir(arch, work / "model")))
    engine = ENGINES.engine_class("verl_omni").from_policy(spec)
    job = {"model": spec.model_path, "algorithm": VERL_OMNI_SDE_KINDS[spec.rollout.sde_type][0],
           "height": spec.pipeline.height, "steps": spec.rollout.num_inference_steps, "tp": tp,
           "requests": engine.server_requests(ROWS)}
    want = _in_process(engine, engine.requests(ROWS))
    second = replace(ROWS, step=2)
    job["update"] = {"weights_file": str(work / "new.safetensors"), "requests": engine.server_requests(second)}
    old = _in_process(engine, engine.requests(second))
    gen = torch.Generator().manual_seed(1)
    engine.hand_over({n: p.detach() + 0.05 * torch.randn(p.shape, generator=gen) for n, p in engine.state.items()}, 1)
    save_file({n: t.clone().contiguous() for n, t in pipeline_weights(engine.shadow, lora=False)},
              job["update"]["weights_file"])
    return job, {"tp": tp, "before": want, "after": _in_process(engine, engine.requests(second)), "after_old": old}


#: `references` in a child with CUDA hidden: the in-process pipeline is CPU only (`vllm_omni_cpu` refuses a process
#: that sees CUDA), so on a CUDA host (tests/gpu/run_replica_check.sh) the references are drawn there
_CPU_CHILD = """
import sys, torch
from pathlib import Path
sys.path.append({here!r})
from test_verl_omni_replica_on_cpu import references
torch.save(references({arch!r}, {tp}, Path({work!r})), {out!r})
"""


def cpu_references(arch: str, tp: int, work: Path) -> tuple[dict, dict]:
    if not torch.cuda.is_available():
        return references(arch, tp, work)
    out = work / "references.pt"
    code = _CPU_CHILD.format(here=str(HERE), arch=arch, tp=tp, work=str(work), out=str(out))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, failure_summary(proc.stdout + proc.stderr)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-tp{t}" for a, t in CASES])
def replica_run(request, tmp_path_factory):
    (arch, tp), work = request.param, tmp_path_factory.mktemp(request.param[0])
    job, refs = cpu_references(arch, tp, work)
    (work / "job.pkl").write_bytes(pickle.dumps(job))
    proc = subprocess.run([sys.executable, str(HERE / "_replica_child.py"), str(work / "job.pkl"),
                           str(work / "out.pt")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, failure_summary(proc.stdout + proc.stderr)
    return f"{arch} tp{tp}", torch.load(work / "out.pt", weights_only=False), refs


@pytest.mark.slow  # Ray, verl-omni's server actor, AsyncOmni and its worker process
def test_verl_omnis_replica_starts_on_cpu_and_samples_what_the_in_process_pipeline_samples(replica_run):
    arch, got, refs = replica_run
    want = refs["before"]
    server = got["server"]
    on_cpu = not torch.cuda.is_available()  # tests/gpu runs this test on CUDA (then vLLM-Omni's own platform)
    assert (server["platform"] == "CpuOmniPlatform") == on_cpu and not server["harness_imported"], server
    workers = [name for name in server["workers"] if name.startswith("vLLM-Omni::DiffusionWorker")]
    assert len(workers) == refs["tp"], server["workers"]  # one diffusion worker process per tensor-parallel rank
    errors = _errors(got["outputs"], want)
    print(f"{arch}: replica vs in-process {errors}; replica start {got['start_s']:.1f} s, "
          f"{len(want)} samples in {got['generate_s']:.1f} s")
    assert max(errors.values()) <= TOL, errors


@pytest.mark.slow
def test_weights_through_the_gloo_checkpoint_engine_change_the_replicas_next_samples(replica_run):
    """verl-omni's checkpoint-engine manager, a trainer rank on verl-omni's worker methods, the replica's own
    `CheckpointEngineWorker` and server adapter, the package's gloo backend: the next samples are the in-process
    pipeline's with the new weights, not the old ones'."""
    arch, got, refs = replica_run
    err, stale = _errors(got["updated"], refs["after"]), _errors(got["updated"], refs["after_old"])
    moved = _errors(refs["after"], refs["after_old"])
    print(f"{arch}: after the update {err} (the new weights move the samples by {moved})")
    assert max(err.values()) <= TOL, err
    assert max(stale.values()) > 1e3 * TOL, stale  # the old weights' samples are not what came back
