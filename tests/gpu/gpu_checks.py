"""The GPU checks, one bounded run: `bash tests/gpu/run_gpu_checks.sh [--plan]`.

Each check is one subprocess with its own timeout (a pytest selection of test_gpu_tiny_models.py, or the TSP
bench), run one after the other under a global budget, none stopping the others. One summary line per check
(name, pass/fail/skip, seconds, key figure) and `outputs/gpu_checks.json`.

Without CUDA: prints "skipped: no CUDA" and the checks it would run, exits 0. `--plan` (or
DIGENRL_GPU_CHECKS_DRY=1) prints the exact commands and exits 0, CUDA or not.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = "tests/gpu/test_gpu_tiny_models.py"
GLOBAL_BUDGET_S = 420  # 7 min, under the 8 min asked: the per-check budgets sum to it
MIN_CHECK_S = 20  # a check that would get less than this is skipped as out of budget


@dataclass(frozen=True)
class Check:
    name: str
    budget_s: int
    what: str
    pytest_k: str | None = None  # a pytest -k selection of TESTS; None: `command` is the whole command
    command: tuple[str, ...] = ()
    min_gpus: int = 1
    needs_module: str | None = None

    def requires(self) -> list[str]:
        """What the check needs beyond one CUDA GPU (empty: nothing)."""
        return ([f"{self.min_gpus} GPUs"] if self.min_gpus > 1 else []) + ([self.needs_module] if self.needs_module
                                                                            else [])

    def argv(self, python: str, out_dir: Path) -> list[str]:
        if self.pytest_k is None:
            return [python, *self.command]
        return [python, "-m", "pytest", TESTS, "-k", self.pytest_k, "-q", "-rs", "-p", "no:cacheprovider",
                f"--junitxml={out_dir / (self.name + '.xml')}", "-o", "junit_family=xunit1"]


CHECKS = (
    Check("sde_parity", 40, "SDE step (sde, cps, dance, ode) on CUDA equals the CPU math",
          pytest_k="test_sde_step_on_cuda_matches_cpu"),
    Check("tiny_models", 100, "every tiny architecture on CUDA, fp32 and bf16: rollout, on-policy ratio, TSP backward",
          pytest_k="test_tiny_rollout_logprobs_and_tsp_backward_on_cuda"),
    Check("disaggregated_step_1gpu", 110, "one disaggregated step, generator and trainer pools at 0.5 GPU each "
          "on the one device, gloo weight sync, checksums equal", pytest_k="test_one_disaggregated_step_on_one_gpu"),
    Check("tsp_throughput_mid", 70, "TSP vs per-timestep loop: 421 M-param random-init FLUX-like transformer, bf16, "
          "LoRA r32, 1024 tokens, 8 timesteps",
          command=("-m", "digenrl_verl.bench", "tsp", "--size", "mid", "--device", "cuda", "--dtype", "bf16",
                   "--lora-rank", "32", "--repeats", "5", "--no-memory", "--json")),
    Check("nccl_sync_2gpu", 60, "NCCL weight sync between two processes on two GPUs",
          pytest_k="test_nccl_weight_sync_between_two_gpus", min_gpus=2),
    Check("fsdp2_nccl_3gpu", 120, "FSDP2 trainer pool of two ranks over NCCL against ddp (same grad norm)",
          pytest_k="test_fsdp2_trainer_over_nccl_matches_ddp", min_gpus=3),
)


def cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _module_present(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _junit(path: Path) -> dict:
    """Counts and the record_property figures of a pytest junit XML."""
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "figures": {}, "skip_reasons": []}
    if not path.exists():
        return out
    root = ET.parse(path).getroot()
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for k in ("tests", "failures", "errors", "skipped"):
            out[k] += int(suite.get(k, 0))
    for case in root.iter("testcase"):
        for prop in case.iter("property"):
            out["figures"][prop.get("name")] = prop.get("value")
        for sk in case.iter("skipped"):
            out["skip_reasons"].append(sk.get("message", ""))
    return out


def _run(argv: list[str], timeout_s: float, env: dict) -> tuple[int | None, str, float]:
    """Run in its own process group; on timeout kill the whole group (Ray workers included)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out, time.monotonic() - t0


