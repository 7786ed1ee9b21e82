"""A fresh interpreter that serves requests with a real vLLM-Omni `AsyncOmni` on CPU (the replica's engine), for
tests/verl_omni/test_verl_omni_cpu_platform.py. Nothing of the in-process harness is imported here: the platforms
come from the package's entry points, the pipeline is loaded by the diffusion worker vLLM-Omni spawns.

    python _async_omni_child.py <job.pkl> <out.pt>

job.pkl: {"model": dir, "pipeline_class": path, "requests": [(request_id, prompt dict, OmniDiffusionSamplingParams)],
          "update": optional {"weights": [(pipeline name, tensor)], "requests": [...]}: new weights between two
          rounds, sent as verl's rollout server adapter sends them (`ServerAdapter.update_weights`): the workers'
          `update_weights_from_ipc` (verl-omni's worker extension) started by RPC, verl's `BucketedWeightSender` on
          the worker's ZMQ handle (shared memory on CPU)}.
out.pt: {"platform", "vllm_platform", "workers" (child process names), "harness_imported", "start_s", "rounds":
         [[{"latents", "log_probs", "timesteps", "image"} per request] per round], "generate_s"}
"""

from __future__ import annotations

import asyncio
import importlib
import os
import pickle
import sys
import time

# what verl-omni's server names for a diffusion replica (vLLMOmniHttpServer._get_worker_extension_cls)
WORKER_EXTENSION = "verl_omni.workers.rollout.vllm_rollout.utils.vLLMOmniColocateWorkerExtension"


def _fields(final) -> dict:
    import numpy as np
    import torch

    image = final.images[0]
    return {"latents": final.trajectory_latents, "log_probs": final.trajectory_log_probs,
            "timesteps": final.trajectory_timesteps,
            "image": torch.from_numpy(np.array(image)) if not isinstance(image, torch.Tensor) else image}


async def _generate(engine, requests) -> list[dict]:
    out = []
    for request_id, prompt, params in requests:
        final = None
        async for output in engine.generate(prompt=prompt, request_id=request_id, sampling_params_list=[params]):
            final = output
        out.append(_fields(final))
    return out


JOB_ID, REPLICA = "digenrl-test", "0"  # what the server actor exports to its workers (VERL_RAY_JOB_ID, ...)


async def _update_weights(engine, weights, bucket_mb: int = 1) -> None:
    """verl's `ServerAdapter.update_weights` for rank 0 of replica 0, with its own classes."""
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    receiving = asyncio.ensure_future(engine.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True}))
    sender = BucketedWeightSender(zmq_handle=f"ipc:///tmp/rl-colocate-zmq-{JOB_ID}-replica-{REPLICA}-rank-0.sock",
                                  bucket_size_mb=bucket_mb, use_shm=True)
    # verl's sender blocks on its first ZMQ send until the worker's receiver is up; the RPC that starts the receiver
    # runs on this loop, so the sender gets a thread of its own (verl's adapter sends the RPC through Ray instead)
    await asyncio.to_thread(asyncio.run, sender.async_send_weights(iter(weights)))
    await receiving


async def _serve(job: dict) -> dict:
    import psutil
    import vllm_omni.platforms as omni_platforms
    from vllm.platforms import current_platform
    from vllm_omni.entrypoints import AsyncOmni

    from digenrl_verl.platform import process_env
    from digenrl_verl.platform.torchvision_stub import stub_torchvision

    # inherited by the spawned workers: what the server actor exports, and verl's CPU platform as the package's CPU
    # worker processes get it (verl's receiver synchronizes verl's device)
    os.environ.update(VERL_RAY_JOB_ID=JOB_ID, VERL_REPLICA_RANK=REPLICA, **process_env(cpu=True))
    # the rollout adapter's module, imported where the server runs (verl-omni's server imports verl_omni.pipelines):
    # it installs its post-processing (rollout metadata kept), which AsyncOmni's stage applies in this process
    stub_torchvision()  # Wan's package imports torchvision; the CPU venv has none
    importlib.import_module(job["pipeline_class"].rpartition(".")[0])
    t0 = time.perf_counter()
    engine = AsyncOmni(model=job["model"], dtype="float32", enable_dummy_pipeline=True,
                       custom_pipeline_args={"pipeline_class": job["pipeline_class"]},
                       worker_extension_cls=WORKER_EXTENSION, stage_init_timeout=600, init_timeout=900)
    result = {"start_s": time.perf_counter() - t0,
              "platform": type(omni_platforms.current_omni_platform).__qualname__,
              "vllm_platform": type(current_platform).__qualname__,
              "workers": [p.name() for p in psutil.Process().children(recursive=True)],
              "harness_imported": "digenrl_verl.integrations.vllm_omni_cpu" in sys.modules}
    try:
        t1 = time.perf_counter()
        result["rounds"] = [await _generate(engine, job["requests"])]
        result["generate_s"] = time.perf_counter() - t1
        update = job.get("update")
        if update is not None:
            await _update_weights(engine, update["weights"])
            result["rounds"].append(await _generate(engine, update["requests"]))
    finally:
        engine.shutdown()
    return result


def main(job_path: str, out_path: str) -> None:
    import torch

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    torch.save(asyncio.run(_serve(job)), out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
