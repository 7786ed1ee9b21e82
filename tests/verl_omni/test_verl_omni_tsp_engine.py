"""The TSP engine (`digenrl_verl.integrations.verl_omni_tsp`) against verl-omni's stock `PPODiffusersFSDPEngine`.

Both engines are built the way verl-omni's TrainingWorker builds one (its Hydra model / actor configs, fsdp2, fp32,
the CPU platform, a gloo group started first), from the same tiny directory with the same weights (LoRA adapters
set to the same random values, so both LoRA factors get gradients), and run `forward_backward_batch` on the same
batch. Checked: every gradient (max |g_tsp - g_stock| / max |g_stock| per tensor) <= 1e-5, the per-step log-probs,
losses and metrics. Each case runs in a fresh interpreter (this file as a script: the platform must be chosen
before verl is imported); world size 2 runs two gloo ranks.

Cases. Tiny Qwen-Image, T=5 timesteps, micro-batches of B=2 samples, chunk_size=6 rows, so k=3 timesteps per
forward (uneven chunks: 3 + 2): flow_grpo and grpo_guard, full and LoRA; world size 2 (data parallel); world size
2 as one Ulysses SP group (`fsdp_config.ulysses_sequence_parallel_size=2`, both engines under the same setting,
each rank's first block seeing half the tokens). DanceGRPO as verl-omni's wan22_dance_grpo recipe runs it
(DANCE_* below) on the tiny WanPipeline through verl-omni's Wan22DanceGRPO training adapter, full and LoRA.

Mutations (each in the process of the case it mutates): `one_loss_call`, ONE loss call over the stacked k*B rows
(scaled by k), must fail grpo_guard (its std_dev_t / sqrt_dt means pool over the rows); `no_sp_scale`, the per-step
loss data without the engine's sp_size, must fail SP 2.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if __name__ != "__main__":
    pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")
if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import (  # noqa: E402
    finish_rank, full_tensor, hydra_configs, init_gloo, near_policy, rel, rollout_batch, run_code, run_main,
    run_script, same_weights, tiny_qwen_dir, video_rollout_batch, with_meta)

NUM_STEPS, MICRO, CHUNK_ROWS, HEIGHT = 5, 2, 6, 64
# The Qwen-Image cases train NUM_STEPS steps of a schedule one step longer, never its last step (sigma -> 0), as
# verl-omni's recipes train an SDE window inside [0, 5) of 10+ steps: at the last step the SDE's std is so small that
# the random test latents get log-probs far from 0, and float32 rounding of the two engines' kernels (batched rows
# against one step at a time) moves a ratio by ~1e-6, the gradient by 1e-4 (measured: flow_grpo LoRA 1.15e-4 with the
# last step trained, on the 2026-12-06 venv; both engines' arithmetic is the same, only its blocking differs).
SCHEDULE_STEPS = NUM_STEPS + 1
TOLERANCE = 1e-5
# DanceGRPO as verl-omni's wan22_dance_grpo recipe runs it (examples/dancegrpo_trainer/wan22/
# run_wan22_5b_t2v_hpsv3_auto.sh): loss_mode dance_grpo (verl-omni's Flow-GRPO clipped objective), sde_type
# dance_sde, noise_level 1.2, true_cfg_scale 5.0 (CFG in the training forward), clip_ratio left at verl-omni's
# default 1e-4, adv_clip_max 5, 10 inference steps with an SDE window of 2 steps in [0, 5), verl-omni's
# Wan22DanceGRPO training adapter (model.algorithm=dance_grpo, shift 5). The window here: steps 2 and 3.
DANCE_STEPS, DANCE_WINDOW, DANCE_FRAMES, DANCE_CFG = 10, range(2, 4), 5, 5.0


# ---------------------------------------------------------------- the worker (a fresh interpreter per case)

def _configs(args: dict, world: int):
    optim = ["optim.lr=1e-4", f"fsdp_config.ulysses_sequence_parallel_size={args['sp']}"]
    if args["setting"] == "dance":
        return hydra_configs(args["model_dir"], lora=args["lora"], loss_mode="dance_grpo", num_steps=DANCE_STEPS,
                             height=HEIGHT, micro=MICRO, world=world, optim=optim, sde_type="dance_sde",
                             true_cfg_scale=DANCE_CFG, clip_ratio=None,
                             model_extra=("algorithm=dance_grpo", f"pipeline.num_frames={DANCE_FRAMES}"))
    return hydra_configs(args["model_dir"], lora=args["lora"], loss_mode=args["loss"], num_steps=SCHEDULE_STEPS,
                         height=HEIGHT, micro=MICRO, world=world, optim=optim)


def _batch(model_config, setting: str, rows: int, seed: int):
    """A rollout batch in verl-omni's layout, for this rank's `rows`, with its meta."""
    if setting == "dance":
        td = video_rollout_batch(model_config, rows, seed, steps=DANCE_WINDOW, height=HEIGHT, frames=DANCE_FRAMES)
    else:
        td = rollout_batch(model_config, rows, seed, num_steps=NUM_STEPS, height=HEIGHT, random_old=True)
    return with_meta(td, micro=MICRO, height=HEIGHT)


def _block_tokens(engine) -> list[int]:
    """Records, per call, the longest sequence among the first transformer block's outputs on this rank into the
    list returned. Its outputs, not inputs: diffusers' context parallelism splits the block's inputs inside the
    call and leaves its outputs split (Qwen-Image's _cp_plan), so under SP 2 they hold half the tokens."""
    import torch

    seen: list[int] = []
    block = next(m for n, m in engine.module.named_modules() if n.endswith("blocks.0"))

    def hook(module, args, output):
        outputs = output if isinstance(output, tuple) else (output,)
        seen.append(max(int(t.shape[1]) for t in outputs if isinstance(t, torch.Tensor) and t.dim() == 3))

    block.register_forward_hook(hook)
    return seen


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
            "zero_grads": sorted(n for n, g in grads0.items() if not g.abs().max() > 0),
            "log_probs_err": float((lp1 - lp0).abs().max() / lp0.abs().max()),
            "infer_err": float((infer1 - infer0).abs().max() / infer0.abs().max()),
            "losses": [out0["loss"], out1["loss"]], "metric_keys": [sorted(out0["metrics"]), sorted(out1["metrics"])],
            "metrics": [_metric_values(out0["metrics"]), _metric_values(out1["metrics"])],
            "seconds": [sec0, sec1]}


