"""TSP on verl-omni's own engine: ``python -m digenrl_verl.bench tsp --engine verl_omni [--json]``.

Baseline: verl-omni's stock `PPODiffusersFSDPEngine` (its per-timestep loop: one forward and one backward per
timestep of each micro-batch). Against it: `TSPDiffusersFSDPEngine` (digenrl_verl.integrations.verl_omni_tsp),
the same engine with the timesteps of a micro-batch stacked into one forward (chunk rows 0 = all T steps).

Both engines are built in ONE process the way verl-omni's TrainingWorker builds one (its Hydra model / actor
configs, fsdp2, fp32, world size 1 over gloo, verl's CPU platform from this package on ``--device cpu``), from the
same tiny Qwen-Image directory (`build_tiny_model_dir("QwenImagePipeline")`, the unit size the verl-omni tests use)
with the same weights, and run `forward_backward_batch` on the same rollout batch (verl-omni's layout: T steps,
micro-batches of B samples, old log-probs = the current policy's plus noise so every row carries gradient).
Each ``--heights`` value runs in its own process: latent tokens = (height / 16)^2.

Figures, per height: stock_ms / tsp_ms, the median over ``--repeats`` runs of one `forward_backward_batch`
(forward + backward of every micro-batch and timestep, the optimizer step excluded), the two engines alternating
after one warm-up run each; ratio = stock_ms / tsp_ms; grad_max_rel_err = max over the trainable tensors of
max |g_tsp - g_stock| / max |g_stock|, with the tensor that has it named and its error relative to its own norm
(`_grad_errors`), so a figure over 1e-6 can be told from a tensor with a small gradient.

Needs verl-omni (the `.venv-verl-omni` that scripts/verl_omni_venv.sh builds); verl-omni is imported only in the
measuring processes, and without it the command exits with a message naming that fix.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

BASELINE = "verl-omni PPODiffusersFSDPEngine (stock per-timestep loop), same process, weights and batch"
NO_VERL_OMNI = ("bench tsp --engine verl_omni: verl-omni is not installed in this interpreter ({python}). Run it "
                "in the verl-omni venv: `source scripts/verl_omni_venv.sh && \"$VERL_OMNI_PY\" -m digenrl_verl.bench "
                "tsp --engine verl_omni --json` (scripts/verl_omni_venv.sh builds .venv-verl-omni: verl-omni a1139baf "
                "with verl 8a69493).")


def _configs(model_dir: str, args: dict[str, Any]):
    """verl-omni's model and actor configs from its Hydra files: fsdp2, fp32, world size 1."""
    import verl_omni
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    root = Path(verl_omni.__file__).parent / "trainer" / "config" / "diffusion"
    lora = args["lora_rank"]
    model = [f"path={model_dir}", f"tokenizer_path={model_dir}/tokenizer", f"lora_rank={lora}",
             f"lora_alpha={2 * lora}", f"pipeline.height={args['height']}", f"pipeline.width={args['height']}",
             # a schedule one step longer than the steps trained: never its last step (sigma -> 0), where the random
             # latents' log-probs are far from 0 and float32 rounding moves a gradient by ~1e-4 (verl-omni's recipes
             # train an SDE window inside [0, 5) of 10+ steps; tests/verl_omni/test_verl_omni_tsp_engine.py)
             f"pipeline.num_inference_steps={args['steps'] + 1}", "pipeline.true_cfg_scale=1.0",
             "algo.noise_level=1.2", "algo.sde_type=sde", "attn_backend=native",
             "enable_gradient_checkpointing=False"]
    with initialize_config_dir(config_dir=str(root / "model"), version_base=None):
        model_config = omega_conf_to_dataclass(compose(config_name="diffusion_model", overrides=model))
    actor = ["strategy=fsdp2", f"diffusion_loss.loss_mode={args['loss']}", "diffusion_loss.clip_ratio=0.2",
             f"ppo_mini_batch_size={args['micro'] * args['micro_batches']}",
             f"ppo_micro_batch_size_per_gpu={args['micro']}", "optim.lr=1e-4", "fsdp_config.model_dtype=fp32",
             "fsdp_config.dtype=float32", "+fsdp_config.mixed_precision.param_dtype=fp32", "fsdp_config.fsdp_size=1"]
    with initialize_config_dir(config_dir=str(root / "actor"), version_base=None):
        actor_config = omega_conf_to_dataclass(compose(config_name="dp_diffusion_actor", overrides=actor))
    return model_config, actor_config


