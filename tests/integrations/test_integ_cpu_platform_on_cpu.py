"""verl's CPU platform shipped in this package (`digenrl_verl.platform.cpu`), through verl's own hook for external
modules (``VERL_USE_EXTERNAL_MODULES`` + ``VERL_PLATFORM``): selected in a fresh process on the installed verl 0.9.1
and on verl 8a69493 (verl-omni's, from its source archive), and in a Ray CPU worker started the way the runner starts
them (`make_worker_group(..., worker_env=process_env(cpu=True))`), without verl's "No supported accelerator detected
... Falling back to 'nvidia'" warning; GPU processes (no `cpu=True`) never select it."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import ray
from ray.util.placement_group import remove_placement_group
from verl.single_controller.base import Worker
from verl.single_controller.ray.base import RayClassWithInitArgs

from digenrl_verl.platform import CPU_PLATFORM_MODULE, QUIET_MODULE, process_env
from digenrl_verl.workers.pools import PoolSpec, make_ray_pool, make_worker_group

from _upstream import VERL_ARCHIVE, require

ROOT = Path(__file__).resolve().parents[2]
VERL_8A69493 = VERL_ARCHIVE
FALLBACK = "No supported accelerator detected"

_PROBE = """
import torch, verl
from verl.utils.device import get_device_name, get_nccl_backend, get_resource_name, get_torch_device
from verl.utils.device import is_device_available
dev = get_torch_device()
dev.empty_cache()
assert dev.current_device() == torch.device("cpu") and torch.ones(1).to(dev.current_device()).device.type == "cpu"
assert dev.is_available() and dev.get_device_name() == "cpu" and is_device_available()
print(verl.__version__, get_device_name(), get_resource_name(), get_nccl_backend())
"""


def test_process_env_keeps_the_users_modules_and_selects_cpu_only_for_cpu():
    user = {"VERL_USE_EXTERNAL_MODULES": "my_plugin, other"}
    assert process_env(cpu=True, environ=user) == {
        "VERL_USE_EXTERNAL_MODULES": f"my_plugin,other,{QUIET_MODULE},{CPU_PLATFORM_MODULE}", "VERL_PLATFORM": "cpu",
        "MKL_CBWR": "AUTO,STRICT"}
    assert process_env(cpu=True, environ={"MKL_CBWR": "AVX2"})["MKL_CBWR"] == "AVX2"  # the caller's value kept
    assert process_env(cpu=False, environ={}) == {"VERL_USE_EXTERNAL_MODULES": QUIET_MODULE}
    again = {"VERL_USE_EXTERNAL_MODULES": f"{CPU_PLATFORM_MODULE},{QUIET_MODULE}"}
    assert process_env(cpu=True, environ=again)["VERL_USE_EXTERNAL_MODULES"] == again["VERL_USE_EXTERNAL_MODULES"]


_ALIGNMENT = """
import torch
torch.manual_seed(0)
w, worst = torch.randn(64, 64), 0.0
for rows in (1, 2):
    x = torch.randn(rows, 64)
    want = x @ w.T
    for offset in range(1, 8):  # operands starting 4 * offset bytes into a buffer, as in FSDP2's all-gathered one
        moved = []
        for t in (x, w):
            buf = torch.empty(offset + t.numel())
            buf[offset:] = t.flatten()
            moved.append(buf[offset:].view(t.shape))
        worst = max(worst, float((moved[0] @ moved[1].T - want).abs().max()))