def _mutated(base, mutation: str):
    """The TSP engine with a planted bug. one_loss_call: ONE loss call over the stacked k*B rows, scaled by k (must
    fail grpo_guard). no_sp_scale: the per-step loss data lose the engine's sp_size (verl-omni's loss multiplies by
    it under Ulysses SP), as a TSP that rebuilds the loss data would (must fail SP 2)."""
    from verl.utils import tensordict_utils as tu

    class OneLossCall(base):
        def _per_step_losses(self, loss_function, model_output, data, dp_group, num_steps):
            loss, metrics = loss_function(model_output=model_output, data=data, dp_group=dp_group)
            return loss * num_steps, [(loss.detach().item(), metrics)] * num_steps

    class NoSpScale(base):
        def _per_step_losses(self, loss_function, model_output, data, dp_group, num_steps):
            tu.assign_non_tensor(data, sp_size=1)
            return super()._per_step_losses(loss_function, model_output, data, dp_group, num_steps)

    return {"one_loss_call": OneLossCall, "no_sp_scale": NoSpScale}[mutation]


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
    """The stock engine, the TSP engine and one TSP engine per planted bug in args["mutations"], on the same
    weights and batch; the report compares the TSP engine with the stock one (mutants: their gradient error)."""
    init_gloo(rank, world, port)
    _device_cpu_platform()
    from functools import partial

    from verl_omni.workers.engine.fsdp.diffusers_impl import PPODiffusersFSDPEngine
    from verl_omni.workers.utils.losses import diffusion_loss

    from digenrl_verl.integrations.verl_omni_tsp import TSPDiffusersFSDPEngine

    model_config, actor_config = _configs(args, world)
    tsp = {"tsp_chunk_size": CHUNK_ROWS}
    engines = []
    for cls, extra in [(PPODiffusersFSDPEngine, {}), (TSPDiffusersFSDPEngine, tsp),
                       *[(_mutated(TSPDiffusersFSDPEngine, m), tsp) for m in args["mutations"]]]:
        engine = cls(model_config=model_config, engine_config=actor_config.engine,
                     optimizer_config=actor_config.optim, checkpoint_config=actor_config.checkpoint, **extra)
        engine.initialize()
        engines.append(engine)
    same_weights(engines, args["lora"])
    dp_rank = rank // args["sp"]  # the ranks of one SP group hold the same samples
    td = _batch(model_config, args["setting"], MICRO * args["micro_batches"], seed=7 + dp_rank)
    # DanceGRPO: log-prob noise of the order of its 1e-4 clip, so both PPO branches occur
    near_policy(engines[0], td, td.clone(), seed=11 + dp_rank, noise=1e-4 if args["setting"] == "dance" else 0.05)
    tokens = [_block_tokens(e) for e in engines[:2]]
    loss_fn = partial(diffusion_loss, config=actor_config)
    results = [_run(e, td, loss_fn) for e in engines]
    report = _compare(*results[:2])
    report.update(sp=[e.ulysses_sequence_parallel_size if e.use_ulysses_sp else 1 for e in engines[:2]],
                  dp_size=[e.get_data_parallel_size() for e in engines[:2]],
                  block_tokens=[sorted(set(t)) for t in tokens], block_calls=[len(t) for t in tokens],
                  mutants={m: rel(r[1], results[0][1]) for m, r in zip(args["mutations"], results[2:])})
    if args["repeats"] > 1:  # timing: the median of several runs, engines alternating
        import statistics

        times = [[r[2]] for r in results[:2]]
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


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory) -> str:
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return str(build_tiny_model_dir("WanPipeline", tmp_path_factory.mktemp("tsp_engine_wan") / "wan", seed=0))