def _batch(model_config, args: dict[str, Any]):
    """A rollout batch in verl-omni's layout (packed Qwen-Image latents per step) with the meta its engine reads."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl_omni.pipelines.utils import build_scheduler
    from verl_omni.workers.utils.padding import embeds_padding_2_no_padding

    tconf = json.loads((Path(model_config.local_path) / "transformer" / "config.json").read_text())
    rows, steps, height = args["micro"] * args["micro_batches"], args["steps"], args["height"]
    tokens, text = (height // 16) ** 2, tconf["joint_attention_dim"]
    g = torch.Generator().manual_seed(7)
    latents = torch.randn(rows, steps + 1, tokens, tconf["in_channels"], generator=g)
    fields = {"old_log_probs": torch.zeros(rows, steps), "advantages": torch.randn(rows, steps, generator=g),
              "all_latents": latents,
              "all_timesteps": build_scheduler(model_config).timesteps[:steps].float()[None].repeat(rows, 1),
              "old_prev_sample_mean": latents[:, 1:].clone(),
              "prompt_embeds": torch.randn(rows, 7, text, generator=g),
              "prompt_embeds_mask": torch.ones(rows, 7, dtype=torch.int32),
              "negative_prompt_embeds": torch.randn(rows, 7, text, generator=g),
              "negative_prompt_embeds_mask": torch.ones(rows, 7, dtype=torch.int32)}
    td = embeds_padding_2_no_padding(TensorDict(fields, batch_size=rows))
    tu.assign_non_tensor(td, micro_batch_size_per_gpu=args["micro"], height=height, width=height,
                         vae_scale_factor=8)
    return td


def _engines(model_config, actor_config, chunk_rows: int) -> list:
    """The stock engine and the TSP engine, initialised, with the same weights (LoRA factors seeded at random)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor
    from verl_omni.workers.engine.fsdp.diffusers_impl import PPODiffusersFSDPEngine

    from digenrl_verl.integrations.verl_omni_tsp import TSPDiffusersFSDPEngine

    engines = []
    for cls, extra in ((PPODiffusersFSDPEngine, {}), (TSPDiffusersFSDPEngine, {"tsp_chunk_size": chunk_rows})):
        engine = cls(model_config=model_config, engine_config=actor_config.engine,
                     optimizer_config=actor_config.optim, checkpoint_config=actor_config.checkpoint, **extra)
        engine.initialize()
        engines.append(engine)
    g = torch.Generator().manual_seed(123)
    targets = [dict(engine.module.named_parameters()) for engine in engines]
    for name, ref in targets[0].items():
        full = (ref.full_tensor() if isinstance(ref, DTensor) else ref).detach().clone()
        if "lora_" in name:  # both LoRA factors non-zero, so both get gradients
            full = torch.randn(full.shape, generator=g, dtype=full.dtype) * 0.05
        for params in targets:
            p = params[name]
            with torch.no_grad():
                p.copy_(distribute_tensor(full, p.device_mesh, p.placements) if isinstance(p, DTensor) else full)
    return engines


def _near_policy(engine, td) -> None:
    """Old log-probs / SDE means = the current policy's plus a little noise: ratios near 1, every row trains."""
    import torch

    with torch.no_grad(), engine.eval_mode():
        out = engine.forward_backward_batch(td.clone(), None, forward_only=True)["model_output"]
    g = torch.Generator().manual_seed(11)
    td["old_log_probs"] = out["log_probs"] + 0.05 * torch.randn(out["log_probs"].shape, generator=g)
    td["old_prev_sample_mean"] = out["prev_sample_mean"] + 0.01 * torch.randn(out["prev_sample_mean"].shape,
                                                                              generator=g)


def _timed(engine, td, loss_fn) -> tuple[float, dict]:
    """One `forward_backward_batch` in train mode: (milliseconds, {name: gradient})."""
    from torch.distributed.tensor import DTensor

    engine.optimizer_zero_grad()
    with engine.train_mode():  # its exit zeroes the gradients: read them inside
        start = time.perf_counter()
        engine.forward_backward_batch(td.clone(), loss_fn, forward_only=False)
        ms = 1e3 * (time.perf_counter() - start)
        grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                 for n, p in engine.module.named_parameters() if p.requires_grad and p.grad is not None}
    return ms, grads


