"""A fresh interpreter that starts verl-omni's own rollout replica on CPU, as verl-omni's separate mode starts it
(`vLLMOmniReplica.init_standalone`: verl's resource pool manager, a worker group of verl's `CheckpointEngineWorker`,
verl-omni's `vLLMOmniHttpServer` actor running vLLM-Omni's `AsyncOmni`), and sends it requests through the server
API verl-omni's agent loop uses (`generate`), for tests/verl_omni/test_verl_omni_replica_on_cpu.py.

On a CUDA host the same child runs on the GPUs (Ray's own, verl's and vLLM's platforms, verl-omni's `nccl` checkpoint
engine): tests/gpu/run_replica_check.sh. On CPU the devices come from the package's platforms (verl's ``cpu`` with
Ray's logical GPUs as the device slots, ``DIGENRL_CPU_RAY_GPUS=1``; vLLM's and vLLM-Omni's from their entry points);
nothing else is patched here.

    python _replica_child.py <job.pkl> <out.pt>

job.pkl: {"model": dir, "algorithm": verl-omni's algorithm name, "height", "steps", "tp": the replica's
          tensor_model_parallel_size (its logical GPUs; vLLM-Omni's workers over gloo),
          "requests": [server request dicts: request_id, prompt (prompt_token_ids, negative_prompt_ids),
                       sampling_params]}
          "update": optional {"weights_file": safetensors of pipeline weights, "requests": [...]}: sent through the
          checkpoint engine after the first round, then the second round}
out.pt: {"start_s", "generate_s", "server": {"platform", "harness_imported", "workers"}, "outputs": [{"latents",
         "log_probs", "timesteps"} per request], "updated": the same for the second round}
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
import time
from pathlib import Path


def _configs(job: dict):
    """verl-omni's rollout and model configs (its Hydra files) for the tiny model, float32, ``tp`` logical GPUs."""
    from digenrl_verl.integrations.verl_omni_replica import ReplicaConfig, replica_configs

    return replica_configs(ReplicaConfig(model=job["model"], algorithm=job["algorithm"], height=job["height"],
                                         width=job["height"], steps=job["steps"], tp=job["tp"]))


async def _run(job: dict) -> dict:
    import ray
    from verl_omni.workers.rollout.vllm_rollout.vllm_omni_async_server import vLLMOmniReplica

    from digenrl_verl.integrations.verl_omni_replica import server_facts

    rollout, model = _configs(job)
    t0 = time.perf_counter()
    replica = vLLMOmniReplica(0, rollout, model, gpus_per_node=job["tp"])
    await replica.init_standalone()
    result = {"start_s": time.perf_counter() - t0}
    server = replica.server_handle
    result["server"] = await server.__ray_call__.remote(lambda self: server_facts())
    t1 = time.perf_counter()
    result["outputs"] = await _generate(server, job["requests"])
    result["generate_s"] = time.perf_counter() - t1
    if job.get("update"):
        await _update_through_the_checkpoint_engine(rollout, replica, job["update"]["weights_file"])
        result["updated"] = await _generate(server, job["update"]["requests"])
    ray.shutdown()
    return result


async def _generate(server, requests) -> list[dict]:
    from digenrl_verl.integrations.verl_omni_replica import serve

    outputs = await asyncio.to_thread(serve, server, requests)
    return [{"latents": o.extra_fields["all_latents"], "log_probs": o.log_probs,
             "timesteps": o.extra_fields["all_timesteps"]} for o in outputs]


async def _update_through_the_checkpoint_engine(rollout, replica, weights_file: str) -> None:
    """verl-omni's `OmniCheckpointEngineManager.update_weights` (with the package's version mixin) from one trainer
    rank on verl-omni's trainer-worker methods (`_gloo_ce_workers.PipelineTrainer`: its model engine replaced by the
    weights of `weights_file`) to the replica's own `CheckpointEngineWorker`, over the gloo checkpoint engine; the
    worker's server adapter hands them to vLLM-Omni's worker as verl does."""
    import ray
    from _gloo_ce_workers import PipelineTrainer
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.utils.config import omega_conf_to_dataclass
    from verl_omni.workers.checkpoint_engine import OmniCheckpointEngineManager

    from digenrl_verl.weights.gloo_checkpoint_engine import VersionedUpdates

    class Manager(VersionedUpdates, OmniCheckpointEngineManager):
        pass

    config = omega_conf_to_dataclass(rollout)
    pool = RayResourcePool([1], use_gpu=False, max_colocate_count=1, name_prefix="trainer_pool")
    trainers = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(
        cls=ray.remote(PipelineTrainer), rollout_config=config, weights_file=weights_file), name_prefix="trainer",
        device_name="cpu")
    await Manager(config.checkpoint_engine, trainers, [replica]).update_weights(global_steps=1)


def main(job_path: str, out_path: str) -> None:
    import ray
    import torch

    from digenrl_verl.integrations.verl_omni_replica import cuda_host
    from digenrl_verl.platform import process_env
    from digenrl_verl.platform.cpu import LOGICAL_GPUS_VAR

    here = str(Path(__file__).resolve().parent)  # the trainer worker's class (`_gloo_ce_workers`), by name
    sys.path.append(here)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    cuda = cuda_host()  # on GPUs (tests/gpu: the same test, one prepared command) Ray's real GPUs and verl's platform
    env = {**process_env(cpu=not cuda), **({} if cuda else {LOGICAL_GPUS_VAR: "1"}), "PYTHONPATH": path}
    os.environ.update(env)  # this process (verl resolves its platform at import) and, through Ray, every actor
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    ray.init(address="local", num_cpus=8, num_gpus=None if cuda else job.get("tp", 1), include_dashboard=False,
             runtime_env={"env_vars": env})
    torch.save(asyncio.run(_run(job)), out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