def run_case(model_dir: str, tmp_path: Path, *, lora: bool, loss: str, world: int = 1, mutations: tuple = (),
             micro_batches: int = 2, repeats: int = 1, sp: int = 1, setting: str = "qwen") -> dict:
    label = f"setting={setting} lora={lora} loss={loss} world={world} sp={sp} mutants={','.join(mutations) or '-'}"
    out = tmp_path / f"report-{label.replace(' ', '-')}.json"
    args = dict(model_dir=model_dir, lora=lora, loss=loss, world=world, mutations=list(mutations), out=str(out),
                micro_batches=micro_batches, repeats=repeats, sp=sp, setting=setting)
    return run_script(__file__, args, f"TSP engine {label}")


@pytest.fixture(scope="module")
def case(qwen_dir, tmp_path_factory):
    """run_case on the tiny Qwen-Image, each distinct case once per module (a mutant rides along in the process
    of the case it mutates, so its test and the case's share one run)."""
    done: dict[str, dict] = {}

    def get(**kwargs) -> dict:
        key = repr(sorted(kwargs.items()))
        if key not in done:
            done[key] = run_case(qwen_dir, tmp_path_factory.mktemp("case"), **kwargs)
        return done[key]

    return get


# verl-omni's QwenImage transformer drops the text stream after its last block, so that block's text-query
# projection (add_q_proj, norm_added_q) gets no gradient in either engine; every other tensor must get one
UNUSED = re.compile(r"\.(add_q_proj|norm_added_q)\.")


def _check(report: dict, num_steps: int = NUM_STEPS, metric_abs: float = 1e-6) -> None:
    assert report["grad_err"] <= TOLERANCE and report["tensors"] > 0, report
    assert not [n for n in report["zero_grads"] if not UNUSED.search(n)], report
    assert report["log_probs_shape"][1] == num_steps and report["log_probs_err"] <= TOLERANCE, report
    assert report["infer_err"] <= TOLERANCE, report
    stock_losses, tsp_losses = (sum(losses, []) for losses in report["losses"])  # per micro-batch and step
    assert len(tsp_losses) == len(stock_losses) and tsp_losses == pytest.approx(stock_losses, rel=1e-4, abs=1e-7)
    assert report["metric_keys"][0] == report["metric_keys"][1], report
    stock, tsp = report["metrics"]
    for name, values in stock.items():  # verl-omni's per-timestep metrics: one value per step, the same values
        assert len(tsp[name]) == len(values) and tsp[name] == pytest.approx(values, rel=1e-4, abs=metric_abs), name


