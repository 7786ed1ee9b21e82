"""What can be checked of the GPU checks without a GPU: the script's no-CUDA output and exit code, its plan
(every pytest selection names a real test of tests/gpu), its result parsing, and the one-GPU pool sharing."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl_verl.workers.pools import PoolSpec, make_ray_pool

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "tests/gpu/run_gpu_checks.sh"


def _checks_module():
    spec = importlib.util.spec_from_file_location("gpu_checks", ROOT / "tests/gpu/gpu_checks.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_checks"] = mod  # dataclasses resolve their module's annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def _run(*args, **env):
    full = dict(os.environ, CUDA_VISIBLE_DEVICES="", VENV_PY=sys.executable, **env)  # no CUDA even on a GPU host
    return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # runs the script in a subprocess
def test_without_cuda_the_script_skips_cleanly_and_lists_its_checks():
    gc = _checks_module()
    res = _run()
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "skipped: no CUDA" in lines
    for c in gc.CHECKS:
        assert any(line.split()[:2] == [c.name, str(c.budget_s)] for line in lines), (c.name, res.stdout)
    assert not (ROOT / "outputs" / "gpu_checks.json").exists() or "gpu_checks.json" not in res.stdout


def test_budgets_fit_the_8_minute_window():
    gc = _checks_module()
    one_gpu = [c for c in gc.CHECKS if c.min_gpus == 1]
    assert sum(c.budget_s for c in one_gpu) <= gc.GLOBAL_BUDGET_S <= 450  # well below 8 min with start-up
    assert {c.name for c in gc.CHECKS} >= {"sde_parity", "tiny_models", "disaggregated_step_1gpu",
                                           "tsp_throughput_mid", "nccl_sync_2gpu"}


@pytest.mark.slow  # runs the script in a subprocess
@pytest.mark.parametrize("how", ["flag", "env"])
def test_plan_prints_the_exact_commands(how):
    gc = _checks_module()
    res = _run("--plan") if how == "flag" else _run(DIGENRL_GPU_CHECKS_DRY="1")
    assert res.returncode == 0, res.stderr
    for c in gc.CHECKS:
        line = next(line for line in res.stdout.splitlines() if line.startswith(c.name + " "))
        assert f"timeout {c.budget_s} " in line
        if c.pytest_k:
            assert f"-k {c.pytest_k} " in line and "--junitxml=outputs/gpu_checks/" in line
        else:
            assert "digenrl_verl.bench tsp --size mid --device cuda --dtype bf16" in line


@pytest.mark.slow
def test_every_pytest_selection_names_a_real_gpu_test():
    gc = _checks_module()
    res = subprocess.run([sys.executable, "-m", "pytest", gc.TESTS, "--collect-only", "-q"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    names = {line.split("::")[1].split("[")[0] for line in res.stdout.splitlines() if "::" in line}
    for c in gc.CHECKS:
        if c.pytest_k:  # a plain name: pytest -k matches it as a substring of the test ids
            assert c.pytest_k in names, (c.name, sorted(names))


@pytest.mark.slow
def test_bench_command_is_accepted_by_the_bench_parser():
    gc = _checks_module()
    bench = next(c for c in gc.CHECKS if c.pytest_k is None)
    res = subprocess.run([sys.executable, *bench.command, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "--size" in res.stdout, res.stderr


def test_result_parsing(tmp_path):
    gc = _checks_module()
    xml = tmp_path / "x.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="1">'
                   '<testcase name="a"><properties><property name="step_s" value="12.5"/></properties></testcase>'
                   '<testcase name="b"/><testcase name="c"><skipped message="needs two GPUs"/></testcase>'
                   '</testsuite></testsuites>')
    check = next(c for c in gc.CHECKS if c.name == "disaggregated_step_1gpu")
    status, text, figs = gc._figure(check, 0, "", gc._junit(xml))
    assert status == "pass" and text.startswith("2/3 passed, 1 skipped") and figs == {"step_s": "12.5"}
    assert gc._figure(check, 1, "", gc._junit(xml))[0] == "fail"
    assert gc._figure(check, 5, "", gc._junit(tmp_path / "missing.xml"))[0] == "fail"
    bench = next(c for c in gc.CHECKS if c.pytest_k is None)
    out = "noise\n" + json.dumps({"per_step_ms": 80.0, "tsp_ms": 40.0, "ratio": 2.0, "grad_max_rel_err": 1e-3,
                                  "transformer_params": 421_000_000})
    status, text, _ = gc._figure(bench, 0, out, {})
    assert status == "pass" and "ratio 2.00x" in text and "421 M params" in text
    assert gc._figure(bench, None, "Traceback", {})[0] == "fail"


def test_pools_share_one_gpu_with_gpu_fraction():
    spec = PoolSpec("generator_pool", (1,), use_gpu=True, gpu_fraction=0.5)
    assert spec.bundle() == {"CPU": 1, "GPU": 0.5}
    pool = make_ray_pool(spec)
    assert pool.max_colocate_count == 2  # verl: num_gpus per worker = 1 / max_colocate_count = 0.5
    assert make_ray_pool(PoolSpec("t", (2,), use_gpu=True)).max_colocate_count == 1
    assert PoolSpec("c", (1,)).bundle() == {"CPU": 1}
    for bad in (0.0, 0.3, 1.5):
        with pytest.raises(ValueError, match="gpu_fraction"):
            PoolSpec("g", (1,), use_gpu=True, gpu_fraction=bad)