def _measure(args: dict[str, Any]) -> dict[str, Any]:
    """Runs in the measuring process: both engines, one warm-up each, then `repeats` alternating timed runs."""
    import torch
    from verl_omni.workers.utils.losses import diffusion_loss

    torch.set_num_threads(args["threads"])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    model_config, actor_config = _configs(args["model_dir"], args)
    engines = _engines(model_config, actor_config, args["chunk_rows"])
    td = _batch(model_config, args)
    _near_policy(engines[0], td)
    loss_fn = partial(diffusion_loss, config=actor_config)
    grads = [_timed(engine, td, loss_fn)[1] for engine in engines]  # also the warm-up
    times: list[list[float]] = [[], []]
    for _ in range(args["repeats"]):
        for engine, samples in zip(engines, times):
            samples.append(_timed(engine, td, loss_fn)[0])
    stock_ms, tsp_ms = (statistics.median(t) for t in times)
    errors = _grad_errors(grads[0], grads[1])
    torch.distributed.destroy_process_group()
    return {"height": args["height"], "latent_tokens": (args["height"] // 16) ** 2, "stock_ms": stock_ms,
            "tsp_ms": tsp_ms, "ratio": stock_ms / tsp_ms, **errors, "stock_ms_all": times[0],
            "tsp_ms_all": times[1], "trainable_tensors": len(grads[0]),
            "trainable_params": sum(g.numel() for g in grads[0].values())}


def _grad_errors(stock: dict, tsp: dict) -> dict[str, Any]:
    """The gradients' agreement, tensor by tensor: `grad_max_rel_err`, the largest max |g_tsp - g_stock| / max
    |g_stock|, with the tensor that has it (`grad_worst_tensor`), its norm-relative error ||g_tsp - g_stock|| /
    ||g_stock|| (`grad_worst_norm_rel_err`) and its gradient's max |g_stock| (`grad_worst_scale`: a tensor whose
    gradient is small next to the others' shows fp32 summation noise large against it); `grad_max_norm_rel_err`:
    the largest norm-relative error over the tensors."""
    rows = {}
    for name, g in stock.items():
        diff = (tsp[name] - g).float()
        rows[name] = (float(diff.abs().max() / g.abs().max().clamp_min(1e-30)),
                      float(diff.norm() / g.float().norm().clamp_min(1e-30)), float(g.abs().max()))
    worst = max(rows, key=lambda n: rows[n][0])
    return {"grad_max_rel_err": rows[worst][0], "grad_worst_tensor": worst, "grad_worst_norm_rel_err": rows[worst][1],
            "grad_worst_scale": rows[worst][2], "grad_max_norm_rel_err": max(r[1] for r in rows.values()),
            "grad_median_scale": statistics.median(r[2] for r in rows.values())}


def _spawn(args: dict[str, Any]) -> dict[str, Any]:
    """One height in its own process (verl's platform is chosen before verl is imported)."""
    from digenrl_verl.platform import process_env

    env = {**os.environ, **process_env(cpu=args["device"] == "cpu"), "OMP_NUM_THREADS": str(args["threads"]),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TORCH_COMPILE_DISABLE": "1"}
    proc = subprocess.run([sys.executable, "-m", "digenrl_verl.bench.tsp_verl_omni", "--child", json.dumps(args)],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"verl-omni TSP bench, height {args['height']}: the measuring process failed "
                           f"(exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m digenrl_verl.bench tsp --engine verl_omni",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per engine (median reported)")
    parser.add_argument("--heights", default="64,128,256", help="comma-separated image sides in px (64 -> 16 tokens)")
    parser.add_argument("--steps", type=int, default=5, help="timesteps T per sample")
    parser.add_argument("--micro", type=int, default=2, help="samples B per micro-batch")
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--chunk-rows", type=int, default=0, help="TSP chunk in rows (0 = all T steps at once)")
    parser.add_argument("--lora-rank", type=int, default=0, help="0 = full fine-tune")
    parser.add_argument("--loss", default="flow_grpo", help="verl-omni diffusion_loss.loss_mode")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the measuring process")
    parser.add_argument("--device", choices=["cpu"], default="cpu", help="verl's CPU platform (gloo)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        print(json.dumps(_measure(json.loads(args.child))))
        return 0
    if importlib.util.find_spec("verl_omni") is None:
        print(NO_VERL_OMNI.format(python=sys.executable), file=sys.stderr)
        return 2
    from digenrl_verl.models.tiny import build_tiny_model_dir

    config = {key: getattr(args, key) for key in ("steps", "micro", "micro_batches", "chunk_rows", "lora_rank",
                                                   "loss", "threads", "device", "repeats")}
    tmp = tempfile.mkdtemp(prefix="digenrl_bench_tsp_verl_omni_")
    try:
        model_dir = str(build_tiny_model_dir("QwenImagePipeline", Path(tmp) / "qwen", seed=0))
        results = [_spawn({**config, "model_dir": model_dir, "height": int(h)}) for h in args.heights.split(",")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import torch

    out = {"baseline": BASELINE, "engine": "verl_omni", "results": results,
           "config": {**config, "model": "QwenImagePipeline tiny 'unit' (build_tiny_model_dir)", "world_size": 1,
                      "strategy": "fsdp2", "dtype": "fp32", "torch": torch.__version__}}
    if not args.json:
        for row in results:
            print(f"{row['latent_tokens']} tokens: stock {row['stock_ms']:.1f} ms, TSP {row['tsp_ms']:.1f} ms, "
                  f"ratio {row['ratio']:.2f}, grad rel err {row['grad_max_rel_err']:.2e} (worst tensor "
                  f"{row['grad_worst_tensor']}: {row['grad_worst_norm_rel_err']:.2e} of its norm, its max |g| "
                  f"{row['grad_worst_scale']:.2e} against a median {row['grad_median_scale']:.2e})")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
