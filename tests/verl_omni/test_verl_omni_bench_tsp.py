"""`python -m digenrl_verl.bench tsp --engine verl_omni --json` (digenrl_verl/bench/tsp_verl_omni.py).

The bench run needs verl-omni (the verl-omni tier: scripts/test_verl_omni.sh) and is checked on its JSON fields
with tiny settings, not on its timings. Without verl-omni the command must stop with a message naming the fix;
that check runs in any venv (verl-omni's absence simulated).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROW_FIELDS = {"height", "latent_tokens", "stock_ms", "tsp_ms", "ratio", "grad_max_rel_err", "stock_ms_all",
              "tsp_ms_all", "trainable_tensors", "trainable_params"}


@pytest.mark.slow
def test_bench_tsp_verl_omni_json(tmp_path):
    pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")
    cmd = [sys.executable, "-m", "digenrl_verl.bench", "tsp", "--engine", "verl_omni", "--json", "--heights", "64",
           "--repeats", "2", "--steps", "2", "--micro-batches", "1"]
    proc = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["engine"] == "verl_omni" and "PPODiffusersFSDPEngine" in out["baseline"], out
    assert out["config"]["steps"] == 2 and out["config"]["repeats"] == 2 and out["config"]["chunk_rows"] == 0, out
    [row] = out["results"]
    assert ROW_FIELDS <= set(row), row
    assert row["height"] == 64 and row["latent_tokens"] == 16, row
    assert len(row["stock_ms_all"]) == len(row["tsp_ms_all"]) == 2, row
    assert row["stock_ms"] > 0 and row["tsp_ms"] > 0 and row["ratio"] == pytest.approx(row["stock_ms"] / row["tsp_ms"])
    assert row["trainable_tensors"] > 0 and 0 <= row["grad_max_rel_err"] <= 1e-5, row  # the same update


def test_bench_tsp_verl_omni_without_verl_omni_names_the_fix(monkeypatch, capsys):
    from digenrl_verl.bench.__main__ import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "verl_omni" else real(name, *a))
    assert main(["tsp", "--engine", "verl_omni", "--json"]) == 2
    err = capsys.readouterr().err
    assert "verl-omni is not installed" in err and "scripts/verl_omni_venv.sh" in err and "VERL_OMNI_PY" in err, err
