"""TSP benchmark: one micro-batch's training pass, per-timestep loop vs timesteps stacked into the batch.

    python -m digenrl_verl.bench tsp [--json] [--repeats N] [--threads 1] [--device cpu]
    python -m digenrl_verl.bench tsp --size mid --device cuda --dtype bf16 --lora-rank 32 --no-memory --json
    python -m digenrl_verl.bench tsp --engine verl_omni --json   # verl-omni's stock engine vs its TSP subclass

`--engine verl_omni` runs digenrl_verl.bench.tsp_verl_omni instead (its own options; needs verl-omni).

Model: the tiny FLUX "bench" directory (`build_tiny_model_dir("FluxPipeline", size="bench")`: 2 double +
2 single blocks, 2 heads × 32 dims, rope axes (8, 12, 12)) through the real FluxAdapter, 128 px → 64 latent
tokens, no CFG. Micro-batch of 1 sample with 8 trained timesteps (Flow-GRPO selection, N = 9, f = 0.99).

`--size mid` (the GPU throughput line): the same pipeline with its transformer replaced by a random-init
FLUX-like one of a few hundred M parameters (`MID_DIMS`: 6 double + 12 single blocks, 8 heads x 128, ~0.4 B
parameters), 512 px → 1024 latent tokens, in `--dtype` with LoRA `--lora-rank` (default 32 for mid).

Figures:
  * per_step_ms / tsp_ms: median wall time of `accumulate_gradients` (forward + backward of all 8 rows) in
    `per_timestep` mode (8 forwards of 1 row) and `batched` mode (1 forward of 8 rows); ratio = their quotient.
  * grad_max_rel_err: max |g_tsp − g_loop| / max |g_loop| over the trainable parameters.
  * memory: each mode (and each chunk size of the sweep) runs in its own subprocess. `peak_rss_mb` is that
    process's max RSS (resource.getrusage) after the training pass and `extra_peak_rss_mb` its growth over the
    max RSS reached before the pass — often 0, because loading the pipeline peaks higher than training. On
    Linux the high-water mark is therefore also reset after setup (/proc/self/clear_refs): `train_extra_rss_mb`
    is the RSS growth during the training pass alone. `saved_activations_mb` is the largest total size of
    tensors autograd saved for backward in one forward (saved-tensor hooks) — the activation memory the chunk
    size bounds, free of allocator noise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

NUM_STEPS = 9  # ⌊9 · 0.99⌋ = 8 trained timesteps
HEIGHT = WIDTH = 128  # 64 latent tokens for the FLUX bench model
CHUNKS = (1, 2, 4, 8)
#: the mid-size transformer: inner dim 8 x 128 = 1024, ~0.4 B parameters; text dims match the tiny encoders
MID_DIMS = dict(num_layers=6, num_single_layers=12, num_attention_heads=8, attention_head_dim=128,
                axes_dims_rope=(16, 56, 56))
SIZES = {"bench": 128, "mid": 512}  # size → image side in px (64 and 1024 latent tokens)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ENGINES = ("digenrl", "verl_omni")


def build_model_dir(size: str, path: str, device: str = "cpu", dims: dict[str, Any] | None = None) -> str:
    """The tiny FLUX "bench" pipeline directory; for `mid`, its transformer replaced by a random-init one of
    `dims` (default `MID_DIMS`), built on `device` and saved in bf16."""
    from digenrl_verl.models.tiny import build_tiny_model_dir

    model_dir = str(build_tiny_model_dir("FluxPipeline", path, seed=0, size="bench"))
    if size == "mid":
        from diffusers import FluxTransformer2DModel

        torch.manual_seed(0)
        with torch.device(device):
            transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, joint_attention_dim=32,
                                                 pooled_projection_dim=32, guidance_embeds=True,
                                                 **(dims or MID_DIMS))
        shutil.rmtree(os.path.join(model_dir, "transformer"))
        transformer.to(torch.bfloat16).save_pretrained(os.path.join(model_dir, "transformer"))
        del transformer
    return model_dir


def _setup(model_dir: str, device: str, side: int = HEIGHT, dtype: torch.dtype = torch.float32,
           lora_rank: int = 0) -> tuple[Any, Any, Any]:
    from digenrl_verl.diffusion.noise import SampleKey
    from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
    from digenrl_verl.models import load_adapter
    from digenrl_verl.models.config import LoraConfig

    adapter = load_adapter(model_dir, height=side, width=side, guidance_scale=3.5, max_sequence_length=16,
                           device=device, keep_reference=False, dtype=dtype,
                           lora=LoraConfig(rank=lora_rank, alpha=2 * lora_rank) if lora_rank else None)
    cfg = RolloutConfig(num_inference_steps=NUM_STEPS, sde_type="sde", noise_level=0.9, timestep_fraction=0.99)
    cond = adapter.encode_prompts(["a photo of a cat"])
    traj = rollout(adapter, cond, [SampleKey(0, "bench", 0)], cfg)
    tokens = (side // 16) ** 2
    assert traj.num_steps == 8 and adapter.latent_shape()[0] == tokens, (traj.num_steps, adapter.latent_shape())
    return adapter, cond, traj


def _train(adapter: Any, cond: Any, traj: Any, mode: str, chunk: int | None) -> None:
    from digenrl_verl.diffusion.loss import LossConfig
    from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients

    for p in adapter.trainable_parameters():
        p.grad = None
    adv = torch.ones(traj.batch_size)
    accumulate_gradients(adapter, cond, traj, adv, LossConfig(), TSPConfig(mode, chunk),
                         traj.batch_size * traj.num_steps)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timings(model_dir: str, device: str, repeats: int, side: int = HEIGHT, dtype: torch.dtype = torch.float32,
             lora_rank: int = 0) -> dict[str, Any]:
    adapter, cond, traj = _setup(model_dir, device, side, dtype, lora_rank)
    grads = {}
    for mode in ("per_timestep", "batched"):
        _train(adapter, cond, traj, mode, None)
        grads[mode] = [p.grad.detach().clone() for p in adapter.trainable_parameters()]
    for _ in range(2):  # warm-up
        _train(adapter, cond, traj, "per_timestep", None)
        _train(adapter, cond, traj, "batched", None)
    times: dict[str, list[float]] = {"per_timestep": [], "batched": []}
    for _ in range(repeats):  # interleaved, so drifts in machine load hit both modes alike
        for mode in times:
            _sync(device)
            t0 = time.perf_counter()
            _train(adapter, cond, traj, mode, None)
            _sync(device)
            times[mode].append((time.perf_counter() - t0) * 1e3)
    scale = max(float(g.abs().max()) for g in grads["per_timestep"])
    err = max(float((a - b).abs().max()) for a, b in zip(grads["batched"], grads["per_timestep"])) / scale
    per_step, tsp = statistics.median(times["per_timestep"]), statistics.median(times["batched"])
    return {"per_step_ms": per_step, "tsp_ms": tsp, "ratio": per_step / tsp, "grad_max_rel_err": err,
            "per_step_ms_all": times["per_timestep"], "tsp_ms_all": times["batched"],
            "trainable_params": sum(p.numel() for p in adapter.trainable_parameters()),
            "transformer_params": sum(p.numel() for p in adapter.transformer.parameters())}


def _proc_status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Linux: reset this process's RSS high-water mark (VmHWM) to the current RSS (`clear_refs` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _child(model_dir: str, device: str, mode: str, chunk: int | None) -> dict[str, Any]:
    """Runs in its own process: peak memory of one training pass in `mode`."""
    adapter, cond, traj = _setup(model_dir, device)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_before = _proc_status_mb("VmRSS")
    hwm_reset = _reset_peak_rss()
    saved = {"cur": 0, "peak": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved["cur"] += t.numel() * t.element_size()
        saved["peak"] = max(saved["peak"], saved["cur"])
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base_gpu = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        # count per forward: reset the running total whenever a forward starts (each chunk frees its graph)
        real_velocity = adapter.velocity

        def counted_velocity(*args: Any, **kwargs: Any) -> torch.Tensor:
            saved["cur"] = 0
            return real_velocity(*args, **kwargs)

        adapter.velocity = counted_velocity  # type: ignore[method-assign]
        _train(adapter, cond, traj, mode, chunk)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"mode": mode, "chunk_size": chunk, "peak_rss_mb": after, "extra_peak_rss_mb": after - before,
           "saved_activations_mb": saved["peak"] / 2**20}
    hwm = _proc_status_mb("VmHWM")
    if hwm_reset and hwm is not None and rss_before is not None:
        out["train_peak_rss_mb"] = hwm
        out["train_extra_rss_mb"] = hwm - rss_before
    if device.startswith("cuda"):
        out["gpu_extra_peak_mb"] = (torch.cuda.max_memory_allocated() - base_gpu) / 2**20
    return out


def _spawn(model_dir: str, device: str, threads: int, mode: str, chunk: int | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "digenrl_verl.bench.tsp", "--child", mode, str(chunk or 0), "--model-dir", model_dir,
           "--device", device, "--threads", str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"memory child {mode}/{chunk} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _quiet() -> None:
    """No progress bars from diffusers / transformers while loading and saving the model."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


