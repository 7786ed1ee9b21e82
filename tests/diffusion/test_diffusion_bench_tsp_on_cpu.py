"""The TSP benchmark runs and reports what it claims (no timing assertions: speed goals live in the bench)."""

import json

import torch

from digenrl_verl.bench import tsp as bench
from digenrl_verl.models.tiny import build_tiny_model_dir


def test_bench_reports_equal_gradients(capsys):
    assert bench.main(["--json", "--repeats", "1", "--no-memory"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["grad_max_rel_err"] <= 1e-5
    assert result["per_step_ms"] > 0 and result["tsp_ms"] > 0
    assert result["config"]["timesteps"] == 8 and result["config"]["latent_tokens"] == 64


def test_chunk_size_bounds_saved_activations(tmp_path):
    torch.set_num_threads(1)
    model_dir = str(build_tiny_model_dir("FluxPipeline", tmp_path / "flux", seed=0, size="bench"))
    rows = {c: bench._child(model_dir, "cpu", "batched", c) for c in (1, 8)}
    loop = bench._child(model_dir, "cpu", "per_timestep", None)
    assert rows[8]["saved_activations_mb"] > 3 * rows[1]["saved_activations_mb"]
    assert abs(loop["saved_activations_mb"] - rows[1]["saved_activations_mb"]) < 0.05 * rows[1]["saved_activations_mb"]


def test_mid_size_path_runs_in_bf16_with_lora(tmp_path):
    """The GPU throughput line's path (`--size mid --dtype bf16 --lora-rank 32`) with a shrunken transformer on
    CPU: the transformer is replaced, LoRA trains only adapters, both modes run."""
    torch.set_num_threads(1)
    dims = dict(num_layers=1, num_single_layers=1, num_attention_heads=2, attention_head_dim=32,
                axes_dims_rope=(8, 12, 12))
    model_dir = bench.build_model_dir("mid", str(tmp_path / "flux"), "cpu", dims=dims)
    out = bench._timings(model_dir, "cpu", 1, side=128, dtype=torch.bfloat16, lora_rank=4)
    assert out["per_step_ms"] > 0 and out["tsp_ms"] > 0 and out["ratio"] > 0
    assert 0 < out["trainable_params"] < out["transformer_params"]
    assert sum(1 for _ in (tmp_path / "flux" / "transformer").glob("*.safetensors")) == 1
