"""GPU checks on tiny models (one CUDA GPU; the NCCL check needs two). Skipped without CUDA.

Run on a GPU machine: `bash tests/gpu/run_gpu_checks.sh`. Written without a GPU: none of these has run yet
(see docs/verl_omni.md). What they check:

* the SDE step math on CUDA equals the CPU math (every step kind);
* per architecture, a rollout on CUDA in fp32 and bf16, the trainer's recomputed log-probs against the rollout's
  (on-policy ratio), and a TSP backward with finite gradients;
* NCCL weight sync between two processes on two GPUs with the plugin's `Collectives` (trainer → generator);
* one real disaggregated step through the entry point with GPU pools (`use_gpu=true`, `trainer.device=cuda`;
  every worker loads its adapter on its GPU, `PolicySpec.device`);
* on one GPU: one disaggregated step with both pools at 0.5 GPU on the same device (`PoolSpec.gpu_fraction`)
  and the cross-pool group on gloo (NCCL refuses two ranks on one device), checksums equal after the sync;
* with three GPUs or more: an FSDP2 trainer pool of two ranks over NCCL against `ddp` (same grad norm);

verl-omni's rollout on GPUs (`rollout.name=vllm_omni`: its replicas, engine `verl_omni_replica`) is checked by
`bash tests/gpu/run_replica_check.sh` in the verl-omni venv (the verl-omni tier's replica test on CUDA, `nccl`).

`bash tests/gpu/run_gpu_checks.sh` runs these as bounded checks (tests/gpu/gpu_checks.py); the figures a test
records with `record_property` appear on its summary line.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from digenrl_verl.models import build_tiny_model_dir, get_model_spec, tiny_architectures

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# max |exp(lp_recomputed - lp_rollout) - 1| allowed: the same kernels recompute the same batch in fp32; bf16 rounds
RATIO_TOL = {torch.float32: 1e-3, torch.bfloat16: 0.1}


@pytest.fixture(scope="module")
def gpu_tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_models")
    return {a: str(build_tiny_model_dir(a, root / a, seed=0)) for a in tiny_architectures()}


@pytest.mark.parametrize("kind", ["sde", "cps", "dance", "ode"])
def test_sde_step_on_cuda_matches_cpu(kind, record_property):
    from digenrl_verl.diffusion.sde import sde_step

    g = torch.Generator().manual_seed(0)
    x, v, z = (torch.randn(4, 4, 8, 8, generator=g) for _ in range(3))
    sigma, sigma_next = torch.tensor([1.0, 0.8, 0.5, 0.3]), torch.tensor([0.8, 0.6, 0.4, 0.1])
    cpu = sde_step(kind, v, x, sigma, sigma_next, 0.7, noise=z)
    gpu = sde_step(kind, v.cuda(), x.cuda(), sigma.cuda(), sigma_next.cuda(), 0.7, noise=z.cuda())
    torch.testing.assert_close(gpu.prev_sample.cpu(), cpu.prev_sample, rtol=1e-5, atol=1e-5)
    record_property(f"{kind}_max_abs_diff", f"{float((gpu.prev_sample.cpu() - cpu.prev_sample).abs().max()):.1e}")
    if cpu.log_prob is not None:
        torch.testing.assert_close(gpu.log_prob.cpu(), cpu.log_prob, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", tiny_architectures())
def test_tiny_rollout_logprobs_and_tsp_backward_on_cuda(arch, dtype, gpu_tiny_dirs, record_property):
    from digenrl_verl.diffusion.loss import LossConfig
    from digenrl_verl.diffusion.noise import SampleKey
    from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
    from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients, compute_log_probs
    from digenrl_verl.models import load_adapter
    from digenrl_verl.models.config import LoraConfig

    adapter = load_adapter(gpu_tiny_dirs[arch], device="cuda", dtype=dtype, lora=LoraConfig(rank=4, alpha=8),
                           **get_model_spec(arch).tiny_sampling)
    cfg = RolloutConfig(num_inference_steps=6, sde_type="sde", noise_level=0.7, timestep_selection="window",
                        sde_window_size=2, sde_window_range=(0, 4), seed=1)
    prompts = ["a red cube", "a red cube", "a blue ball", "a blue ball"]
    keys = [SampleKey(0, p, i % 2) for i, p in enumerate(prompts)]
    cond = adapter.encode_prompts(prompts)
    traj = rollout(adapter, cond, keys, cfg)
    assert traj.latents.is_cuda and traj.log_probs.dtype == torch.float32
    assert torch.isfinite(traj.log_probs).all()
    recomputed = compute_log_probs(adapter, cond, traj, tsp_cfg=TSPConfig("batched"))
    ratio = (recomputed - traj.log_probs).exp()
    assert (ratio - 1).abs().max().item() < RATIO_TOL[dtype], f"{arch} {dtype}: on-policy ratio off by {ratio}"
    if arch == "FluxPipeline":
        record_property(f"flux_{str(dtype)[6:]}_max_ratio_err", f"{(ratio - 1).abs().max().item():.1e}")
    params = adapter.trainable_parameters()
    accumulate_gradients(adapter, cond, traj, torch.tensor([1.0, -1.0, 0.5, -0.5], device="cuda"), LossConfig(),
                         TSPConfig("batched"), loss_denominator=float(traj.batch_size * traj.num_steps))
    grads = [p.grad for p in params if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def _nccl_rank(rank: int, port: int, out: dict) -> None:
    from digenrl_verl.weights.sync import CollectiveSpec, Collectives

    torch.cuda.set_device(rank)
    spec = CollectiveSpec("127.0.0.1", port, num_trainers=1, num_generators=1, backend="nccl")
    col = Collectives(spec, "trainer" if rank == 0 else "generator", 0)
    g = torch.Generator().manual_seed(0)
    weights = {"a": torch.randn(64, 64, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16)}
    mine = {k: (v if rank == 0 else torch.zeros_like(v)).cuda() for k, v in weights.items()}
    if rank == 0:
        col.send_weights(mine, [0])
    else:
        col.receive_weights(mine)
        out["equal"] = all(torch.equal(mine[k].cpu(), weights[k]) for k in weights)
    col.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL weight sync needs two GPUs")
def test_nccl_weight_sync_between_two_gpus():
    import torch.multiprocessing as mp

    from digenrl_verl.weights.sync import free_port

    port = free_port()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_nccl_rank, args=(port, out), nprocs=2, join=True)
        assert out.get("equal") is True


@pytest.mark.slow
def test_one_disaggregated_step_with_gpu_pools(gpu_tiny_dirs, tmp_path):
    import ray

    from digenrl_verl.main import TINY_CPU, compose
    from digenrl_verl.trainer.config import build_run
    from digenrl_verl.trainer.ray_runtime import init_local_ray
    from digenrl_verl.trainer.runner import DigenRLTrainer

    gpus = torch.cuda.device_count()
    mode = ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.pools.generator.use_gpu=true",
            "trainer.digenrl.pools.trainer.use_gpu=true"] if gpus >= 2 else [
        "trainer.digenrl.mode=colocated", "trainer.digenrl.pools.colocated.workers_per_node=1",
        "trainer.digenrl.pools.colocated.use_gpu=true"]
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={gpu_tiny_dirs['FluxPipeline']}", "trainer.device=cuda",
                   "actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16", "data.train_batch_size=2",
                   "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=1", "trainer.logger=[console]",
                   f"trainer.digenrl.output_dir={tmp_path}", *mode])
    started = not ray.is_initialized()
    if started:
        init_local_ray(num_cpus=max(4, os.cpu_count() or 4))
    trainer = DigenRLTrainer(build_run(cfg))
    try:
        summary = trainer.fit()
        assert summary["steps"] == 1 and torch.isfinite(torch.tensor(summary["reward_first"]))
    finally:
        trainer.shutdown()
        if started:
            ray.shutdown()


# Both pools on the one GPU: each worker at 0.5 GPU (`trainer.digenrl.pools.<role>.gpu_fraction`); the runner then
# syncs weights over gloo, since NCCL refuses two ranks on one device.
SHARE_ONE_GPU = ("trainer.digenrl.pools.generator.gpu_fraction=0.5", "trainer.digenrl.pools.trainer.gpu_fraction=0.5")


def _gpu_run(gpu_tiny_dirs, tmp_path, *overrides):
    import ray

    from digenrl_verl.main import TINY_CPU, compose
    from digenrl_verl.trainer.config import build_run
    from digenrl_verl.trainer.ray_runtime import init_local_ray
    from digenrl_verl.trainer.runner import DigenRLTrainer

    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={gpu_tiny_dirs['FluxPipeline']}", "trainer.device=cuda",
                   "trainer.digenrl.mode=disaggregated", "trainer.digenrl.pools.generator.use_gpu=true",
                   "trainer.digenrl.pools.trainer.use_gpu=true", "data.train_batch_size=2",
                   "trainer.total_training_steps=1", "trainer.logger=[console]",
                   f"trainer.digenrl.output_dir={tmp_path}", *overrides])
    if not ray.is_initialized():
        init_local_ray(num_cpus=max(4, os.cpu_count() or 4))
    trainer = DigenRLTrainer(build_run(cfg))
    try:
        summary = trainer.fit()
        stats = ray.get([w.checksum.remote() for w in trainer.workers.values()])
    finally:
        trainer.shutdown()
    assert summary["steps"] == 1 and len({s["checksum"] for s in stats}) == 1  # whole weights reached the generator
    trainer.checksums = [s["checksum"] for s in stats]
    return trainer


@pytest.mark.slow
def test_one_disaggregated_step_on_one_gpu(gpu_tiny_dirs, tmp_path, record_property):
    """Generator and trainer pools on the same GPU (0.5 each), gloo sync, checksums equal after the step."""
    import ray

    t0 = time.perf_counter()
    try:
        trainer = _gpu_run(gpu_tiny_dirs, tmp_path, "actor_rollout_ref.rollout.n=2", *SHARE_ONE_GPU)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    record_property("step_s", f"{time.perf_counter() - t0:.1f}")
    record_property("checksum", trainer.checksums[0][:12])
    record_property("workers", len(trainer.checksums))


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="FSDP2 over NCCL: 1 generator + 2 trainer GPUs")
def test_fsdp2_trainer_over_nccl_matches_ddp(gpu_tiny_dirs, tmp_path):
    common = ["actor_rollout_ref.rollout.n=2", "trainer.digenrl.pools.trainer.workers_per_node=2"]
    norms = [_gpu_run(gpu_tiny_dirs, tmp_path / s, *common, f"actor_rollout_ref.actor.strategy={s}")
             .reporter.history[0]["actor/grad_norm"] for s in ("ddp", "fsdp2")]
    assert norms[0] > 0 and abs(norms[1] - norms[0]) <= 1e-4 * norms[0], norms