GUARD_FULL = dict(lora=False, loss="grpo_guard", mutations=("one_loss_call",))
SP2 = dict(lora=False, loss="grpo_guard", world=2, sp=2, micro_batches=1, mutations=("no_sp_scale",))


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("loss", ["flow_grpo", "grpo_guard"])
def test_tsp_engine_gradient_equals_stock_loop(case, lora, loss):
    _check(case(**GUARD_FULL) if (lora, loss) == (False, "grpo_guard") else case(lora=lora, loss=loss))


@pytest.mark.slow
def test_one_loss_call_over_stacked_rows_fails_grpo_guard(case):
    """Mutation: ONE loss call over the stacked k*B rows (scaled by k) must fail grpo_guard's gradient check."""
    assert case(**GUARD_FULL)["mutants"]["one_loss_call"] > 1e-2


@pytest.mark.slow
def test_tsp_engine_world_size_2(case):
    _check(case(lora=True, loss="grpo_guard", world=2, micro_batches=1))


IMAGE_TOKENS = (HEIGHT // 16) ** 2  # the tiny Qwen-Image at 64 px: 16 latent tokens


@pytest.mark.slow
def test_tsp_engine_ulysses_sp_2(case):
    """World size 2 as ONE Ulysses group (fsdp_config.ulysses_sequence_parallel_size=2, data-parallel size 1):
    both engines shard every sequence over the 2 ranks (diffusers' context parallelism, all-to-all over gloo), the
    TSP engine's stacked k*B rows included; its gradient equals the stock engine's under the same SP setting."""
    report = case(**SP2)
    _check(report)
    assert report["sp"] == [2, 2] and report["dp_size"] == [1, 1], report
    # each rank's first block sees half of the 16 image tokens: SP really shards, in both engines
    assert report["block_tokens"] == [[IMAGE_TOKENS // 2]] * 2, report
    assert report["block_calls"][1] < report["block_calls"][0], report  # TSP: fewer, stacked forwards


@pytest.mark.slow
def test_sp_scale_dropped_fails_ulysses_sp_2(case):
    """Mutation: the TSP engine's per-step loss data without the engine's sp_size (verl-omni's loss multiplies by
    it under SP; the FSDP gradient averages over both SP ranks) must fail the SP 2 gradient check (by 1/2)."""
    assert case(**SP2)["mutants"]["no_sp_scale"] > 0.4


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_tsp_engine_dance_grpo_as_verl_omni_runs_it(wan_dir, tmp_path, lora):
    """DanceGRPO with verl-omni's wan22_dance_grpo settings (DANCE_* above) on the tiny WanPipeline through
    verl-omni's own Wan22DanceGRPO training adapter: the window's 2 timesteps in one stacked forward, CFG 5.0
    (positive and negative forward of the stacked rows), clip_ratio 1e-4. Not Wan2.2-TI2V-5B itself: the tiny
    directory is Wan2.1-shaped (one transformer, no expand_timesteps), which that adapter does not read anyway
    (it passes one timestep per sample and applies CFG itself)."""
    report = run_case(wan_dir, tmp_path, lora=lora, loss="dance_grpo", setting="dance")
    # metrics to 4e-6: ratios within ~1e-4 of 1 from log-probs of magnitude ~10, whose fp32 spacing is ~1e-6
    # (stacked vs per-step matmuls differ in the last bit), so ppo_kl / ratio_std move by about that much
    _check(report, num_steps=len(DANCE_WINDOW), metric_abs=4e-6)
    clipfrac = report["metrics"][0]["actor/pg_clipfrac"]
    assert 0 < sum(clipfrac) / len(clipfrac) < 1, report  # the 1e-4 clip active on some rows, not on all


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
    assert "registry ok" in run_code(REGISTRY_CHECK, timeout=300)  # registered at import: not in the case server's