def main(argv: list[str]) -> int:
    engine = argparse.ArgumentParser(prog="python -m digenrl_verl.bench tsp", add_help=False)
    engine.add_argument("--engine", choices=ENGINES, default="digenrl")
    known, rest = engine.parse_known_args(argv)
    if known.engine == "verl_omni":
        from digenrl_verl.bench import tsp_verl_omni

        return tsp_verl_omni.main(rest)
    parser = argparse.ArgumentParser(prog="python -m digenrl_verl.bench tsp", description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=ENGINES, default="digenrl",
                        help="digenrl: this package's update path (default); verl_omni: verl-omni's engine, "
                             "stock vs TSP (bench/tsp_verl_omni.py, its own options)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="bench",
                        help="bench: the tiny FLUX (default); mid: a ~0.4 B random-init FLUX-like transformer")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--lora-rank", type=int, default=None, help="0 = full fine-tune (default: 0 bench, 32 mid)")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-mode memory subprocesses")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CHUNK"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    _quiet()
    if args.child:
        mode, chunk = args.child[0], int(args.child[1]) or None
        print(json.dumps(_child(args.model_dir, args.device, mode, chunk)))
        return 0

    lora_rank = args.lora_rank if args.lora_rank is not None else (32 if args.size == "mid" else 0)
    side, dtype = SIZES[args.size], DTYPES[args.dtype]
    if args.size != "bench" and not args.no_memory:
        parser.error("the per-mode memory subprocesses run the bench size only: add --no-memory")
    if (args.dtype != "fp32" or lora_rank) and not args.no_memory:
        parser.error("the memory subprocesses run fp32 without LoRA: add --no-memory")
    tmp = tempfile.mkdtemp(prefix="digenrl_bench_tsp_")
    try:
        t0 = time.perf_counter()
        model_dir = build_model_dir(args.size, os.path.join(tmp, "flux"), args.device)
        build_s = time.perf_counter() - t0
        result: dict[str, Any] = _timings(model_dir, args.device, args.repeats, side, dtype, lora_rank)
        result["build_s"] = build_s
        if not args.no_memory:
            result["memory"] = {
                "per_timestep": _spawn(model_dir, args.device, args.threads, "per_timestep", None),
                "batched": _spawn(model_dir, args.device, args.threads, "batched", None),
            }
            result["chunk_sweep"] = [_spawn(model_dir, args.device, args.threads, "batched", c) for c in CHUNKS]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    model = ("FluxPipeline tiny 'bench': 2 double + 2 single blocks, 2 heads x 32, rope (8, 12, 12)"
             if args.size == "bench" else f"FluxPipeline 'mid' random init: {MID_DIMS}")
    result["config"] = {
        "model": model, "size": args.size, "dtype": args.dtype, "lora_rank": lora_rank,
        "latent_tokens": (side // 16) ** 2, "micro_batch": 1, "timesteps": 8, "num_inference_steps": NUM_STEPS,
        "sde_type": "sde", "threads": args.threads, "device": args.device, "repeats": args.repeats,
        "torch": torch.__version__,
    }
    if not args.json:
        print(f"per-timestep {result['per_step_ms']:.1f} ms, TSP {result['tsp_ms']:.1f} ms, "
              f"ratio {result['ratio']:.2f}, grad rel err {result['grad_max_rel_err']:.2e}")
        for row in result.get("chunk_sweep", []):
            print(f"  chunk {row['chunk_size']}: saved activations {row['saved_activations_mb']:.2f} MB, "
                  f"training RSS growth {row.get('train_extra_rss_mb', float('nan')):.1f} MB")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
