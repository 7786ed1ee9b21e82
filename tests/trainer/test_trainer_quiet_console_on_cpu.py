"""The CPU demo's console (recipes/run_tiny_cpu.sh: `python -m digenrl_verl.main +preset=tiny_cpu ...`, here 2 steps)
carries none of the notices its user cannot act on, and nothing arrives after the closing summary table (issue 21
part 5b): verl's platform fallback (the CPU platform, `digenrl_verl.platform.cpu`), transformers' torchvision notice
and diffusers' / transformers' loading bars in the workers (`digenrl_verl.platform.quiet`,
HF_HUB_DISABLE_PROGRESS_BARS), Ray's token-authentication notice (`ray_runtime.RAY_TOKEN_NOTICE`) and Ray's late,
deduplicated worker lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a whole run in a subprocess: its own Ray instance and two worker processes

ROOT = Path(__file__).resolve().parents[2]

NOISE = {
    "verl's platform fallback": r"No supported accelerator detected|Falling back to 'nvidia'",
    "verl's CPU-only actor warning": r"is registered but not available",
    "verl's device mismatch": r"does not match current platform device",
    "verl's platform override": r"Platform override from VERL_PLATFORM",
    "transformers' torchvision notice": r"requires torchvision \(not installed\)",
    "diffusers' loading bar": r"Loading pipeline components",
    "transformers' loading bar": r"Loading weights",
    "Ray's token notice": r"Token authentication is (enabled|disabled)",
    "Ray's usage-stats notice": r"[Uu]sage stats collection",
    "Ray's deduplicated lines": r"repeated \d+x across cluster|Ray deduplicates logs",
}


def noise_lines(console: str) -> dict[str, list[str]]:
    """What of `console` matches each kind of `NOISE`."""
    lines = console.splitlines()
    return {kind: hits for kind, pattern in NOISE.items() if (hits := [s for s in lines if re.search(pattern, s)])}


def after_summary(console: str) -> list[str]:
    """The non-blank lines after the summary's last table (its workers table ends with a '└' border line)."""
    lines = console.splitlines()
    ends = [i for i, s in enumerate(lines) if s.lstrip().startswith("└")]
    assert ends, "no summary table in the output:\n" + console[-3000:]
    return [s for s in lines[ends[-1] + 1:] if s.strip()]


def test_demo_console_has_no_noise_and_nothing_after_the_summary(tiny_flux_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VERL_"))}
    env.update(HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", TORCH_COMPILE_DISABLE="1", MPLBACKEND="Agg")
    cmd = [sys.executable, "-m", "digenrl_verl.main", "+preset=tiny_cpu",
           f"actor_rollout_ref.model.path={tiny_flux_dir}", "trainer.total_training_steps=2",
           "trainer.digenrl.mode=disaggregated", "trainer.logger=[console]",
           f"trainer.digenrl.output_dir={tmp_path / 'run'}", "trainer.digenrl.pools.generator.workers_per_node=1",
           "trainer.digenrl.pools.trainer.workers_per_node=1"]
    # one pipe for both streams, as on a console: the order of what arrives is kept
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=420)
    console = proc.stdout
    assert proc.returncode == 0, console[-5000:]
    assert "run summary" in console
    assert noise_lines(console) == {}, console[-5000:]
    assert after_summary(console) == [], console[-5000:]
    assert not re.search(r"\((GeneratorWorker|TrainerWorker) pid=", console), console[-5000:]


def test_the_noise_patterns_match_the_lines_they_name():
    """The patterns find the lines the demo printed before (issue 21 part 5b), and the late-line check sees a worker
    line after the table."""
    before = """\
2026-12-02 05:02:44,193\tWARNING authentication_token_setup.py:85 -- Token authentication is enabled for this
WARNING:2026-12-02 05:02:52,180:No supported accelerator detected. Registered: ('nvidia',). Falling back to 'nvidia'.
(TrainerWorker pid=9798) [transformers] `CLIPImageProcessor` requires torchvision (not installed); falling back
(TrainerWorker pid=9798) Loading pipeline components...:   0%|          | 0/7 [00:00<?, ?it/s]
                       workers
└────────┴────────┘

(GeneratorWorker pid=9797) Loading weights: 100%| 19/19 [repeated 2x across cluster]
"""
    assert set(noise_lines(before)) == {"verl's platform fallback", "transformers' torchvision notice",
                                        "diffusers' loading bar", "transformers' loading bar", "Ray's token notice",
                                        "Ray's deduplicated lines"}
    assert after_summary(before) == ["(GeneratorWorker pid=9797) Loading weights: 100%| 19/19 [repeated 2x across "
                                     "cluster]"]
