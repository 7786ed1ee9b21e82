"""The package's trajectories in verl-omni's batch layout (`digenrl_verl.integrations.verl_omni_batch`) mean to
verl-omni's engine what they meant to the generator that sampled them.

The package's diffusers sampler draws trajectories on the tiny Qwen-Image (64 px, 3 SDE steps, noise 1.2, fp32,
every step trained); the batch is converted with `to_verl_omni_batch` and verl-omni's stock
`PPODiffusersFSDPEngine` (built from verl-omni's Hydra configs on the same model directory, the same pipeline
settings) recomputes the log-probs of the recorded steps in eval mode, as its trainer's old-log-prob pass does.
They must equal the sampler's own (max |diff| / max |ours| <= 1e-5): the latents, the timesteps looked up in the
engine's scheduler, and the prompt embeddings and masks all line up. Mutations (each must fail): the timesteps
shifted by one step (``shift``), the latents one step late (``late``).

Also: a permutation of steps (DanceGRPO with timestep_fraction < 1) and a schedule that differs from the engine's
are refused naming the key. Runs in a fresh interpreter (this file as a script: the platform before verl).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if __name__ != "__main__":
    pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")
if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import finish_rank, hydra_configs, init_gloo, run_main, run_script, tiny_qwen_dir  # noqa: E402

NUM_STEPS, HEIGHT, ROWS, NOISE = 3, 64, 4, 1.2
TOLERANCE = 1e-5


def _ours(model_dir: str):
    """The package's sampler: trajectories and the prompt conditioning of ROWS samples (2 prompts x 2)."""
    import torch

    from digenrl_verl.diffusion.noise import SampleKey
    from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
    from digenrl_verl.models.config import PipelineConfig
    from digenrl_verl.models.registry import load_adapter

    pipeline = PipelineConfig(height=HEIGHT, width=HEIGHT, num_inference_steps=NUM_STEPS, true_cfg_scale=1.0)
    adapter = load_adapter(model_dir, pipeline=pipeline, dtype=torch.float32)
    cfg = RolloutConfig(num_inference_steps=NUM_STEPS, sde_type="sde", noise_level=NOISE, timestep_fraction=1.0,
                        seed=3)
    prompts = ["a red square", "a red square", "a sign that reads RL", "a sign that reads RL"]
    cond = adapter.encode_prompts(prompts)
    keys = [SampleKey(0, f"u{i // 2}", i % 2) for i in range(ROWS)]
    with torch.no_grad():
        traj = rollout(adapter, cond, keys, cfg)
    return traj, cond


def _engine(model_dir: str):
    from verl_omni.workers.engine.fsdp.diffusers_impl import PPODiffusersFSDPEngine

    model_config, actor_config = hydra_configs(model_dir, lora=False, loss_mode="flow_grpo", num_steps=NUM_STEPS,
                                               height=HEIGHT, micro=ROWS, world=1, optim=[])
    engine = PPODiffusersFSDPEngine(model_config=model_config, engine_config=actor_config.engine,
                                    optimizer_config=actor_config.optim, checkpoint_config=actor_config.checkpoint)
    engine.initialize()
    return engine


def _refusals(traj, cond, engine) -> dict:
    """The messages of the two refusals (a permutation of steps; a schedule with another shift)."""
    import torch

    from digenrl_verl.integrations.verl_omni_batch import to_verl_omni_batch

    out = {}
    tensors = _tensors(traj)
    permuted = dict(tensors, step_index=tensors["step_index"].flip(1))
    other = dict(tensors, sigmas=tensors["sigmas"] * 0.9)
    for name, bad in (("permutation", permuted), ("schedule", other)):
        try:
            to_verl_omni_batch(bad, cond.tensors, torch.zeros(ROWS), engine.scheduler)
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    return out


