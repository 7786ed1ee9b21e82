"""verl-omni's own actor worker resumes a DigenRL checkpoint (a script, run by the verl-omni tier's real-step test).

`python _load_host_checkpoint.py <json args>`: args ``actor_rollout_ref`` (verl-omni's composed section, resolved),
``checkpoint`` (a DigenRL run's ``global_step_<k>``), ``out`` (the JSON report). In a fresh interpreter on verl's
CPU platform with a one-rank gloo group, verl-omni's stock `ActorRolloutRefWorker` (role ``actor``; its checkpoint
engine the in-process ``naive`` one, as the run's; its stock `PPODiffusersFSDPEngine`, which verl-omni registers for
cuda and npu only, registered for the cpu device by the plugin's verl hook) builds its engine from the section and loads
``<checkpoint>/actor`` with its own ``load_checkpoint``. Its trainable weights are compared with the checkpoint's
``model.safetensors`` (the weights DigenRL's generators hold at that step): the report has the largest difference
(after casting to the file's dtype), how many tensors matched, how far the file's weights are from the ones the
worker built before loading (nonzero: the load is not vacuous), and the largest |weight| of the LoRA ``B`` factors.

With ``mode: save`` (args ``root``, ``step``, ``weights_out``) it writes a checkpoint as verl-omni's trainer does
instead (`_save`), for the reverse check: a DigenRL run resumes it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import finish_rank, init_gloo, run_main  # noqa: E402


def _stock_actor(actor_rollout_ref: dict):
    """verl-omni's stock actor worker (role actor) built by its own init_model from the composed section."""
    from omegaconf import OmegaConf
    from verl.workers.engine.base import EngineRegistry
    from verl_omni.workers.engine.fsdp.diffusers_impl import PPODiffusersFSDPEngine
    from verl_omni.workers.engine_workers import ActorRolloutRefWorker

    # verl-omni registers its stock engine for cuda and npu only; the plugin registers it for cpu too, unchanged
    # (integrations.verl_omni_cpu_engines, on verl's plugin hook)
    assert EngineRegistry._engines["diffusion_model"]["fsdp2"]["cpu"] is PPODiffusersFSDPEngine
    config = OmegaConf.create(actor_rollout_ref)
    config.rollout.checkpoint_engine.backend = "naive"
    host = ActorRolloutRefWorker(config=config, role="actor")
    host.init_model()
    return host


def _trainable(host) -> dict:
    from torch.distributed.tensor import DTensor

    from digenrl_verl.integrations.verl_omni_trainer import canonical_name

    return {canonical_name(n): (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().clone()
            for n, p in host.actor.engine.module.named_parameters() if p.requires_grad}


def _load(host, args: dict) -> dict:
    from safetensors.torch import load_file

    from digenrl_verl.integrations.verl_omni_trainer import canonical_name

    built = _trainable(host)  # as verl-omni's init_model builds them (the pretrained model, a fresh adapter)
    host.load_checkpoint(str(Path(args["checkpoint"]) / "actor"))
    theirs = _trainable(host)
    ours = {canonical_name(n): t for n, t in load_file(str(Path(args["checkpoint"]) / "model.safetensors")).items()}
    shared = sorted(ours.keys() & theirs.keys())
    diff = max(float((theirs[k].to(ours[k].dtype).float() - ours[k].float()).abs().max()) for k in shared)
    lora_b = max((float(ours[k].abs().max()) for k in shared if "lora_B" in k), default=float("nan"))
    moved = max(float((ours[k].float() - built[k].float()).abs().max()) for k in shared)
    return {"max_diff": diff, "moved_from_built": moved, "matched": len(shared), "ours": len(ours),
            "theirs": len(theirs),
            "lora_b_max": lora_b, "dtype": str(next(iter(ours.values())).dtype)}


def _save(host, args: dict) -> dict:
    """As verl-omni's trainer saves step k: the actor's checkpoint in global_step_<k>/actor, then verl's pointer;
    the LoRA factors first set to seeded random values (a trained-looking adapter); the weights also written to
    args["weights_out"] (canonical names) for the caller's comparison."""
    import torch
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor, distribute_tensor

    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in host.actor.engine.module.named_parameters():
            if p.requires_grad and "lora_" in name:
                full = torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * 0.05
                p.copy_(distribute_tensor(full, p.device_mesh, p.placements) if isinstance(p, DTensor) else full)
    root, step = Path(args["root"]), int(args["step"])
    host.save_checkpoint(str(root / f"global_step_{step}" / "actor"), global_step=step)
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    weights = _trainable(host)
    save_file({k: v.float().contiguous() for k, v in weights.items()}, args["weights_out"])
    return {"saved": len(weights), "step": step}


def worker(rank: int, world: int, port: int, args: dict) -> None:
    init_gloo(rank, world, port)
    host = _stock_actor(args["actor_rollout_ref"])
    report = _save(host, args) if args.get("mode") == "save" else _load(host, args)
    finish_rank(rank, args, report)


if __name__ == "__main__":
    run_main(worker, [json.dumps({**json.loads(sys.argv[1]), "world": 1})])
