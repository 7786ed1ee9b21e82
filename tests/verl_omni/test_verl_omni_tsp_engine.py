"""The TSP engine (`digenrl_verl.integrations.verl_omni_tsp`) against verl-omni's stock `PPODiffusersFSDPEngine`.

Both engines are built the way verl-omni's TrainingWorker builds one (its Hydra model / actor configs, fsdp2, fp32,
the CPU platform, a gloo group started first), from the same tiny Qwen-Image directory with the same weights
(LoRA adapters set to the same random values, so both LoRA factors get gradients), and run
`forward_backward_batch` on the same batch: T=5 timesteps, micro-batches of B=2 samples, chunk_size=6 rows, so
k=3 timesteps per forward (uneven chunks: 3 + 2). Checked: every gradient (max |g_tsp - g_stock| / max |g_stock|
per tensor) <= 1e-5, the per-step log-probs, losses and metrics. Each case runs in a fresh interpreter (this file
as a script: the platform must be chosen before verl is imported); world size 2 runs two gloo ranks.

Mutation: `--mutation` makes the TSP engine call the loss ONCE over the stacked k*B rows (scaled by k); the
`grpo_guard` case must then fail the gradient check (its std_dev_t / sqrt_dt means pool over the rows).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

if __name__ != "__main__":
    pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")

ROOT = Path(__file__).resolve().parents[2]
NUM_STEPS, MICRO, CHUNK_ROWS, HEIGHT = 5, 2, 6, 64
TOLERANCE = 1e-5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- the worker (a fresh interpreter per case)

def _configs(model_dir: str, lora: bool, loss_mode: str, world: int):
    import verl_omni
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    config_root = Path(verl_omni.__file__).parent / "trainer" / "config" / "diffusion"
    model_overrides = [f"path={model_dir}", f"tokenizer_path={model_dir}/tokenizer", f"lora_rank={8 if lora else 0}",
                       "lora_alpha=16", f"pipeline.height={HEIGHT}", f"pipeline.width={HEIGHT}",
                       f"pipeline.num_inference_steps={NUM_STEPS}", "pipeline.true_cfg_scale=1.0",
                       "algo.noise_level=1.2", "algo.sde_type=sde", "attn_backend=native",
                       "enable_gradient_checkpointing=False"]
    with initialize_config_dir(config_dir=str(config_root / "model"), version_base=None):
        model_config = omega_conf_to_dataclass(compose(config_name="diffusion_model", overrides=model_overrides))
    actor_overrides = ["strategy=fsdp2", f"diffusion_loss.loss_mode={loss_mode}", "diffusion_loss.clip_ratio=0.2",
                       "diffusion_loss.adv_clip_max=5.0", f"ppo_mini_batch_size={MICRO * 2}",
                       f"ppo_micro_batch_size_per_gpu={MICRO}", "optim.lr=1e-4", "fsdp_config.model_dtype=fp32",
                       "fsdp_config.dtype=float32", "+fsdp_config.mixed_precision.param_dtype=fp32",
                       f"fsdp_config.fsdp_size={world}"]
    with initialize_config_dir(config_dir=str(config_root / "actor"), version_base=None):
        actor_config = omega_conf_to_dataclass(compose(config_name="dp_diffusion_actor", overrides=actor_overrides))
    return model_config, actor_config


def _batch(model_config, rows: int, seed: int):
    """A rollout batch in verl-omni's layout (as its own engine test builds one), for this rank's `rows`."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl_omni.pipelines.utils import build_scheduler
    from verl_omni.workers.utils.padding import embeds_padding_2_no_padding

    tconf = json.loads((Path(model_config.local_path) / "transformer" / "config.json").read_text())
    tokens, dim, text = (HEIGHT // 16) ** 2, tconf["in_channels"], tconf["joint_attention_dim"]
    g = torch.Generator().manual_seed(seed)
    timesteps = build_scheduler(model_config).timesteps[:NUM_STEPS].float()[None].repeat(rows, 1)
    latents = torch.randn(rows, NUM_STEPS + 1, tokens, dim, generator=g)
    td = TensorDict({
        "old_log_probs": torch.randn(rows, NUM_STEPS, generator=g) * 0.1,
        "advantages": torch.randn(rows, NUM_STEPS, generator=g),
        "all_latents": latents, "all_timesteps": timesteps,
        "old_prev_sample_mean": latents[:, 1:] + 0.01 * torch.randn(rows, NUM_STEPS, tokens, dim, generator=g),
        "prompt_embeds": torch.randn(rows, 7, text, generator=g),
        "prompt_embeds_mask": torch.ones(rows, 7, dtype=torch.int32),
        "negative_prompt_embeds": torch.randn(rows, 7, text, generator=g),
        "negative_prompt_embeds_mask": torch.ones(rows, 7, dtype=torch.int32),
    }, batch_size=rows)
    td = embeds_padding_2_no_padding(td)
    tu.assign_non_tensor(td, micro_batch_size_per_gpu=MICRO, height=HEIGHT, width=HEIGHT, vae_scale_factor=8)
    return td


def _near_policy(engine, td, seed: int) -> None:
    """Old log-probs / SDE means = the current policy's plus a little noise: ratios near 1, few rows clipped, so
    (nearly) every row and step carries gradient."""
    import torch

    with torch.no_grad(), engine.eval_mode():
        out = engine.forward_backward_batch(td.clone(), None, forward_only=True)["model_output"]
    g = torch.Generator().manual_seed(seed)
    td["old_log_probs"] = out["log_probs"] + 0.05 * torch.randn(out["log_probs"].shape, generator=g)
    mean = out["prev_sample_mean"]
    td["old_prev_sample_mean"] = mean + 0.01 * torch.randn(mean.shape, generator=g)


def _same_weights(engines, lora: bool) -> None:
    """Copy the stock engine's weights into the others; LoRA: both factors set to the same seeded values."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    g = torch.Generator().manual_seed(123)
    named = [dict(e.module.named_parameters()) for e in engines]
    for name, ref in named[0].items():
        full = (ref.full_tensor() if isinstance(ref, DTensor) else ref).detach().clone()
        if lora and "lora_" in name:
            full = torch.randn(full.shape, generator=g, dtype=full.dtype) * 0.05
        for params in named:
            p = params[name]
            value = distribute_tensor(full, p.device_mesh, p.placements) if isinstance(p, DTensor) else full
            with torch.no_grad():
                p.copy_(value)


def _run(engine, td, loss_fn):
    import time as _time

    import torch
    from torch.distributed.tensor import DTensor

    engine.optimizer_zero_grad()
    start = _time.perf_counter()
    with engine.train_mode():  # its exit zeroes the gradients: read them inside
        out = engine.forward_backward_batch(td.clone(), loss_fn, forward_only=False)
        seconds = _time.perf_counter() - start
        grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
                 for n, p in engine.module.named_parameters() if p.requires_grad and p.grad is not None}
    with torch.no_grad(), engine.eval_mode():
        infer = engine.forward_backward_batch(td.clone(), None, forward_only=True)
    return out, grads, seconds, infer["model_output"]["log_probs"]


def _metric_values(metrics: dict) -> dict:
    """{name: [per-step values]} of verl's aggregated `Metric`s (or plain lists)."""
    def floats(v):
        v = getattr(v, "values", v)
        return [float(x) for x in (v if isinstance(v, list) else [v])]

    return {k: floats(v) for k, v in metrics.items()}


def _compare(stock, tsp) -> dict:
    out0, grads0, sec0, infer0 = stock
    out1, grads1, sec1, infer1 = tsp
    assert grads0.keys() == grads1.keys() and grads0, (sorted(grads0)[:3], sorted(grads1)[:3])
    errors = [float((grads1[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for n, g in grads0.items()]
    lp0, lp1 = out0["model_output"]["log_probs"], out1["model_output"]["log_probs"]
    return {"grad_err": max(errors), "tensors": len(errors), "log_probs_shape": list(lp1.shape),
            "log_probs_err": float((lp1 - lp0).abs().max() / lp0.abs().max()),
            "infer_err": float((infer1 - infer0).abs().max() / infer0.abs().max()),
            "losses": [out0["loss"], out1["loss"]], "metric_keys": [sorted(out0["metrics"]), sorted(out1["metrics"])],
            "metrics": [_metric_values(out0["metrics"]), _metric_values(out1["metrics"])],
            "seconds": [sec0, sec1]}


def _mutated(base):
    """The TSP engine with ONE loss call over the stacked k*B rows, scaled by k (the trap; must fail grpo_guard)."""

    class OneLossCall(base):
        def _per_step_losses(self, loss_function, model_output, data, dp_group, num_steps):
            loss, metrics = loss_function(model_output=model_output, data=data, dp_group=dp_group)
            return loss * num_steps, [(loss.detach().item(), metrics)] * num_steps

    return OneLossCall


def _device_cpu_platform() -> None:
    """The package's CPU platform answers verl's `get_device_id()` with 0, and FSDP2's full-state load then calls
    ``module.to(0)``: "Cannot access accelerator device". Until it answers ``torch.device("cpu")``, this process
    uses a subclass that does (nothing else changed)."""
    import torch
    from verl.plugin.platform import set_platform
    from verl.utils.device import get_device_id

    from digenrl_verl.platform.cpu import PlatformCPU

    if isinstance(get_device_id(), torch.device):
        return

    class DevicePlatformCPU(PlatformCPU):
        def current_device(self):
            return torch.device("cpu")

    set_platform(DevicePlatformCPU())


def worker(rank: int, world: int, port: int, args: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    _device_cpu_platform()
    from functools import partial

    from verl_omni.workers.engine.fsdp.diffusers_impl import PPODiffusersFSDPEngine
    from verl_omni.workers.utils.losses import diffusion_loss

    from digenrl_verl.integrations.verl_omni_tsp import TSPDiffusersFSDPEngine

    model_config, actor_config = _configs(args["model_dir"], args["lora"], args["loss"], world)
    tsp_cls = _mutated(TSPDiffusersFSDPEngine) if args["mutation"] else TSPDiffusersFSDPEngine
    engines = []
    for cls, extra in ((PPODiffusersFSDPEngine, {}), (tsp_cls, {"tsp_chunk_size": CHUNK_ROWS})):
        engine = cls(model_config=model_config, engine_config=actor_config.engine,
                     optimizer_config=actor_config.optim, checkpoint_config=actor_config.checkpoint, **extra)
        engine.initialize()
        engines.append(engine)
    _same_weights(engines, args["lora"])
    td = _batch(model_config, MICRO * args["micro_batches"], seed=7 + rank)
    _near_policy(engines[0], td, seed=11 + rank)
    loss_fn = partial(diffusion_loss, config=actor_config)
    results = [_run(e, td, loss_fn) for e in engines]
    report = _compare(*results)
    if args["repeats"] > 1:  # timing: the median of several runs, engines alternating
        import statistics

        times = [[r[2]] for r in results]
        for _ in range(args["repeats"] - 1):
            for engine, samples in zip(engines, times):
                samples.append(_run(engine, td, loss_fn)[2])
        report["median_seconds"] = [statistics.median(t) for t in times]
    if rank == 0:
        Path(args["out"]).write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


def main(argv: list[str]) -> None:
    args = json.loads(argv[0])
    world, port = args["world"], _free_port()
    if world == 1:
        worker(0, 1, port, args)
        return
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(world, port, args), nprocs=world, join=True)


if __name__ == "__main__":
    main(sys.argv[1:])


# ---------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> str:
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return str(build_tiny_model_dir("QwenImagePipeline", tmp_path_factory.mktemp("tsp_engine") / "qwen", seed=0))


def run_case(model_dir: str, tmp_path: Path, *, lora: bool, loss: str, world: int = 1, mutation: bool = False,
             micro_batches: int = 2, repeats: int = 1) -> dict:
    out = tmp_path / f"report-{lora}-{loss}-{world}-{mutation}.json"
    args = dict(model_dir=model_dir, lora=lora, loss=loss, world=world, mutation=mutation, out=str(out),
                micro_batches=micro_batches, repeats=repeats)
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "digenrl_verl.platform.cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    start = time.time()
    proc = subprocess.run([sys.executable, __file__, json.dumps(args)], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads(out.read_text())
    print(f"\nTSP engine lora={lora} loss={loss} world={world} mutation={mutation}: {report} "
          f"({time.time() - start:.1f} s)")
    return report


def _check(report: dict) -> None:
    assert report["grad_err"] <= TOLERANCE, report
    assert report["log_probs_shape"][1] == NUM_STEPS and report["log_probs_err"] <= TOLERANCE, report
    assert report["infer_err"] <= TOLERANCE, report
    stock_losses, tsp_losses = (sum(losses, []) for losses in report["losses"])  # per micro-batch and step
    assert len(tsp_losses) == len(stock_losses) and tsp_losses == pytest.approx(stock_losses, rel=1e-4, abs=1e-7)
    assert report["metric_keys"][0] == report["metric_keys"][1], report
    stock, tsp = report["metrics"]
    for name, values in stock.items():  # verl-omni's per-timestep metrics: one value per step, the same values
        assert len(tsp[name]) == len(values) and tsp[name] == pytest.approx(values, rel=1e-4, abs=1e-6), name


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("loss", ["flow_grpo", "grpo_guard"])
def test_tsp_engine_gradient_equals_stock_loop(qwen_dir, tmp_path, lora, loss):
    _check(run_case(qwen_dir, tmp_path, lora=lora, loss=loss))


@pytest.mark.slow
def test_tsp_engine_world_size_2(qwen_dir, tmp_path):
    _check(run_case(qwen_dir, tmp_path, lora=True, loss="grpo_guard", world=2, micro_batches=1))


@pytest.mark.slow
def test_one_loss_call_over_stacked_rows_fails_grpo_guard(qwen_dir, tmp_path):
    report = run_case(qwen_dir, tmp_path, lora=False, loss="grpo_guard", mutation=True)
    assert report["grad_err"] > 1e-2, report


REGISTRY_CHECK = """
import os
import digenrl_verl.integrations.verl_omni_tsp as tsp
from verl.workers.engine.base import EngineRegistry
assert tsp.register_tsp_engine() == []  # registered once, at import
for device in ("cuda", "npu", "cpu"):
    os.environ["VERL_ENGINE_DEVICE"] = device
    for backend in ("fsdp", "fsdp2"):
        os.environ["VERL_ENGINE_VENDOR"] = "digenrl_tsp"
        assert EngineRegistry.get_engine_cls("diffusion_model", backend) is tsp.TSPDiffusersFSDPEngine
        assert EngineRegistry.get_engine_cls("diffusion_nft_model", backend) is tsp.LoopNFTDiffusersFSDPEngine
        os.environ.pop("VERL_ENGINE_VENDOR")
        if device != "cpu":  # without the vendor: verl-omni's stock engine
            assert EngineRegistry.get_engine_cls("diffusion_model", backend) is tsp.PPODiffusersFSDPEngine
print("registry ok")
"""


@pytest.mark.slow
def test_registered_for_cuda_npu_cpu_under_the_vendor():
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "digenrl_verl.platform.cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", REGISTRY_CHECK], env=env, cwd=str(ROOT), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "registry ok" in proc.stdout, proc.stderr[-4000:]