print(worst)
"""


def test_a_cpu_worker_products_do_not_depend_on_operand_alignment():
    """A CPU worker's environment makes MKL's products independent of where a weight starts in memory (unset, they
    differed by 2.9e-6 on this project's AMD EPYC build host, so a sharded trainer's sample was not a generator's)."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | process_env(cpu=True, environ={})
    out = subprocess.run([sys.executable, "-c", _ALIGNMENT], env=env, capture_output=True, text=True, check=True)
    assert float(out.stdout) == 0.0, out.stdout


_DEFERRED = """
import sys
import digenrl_verl.platform.cpu
print("verl.utils.distributed" in sys.modules)
from verl.utils import distributed
print(getattr(distributed.initialize_global_process_group_ray, "_digenrl_cpu_fix", False))
"""


def test_the_platform_wraps_verls_process_group_builder_when_verl_imports_it():
    """Loading the platform does not import `verl.utils.distributed` (the platform loads with `import verl`, in every
    process); its process-group fix (`verl_fixes.fix_cpu_process_group_backend`) is on that function as soon as the
    module is imported, before any worker module takes the name."""
    out = subprocess.run([sys.executable, "-c", _DEFERRED], capture_output=True, text=True, check=True, timeout=180)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr[-2000:]


def _probe(env: dict[str, str], pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")} | env
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow  # fresh interpreters importing verl (and unpacking verl 8a69493)
@pytest.mark.parametrize("verl_tree", ["installed", "8a69493"])
def test_cpu_platform_through_verls_external_module_hook(verl_tree, tmp_path):
    pythonpath = None
    if verl_tree == "8a69493":
        with tarfile.open(require(VERL_8A69493)) as tar:
            tar.extractall(tmp_path, filter="data")
        (pythonpath,) = {str(p.parent.parent) for p in tmp_path.glob("*/verl/__init__.py")}
    proc = _probe(process_env(cpu=True, environ={}), pythonpath)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version, *answers = proc.stdout.split()
    assert answers == ["cpu", "CPU", "gloo"]
    assert version == ("0.9.1" if verl_tree == "installed" else "0.9.0.dev")  # 8a69493's version file
    # neither verl's fallback warning nor its INFO line about our own VERL_PLATFORM choice
    assert FALLBACK not in proc.stderr and "VERL_PLATFORM" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_without_the_cpu_flag_verl_keeps_its_own_detection():
    """A GPU worker's environment (process_env(cpu=False)) loads no CPU platform: on this machine without GPUs verl
    falls back to 'nvidia' as it always did (the probe's asserts fail on CUDA's answers)."""
    proc = _probe(process_env(cpu=False, environ={}))
    assert proc.returncode != 0 and FALLBACK in proc.stderr, proc.stdout + proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("cpu", [True, False], ids=["cpu_pool", "gpu_env"])
def test_ray_cpu_worker_gets_the_cpu_platform(ray_session, cpu):
    """A verl worker group made as the runner makes a CPU pool's: its worker's verl platform is ours, and verl's
    platform resolution in that process (run again, its log records kept) neither falls back nor warns."""
    class _PlatformWorker(Worker):  # defined here: Ray ships it by value (the tests package is not importable there)
        def platform(self) -> dict:
            import logging

            from verl.plugin.platform import platform_manager
            from verl.utils.device import get_device_name, get_torch_device

            before = platform_manager._current_platform
            records: list[logging.LogRecord] = []
            handler = logging.Handler()
            handler.emit = records.append
            logging.getLogger(platform_manager.__name__).addHandler(handler)
            platform_manager._current_platform = None  # resolve it again, under this process's environment
            name = get_device_name()
            return {"before": type(before).__name__ if before is not None else None, "device": name,
                    "class": type(platform_manager._current_platform).__name__,
                    "current": str(get_torch_device().current_device()) if cpu else None,
                    "logged": [f"{r.levelname}: {r.getMessage()}" for r in records]}

    pool = make_ray_pool(PoolSpec(f"plat_{int(cpu)}_", (1,)))
    wg = make_worker_group(pool, RayClassWithInitArgs(cls=ray.remote(_PlatformWorker)), name_prefix=f"plat{int(cpu)}",
                           device_name="cpu", worker_env=process_env(cpu=cpu, environ={}))
    try:
        got = ray.get(wg.workers[0].platform.remote())
    finally:
        for w in wg.workers:
            ray.kill(w)
        for pg in pool.pgs or []:
            remove_placement_group(pg)
    if cpu:
        assert got["before"] in (None, "PlatformCPU")
        assert (got["device"], got["class"], got["current"]) == ("cpu", "PlatformCPU", "cpu")
        assert got["logged"] == [], got["logged"]
    else:  # what every CPU worker logged before this package shipped its platform
        assert got["device"] == "cuda" and any(FALLBACK in line for line in got["logged"]), got
