"""verl-omni's own actor worker resumes a DigenRL checkpoint (a script, run by the verl-omni tier's real-step test).

`python _load_host_checkpoint.py <json args>`: args ``actor_rollout_ref`` (verl-omni's composed section, resolved),
``checkpoint`` (a DigenRL run's ``global_step_<k>``), ``out`` (the JSON report). In a fresh interpreter on verl's
CPU platform with a one-rank gloo group, verl-omni's stock `ActorRolloutRefWorker` (role ``actor``; its checkpoint
engine the in-process ``naive`` one, as the run's; its stock `PPODiffusersFSDPEngine` registered for the cpu device
first, since verl-omni registers it for cuda and npu only) builds its engine from the section and loads
``<checkpoint>/actor`` with its own ``load_checkpoint``. Its trainable weights are compared with the checkpoint's
``model.safetensors`` (the weights DigenRL's generators hold at that step): the report has the largest difference
(after casting to the file's dtype), how many tensors matched, and the largest |weight| of the LoRA ``B`` factors
(zero at initialisation: a loaded, trained adapter has them nonzero).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import finish_rank, init_gloo, run_main  # noqa: E402


def worker(rank: int, world: int, port: int, args: dict) -> None:
    init_gloo(rank, world, port)
    from omegaconf import OmegaConf
    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor
    from verl.workers.engine.base import EngineRegistry
    from verl_omni.workers.engine.fsdp.diffusers_impl import PPODiffusersFSDPEngine
    from verl_omni.workers.engine_workers import ActorRolloutRefWorker

    from digenrl_verl.integrations.verl_omni_trainer import canonical_name

    # verl-omni registers its stock engine for cuda and npu only: here it is the cpu one (the class unchanged)
    EngineRegistry.register(model_type="diffusion_model", backend=["fsdp", "fsdp2"], device="cpu")(
        PPODiffusersFSDPEngine)
    config = OmegaConf.create(args["actor_rollout_ref"])
    config.rollout.checkpoint_engine.backend = "naive"
    host = ActorRolloutRefWorker(config=config, role="actor")
    host.init_model()
    host.load_checkpoint(str(Path(args["checkpoint"]) / "actor"))
    theirs = {canonical_name(n): (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
              for n, p in host.actor.engine.module.named_parameters() if p.requires_grad}
    ours = {canonical_name(n): t for n, t in load_file(str(Path(args["checkpoint"]) / "model.safetensors")).items()}
    shared = sorted(ours.keys() & theirs.keys())
    diff = max(float((theirs[k].to(ours[k].dtype).float() - ours[k].float()).abs().max()) for k in shared)
    lora_b = max((float(ours[k].abs().max()) for k in shared if "lora_B" in k), default=float("nan"))
    finish_rank(rank, args, {"max_diff": diff, "matched": len(shared), "ours": len(ours), "theirs": len(theirs),
                             "lora_b_max": lora_b, "dtype": str(next(iter(ours.values())).dtype)})


if __name__ == "__main__":
    run_main(worker, [json.dumps({**json.loads(sys.argv[1]), "world": 1})])
