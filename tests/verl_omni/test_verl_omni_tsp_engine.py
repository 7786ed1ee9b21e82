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

import subprocess
import sys
from pathlib import Path

import pytest

if __name__ != "__main__":
    pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")
if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import (  # noqa: E402
    ROOT, cpu_env, finish_rank, full_tensor, hydra_configs, init_gloo, near_policy, rel, rollout_batch, run_main,
    run_script, same_weights, tiny_qwen_dir, with_meta)

NUM_STEPS, MICRO, CHUNK_ROWS, HEIGHT = 5, 2, 6, 64
TOLERANCE = 1e-5


# ---------------------------------------------------------------- the worker (a fresh interpreter per case)

def _configs(model_dir: str, lora: bool, loss_mode: str, world: int):
    return hydra_configs(model_dir, lora=lora, loss_mode=loss_mode, num_steps=NUM_STEPS, height=HEIGHT, micro=MICRO,
                         world=world, optim=["optim.lr=1e-4"])


def _batch(model_config, rows: int, seed: int):
    """A rollout batch in verl-omni's layout, for this rank's `rows`, with its meta."""
    td = rollout_batch(model_config, rows, seed, num_steps=NUM_STEPS, height=HEIGHT, random_old=True)
    return with_meta(td, micro=MICRO, height=HEIGHT)


def _run(engine, td, loss_fn):
    import time as _time

    import torch

    engine.optimizer_zero_grad()
    start = _time.perf_counter()
    with engine.train_mode():  # its exit zeroes the gradients: read them inside
        out = engine.forward_backward_batch(td.clone(), loss_fn, forward_only=False)
        seconds = _time.perf_counter() - start
        grads = {n: full_tensor(p.grad).clone()
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
    lp0, lp1 = out0["model_output"]["log_probs"], out1["model_output"]["log_probs"]
    return {"grad_err": rel(grads1, grads0), "tensors": len(grads0), "log_probs_shape": list(lp1.shape),
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
    init_gloo(rank, world, port)
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
    same_weights(engines, args["lora"])
    td = _batch(model_config, MICRO * args["micro_batches"], seed=7 + rank)
    near_policy(engines[0], td, td.clone(), seed=11 + rank)
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
    finish_rank(rank, args, report)


if __name__ == "__main__":
    run_main(worker, sys.argv[1:])


# ---------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> str:
    return tiny_qwen_dir(tmp_path_factory, "tsp_engine")


def run_case(model_dir: str, tmp_path: Path, *, lora: bool, loss: str, world: int = 1, mutation: bool = False,
             micro_batches: int = 2, repeats: int = 1) -> dict:
    out = tmp_path / f"report-{lora}-{loss}-{world}-{mutation}.json"
    args = dict(model_dir=model_dir, lora=lora, loss=loss, world=world, mutation=mutation, out=str(out),
                micro_batches=micro_batches, repeats=repeats)
    return run_script(__file__, args, f"TSP engine lora={lora} loss={loss} world={world} mutation={mutation}")


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
    proc = subprocess.run([sys.executable, "-c", REGISTRY_CHECK], env=cpu_env(), cwd=str(ROOT), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "registry ok" in proc.stdout, proc.stderr[-4000:]
