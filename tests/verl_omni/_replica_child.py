"""A fresh interpreter that starts verl-omni's own rollout replica on CPU, as verl-omni's separate mode starts it
(`vLLMOmniReplica.init_standalone`: verl's resource pool manager, a worker group of verl's `CheckpointEngineWorker`,
verl-omni's `vLLMOmniHttpServer` actor running vLLM-Omni's `AsyncOmni`), and sends it requests through the server
API verl-omni's agent loop uses (`generate`), for tests/verl_omni/test_verl_omni_replica_on_cpu.py.

The CPU comes from the package's platforms (verl's ``cpu`` with Ray's logical GPUs as the device slots,
``DIGENRL_CPU_RAY_GPUS=1``; vLLM's and vLLM-Omni's from their entry points); nothing else is patched here.

    python _replica_child.py <job.pkl> <out.pt>

job.pkl: {"model": dir, "algorithm": verl-omni's algorithm name, "height", "steps",
          "requests": [server request dicts: request_id, prompt (prompt_token_ids, negative_prompt_ids),
                       sampling_params]}
out.pt: {"start_s", "generate_s", "server": {"platform", "harness_imported", "workers"}, "outputs": [{"latents",
         "log_probs", "timesteps"} per request]}
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
import time
from pathlib import Path


def _configs(job: dict):
    """verl-omni's rollout and model configs (its Hydra files) for the tiny model, float32 on one logical GPU."""
    import verl_omni
    from hydra import compose, initialize_config_dir

    root = Path(verl_omni.__file__).parent / "trainer" / "config" / "diffusion"
    size = [f"pipeline.height={job['height']}", f"pipeline.width={job['height']}",
            f"pipeline.num_inference_steps={job['steps']}"]
    with initialize_config_dir(config_dir=str(root / "model"), version_base=None):
        model = compose(config_name="diffusion_model", overrides=[
            f"path={job['model']}", f"tokenizer_path={job['model']}/tokenizer", f"algorithm={job['algorithm']}",
            "attn_backend=native", *size])
    with initialize_config_dir(config_dir=str(root / "rollout"), version_base=None):
        rollout = compose(config_name="diffusion_rollout", overrides=[
            "name=vllm_omni", "tensor_model_parallel_size=1", "dtype=float32", "load_format=auto", "nnodes=1",
            "n_gpus_per_node=1", "rollout_attn_backend=null", "enforce_eager=true", *size])
    return rollout, model


def _server_facts() -> dict:
    import psutil
    import vllm_omni.platforms as omni_platforms

    return {"platform": type(omni_platforms.current_omni_platform).__qualname__,
            "harness_imported": "digenrl_verl.integrations.vllm_omni_cpu" in sys.modules,
            "workers": [p.name() for p in psutil.Process().children(recursive=True)]}


async def _run(job: dict) -> dict:
    import ray
    from verl_omni.workers.rollout.vllm_rollout.vllm_omni_async_server import vLLMOmniReplica

    rollout, model = _configs(job)
    t0 = time.perf_counter()
    replica = vLLMOmniReplica(0, rollout, model, gpus_per_node=1)
    await replica.init_standalone()
    result = {"start_s": time.perf_counter() - t0}
    server = replica.server_handle
    result["server"] = await server.__ray_call__.remote(lambda self: _server_facts())
    t1 = time.perf_counter()
    outputs = await asyncio.gather(*[server.generate.remote(
        request_id=r["request_id"], prompt_ids=r["prompt"]["prompt_token_ids"], sampling_params=r["sampling_params"],
        negative_prompt_ids=r["prompt"].get("negative_prompt_ids")) for r in job["requests"]])
    result["generate_s"] = time.perf_counter() - t1
    result["outputs"] = [{"latents": o.extra_fields["all_latents"], "log_probs": o.log_probs,
                          "timesteps": o.extra_fields["all_timesteps"]} for o in outputs]
    ray.shutdown()
    return result


def main(job_path: str, out_path: str) -> None:
    import ray
    import torch

    from digenrl_verl.platform import process_env
    from digenrl_verl.platform.cpu import LOGICAL_GPUS_VAR

    env = {**process_env(cpu=True), LOGICAL_GPUS_VAR: "1"}
    os.environ.update(env)  # this process (verl resolves its platform at import) and, through Ray, every actor
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": env})
    torch.save(asyncio.run(_run(job)), out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