def _figure(check: Check, rc: int | None, out: str, junit: dict) -> tuple[str, str, dict]:
    """(status, key figure text, figures) of a finished check."""
    if check.pytest_k is None:  # the bench: its last line is one JSON object
        try:
            res = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return "fail", f"no JSON result (rc {rc})", {}
        figs = {k: res[k] for k in ("per_step_ms", "tsp_ms", "ratio", "grad_max_rel_err", "transformer_params",
                                    "trainable_params") if k in res}
        text = (f"per-timestep {res['per_step_ms']:.1f} ms, TSP {res['tsp_ms']:.1f} ms per update, "
                f"ratio {res['ratio']:.2f}x, {res.get('transformer_params', 0) / 1e6:.0f} M params")
        return ("pass" if rc == 0 else "fail"), text, figs
    figs = junit["figures"]
    n, bad, skipped = junit["tests"], junit["failures"] + junit["errors"], junit["skipped"]
    if n == 0:
        return "fail", f"no test ran (pytest rc {rc})", figs
    status = "fail" if bad or rc != 0 else ("skip" if skipped == n else "pass")
    text = f"{n - bad - skipped}/{n} passed" + (f", {skipped} skipped" if skipped else "")
    if status == "skip" and junit["skip_reasons"]:
        text += f" ({junit['skip_reasons'][0][:80]})"
    if figs:
        text += "; " + ", ".join(f"{k}={v}" for k, v in figs.items())
    return status, text, figs


def _line(name: str, status: str, seconds: float, figure: str) -> str:
    return f"{name:<26} {status.upper():<5} {seconds:6.1f}s  {figure}"


def main(argv: list[str]) -> int:
    plan = "--plan" in argv or os.environ.get("DIGENRL_GPU_CHECKS_DRY", "") not in ("", "0")
    out_dir = Path(os.environ.get("DIGENRL_GPU_CHECKS_OUT", "outputs/gpu_checks"))  # relative: the repo root
    python = sys.executable
    gpus = cuda_devices()
    if plan:
        print(f"plan: {len(CHECKS)} checks, global budget {GLOBAL_BUDGET_S} s, CUDA devices here: {gpus}")
        for c in CHECKS:
            need = "".join(f" (needs {r})" for r in c.requires())
            print(f"{c.name} [{c.budget_s} s]{need}: timeout {c.budget_s} {shlex.join(c.argv(python, out_dir))}")
        return 0
    if gpus == 0:
        print("skipped: no CUDA")
        print(f"with one CUDA GPU it would run (global budget {GLOBAL_BUDGET_S} s):")
        for c in CHECKS:
            extra = "".join(f"  [skips without {r}]" for r in c.requires())
            print(f"  {c.name:<26} {c.budget_s:4d} s  {c.what}{extra}")
        return 0

    import torch

    (ROOT / out_dir).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", TORCH_COMPILE_DISABLE="1",
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg")
    device = {"name": torch.cuda.get_device_name(0), "count": gpus, "torch": torch.__version__,
              "cuda": torch.version.cuda}
    print(f"device: {device['name']} x{gpus}, torch {device['torch']}, CUDA {device['cuda']}; "
          f"budget {GLOBAL_BUDGET_S} s", flush=True)
    start = time.monotonic()
    results = []
    for c in CHECKS:
        left = GLOBAL_BUDGET_S - (time.monotonic() - start)
        row = {"name": c.name, "budget_s": c.budget_s, "what": c.what, "command": shlex.join(c.argv(python, out_dir))}
        if gpus < c.min_gpus:
            row.update(status="skip", seconds=0.0, figure=f"needs {c.min_gpus} GPUs, this machine has {gpus}")
        elif c.needs_module and not _module_present(c.needs_module):
            row.update(status="skip", seconds=0.0, figure=f"{c.needs_module} is not installed")
        elif left < MIN_CHECK_S:
            row.update(status="skip", seconds=0.0, figure=f"out of the global budget ({left:.0f} s left)")
        else:
            timeout = min(c.budget_s, left)
            rc, out, secs = _run(c.argv(python, out_dir), timeout, env)
            (ROOT / out_dir / f"{c.name}.log").write_text(out)
            if rc is None:
                row.update(status="fail", seconds=secs, figure=f"timed out after {timeout:.0f} s")
            else:
                status, text, figs = _figure(c, rc, out, _junit(ROOT / out_dir / f"{c.name}.xml"))
                row.update(status=status, seconds=secs, figure=text, figures=figs, rc=rc)
            if row["status"] == "fail":
                row["tail"] = out[-3000:]
        results.append(row)
        print(_line(c.name, row["status"], row["seconds"], row["figure"]), flush=True)
    wall = time.monotonic() - start
    summary = {"device": device, "budget_s": GLOBAL_BUDGET_S, "wall_s": wall, "checks": results,
               "passed": sum(r["status"] == "pass" for r in results),
               "failed": sum(r["status"] == "fail" for r in results),
               "skipped": sum(r["status"] == "skip" for r in results)}
    path = ROOT / "outputs" / "gpu_checks.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1))
    print(f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped in {wall:.0f} s; "
          f"{path.relative_to(ROOT)} (logs in {out_dir})")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