def _tensors(traj) -> dict:
    return {"latents": traj.latents, "next_latents": traj.next_latents, "sigmas": traj.sigmas,
            "step_index": traj.step_index, "rollout_log_probs": traj.log_probs}


def worker(rank: int, world: int, port: int, args: dict) -> None:
    init_gloo(rank, world, port)
    import torch

    from digenrl_verl.integrations.verl_omni_batch import to_verl_omni_batch, with_engine_meta

    traj, cond = _ours(args["model_dir"])
    engine = _engine(args["model_dir"])
    batch = to_verl_omni_batch(_tensors(traj), cond.tensors, torch.zeros(ROWS), engine.scheduler)
    if args["mutation"] == "shift":  # each step's timestep is the next step's
        batch["all_timesteps"] = torch.roll(batch["all_timesteps"], -1, dims=1)
    if args["mutation"] == "late":  # x' read where x is
        batch["all_latents"] = torch.roll(batch["all_latents"], 1, dims=1)
    with_engine_meta(batch, micro_batch_size=ROWS, height=HEIGHT, width=HEIGHT)
    with torch.no_grad(), engine.eval_mode():
        out = engine.forward_backward_batch(batch, None, forward_only=True)["model_output"]
    theirs, ours = out["log_probs"].float(), traj.log_probs.float()
    finish_rank(rank, args, {"err": float((theirs - ours).abs().max() / ours.abs().max()),
                             "shape": list(theirs.shape), "keys": sorted(batch.keys()),
                             "refusals": _refusals(traj, cond, engine)})


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return tiny_qwen_dir(tmp_path_factory, "layout")


def _run(qwen_dir, tmp_path, mutation: str) -> dict:
    args = {"world": 1, "model_dir": qwen_dir, "mutation": mutation, "out": str(tmp_path / "report.json")}
    return run_script(__file__, args, f"layout {mutation or 'as shipped'}")


def test_verl_omnis_engine_recomputes_the_samplers_log_probs(qwen_dir, tmp_path):
    report = _run(qwen_dir, tmp_path, "")
    assert report["shape"] == [ROWS, NUM_STEPS]
    assert {"all_latents", "all_timesteps", "old_log_probs", "advantages", "prompt_embeds",
            "prompt_embeds_mask"} <= set(report["keys"])
    assert report["err"] <= TOLERANCE, report
    refusals = report["refusals"]
    assert refusals["permutation"] and "algorithm.timestep_fraction" in refusals["permutation"]
    assert refusals["schedule"] and "actor_rollout_ref.model.pipeline" in refusals["schedule"]


@pytest.mark.parametrize("mutation", ["shift", "late"])
def test_a_misaligned_layout_is_caught(qwen_dir, tmp_path, mutation):
    assert _run(qwen_dir, tmp_path, mutation)["err"] > 100 * TOLERANCE


if __name__ == "__main__":
    run_main(worker, sys.argv[1:])


def test_a_share_is_cut_evenly_and_names_match_across_the_two_copies():
    """`micro_batch_size`: verl's prepare_micro_batches needs an even cut of a GAP share (largest divisor up to the
    configured size); `canonical_name`: the package's peft names and verl-omni's FSDP / export names meet."""
    from digenrl_verl.integrations.verl_omni_trainer import canonical_name, micro_batch_size

    assert [micro_batch_size(r, 2) for r in (1, 2, 3, 4)] == [1, 2, 1, 2]
    assert micro_batch_size(6, 4) == 3 and micro_batch_size(5, 16) == 5
    ours = "base_model.model.transformer_blocks.0.attn.to_q.lora_A.default.weight"
    theirs = "_fsdp_wrapped_module.transformer_blocks.0.attn.to_q.lora_A.default.weight"
    exported = "transformer.transformer_blocks.0.attn.to_q.lora_A.weight"
    assert canonical_name(ours) == canonical_name(theirs) == canonical_name(exported) \
        == "transformer_blocks.0.attn.to_q.lora_A.weight"
