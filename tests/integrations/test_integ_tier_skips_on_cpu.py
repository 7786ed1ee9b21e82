"""tests/conftest.py: a skip is a failure unless its reason is declared for the run (DECLARED_SKIPS), in a tier and in
the main suite alike; at collection (a module-level skip, the way a broken import used to hide a whole module) and in
a test. Each case runs pytest in a fresh process on a copy of the project's conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

MODULE_SKIP = '''
import pytest
try:
    import a_module_that_does_not_exist  # noqa: F401
except ImportError as e:
    pytest.skip(f"{reason} ({{e}})", allow_module_level=True)


def test_never_runs():
    pass
'''
TEST_SKIP = '''
import pytest


def test_skips():
    pytest.skip("{reason}")


@pytest.mark.xfail(reason="an expected failure is not a skip", strict=True)
def test_xfails():
    raise AssertionError
'''


def _run(tmp_path: Path, body: str, reason: str, tier: str | None) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "_upstream.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_case.py").write_text(body.format(reason=reason))
    (tmp_path / "test_other.py").write_text("def test_passes():\n    pass\n")  # a run of skips alone exits 5
    env = {k: v for k, v in os.environ.items() if k != "DIGENRL_TIER"}
    if tier is not None:
        env["DIGENRL_TIER"] = tier
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # pytest in fresh processes
@pytest.mark.parametrize("body", [MODULE_SKIP, TEST_SKIP], ids=["module-level", "in-a-test"])
@pytest.mark.parametrize("tier", ["verl_omni", "contract", None])
def test_an_undeclared_skip_fails_the_run(tmp_path, body, tier):
    proc = _run(tmp_path, body, "some module is not importable here", tier)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "undeclared skip" in out and "DECLARED_SKIPS" in out, out


@pytest.mark.slow
def test_a_declared_skip_passes_and_is_listed(tmp_path):
    # the main suite declares the tiers' own modules (they skip themselves without verl-omni); the tier does not
    proc = _run(tmp_path, MODULE_SKIP, "verl_omni is not importable here; run bash scripts/test_verl_omni.sh", None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SKIPPED" in proc.stdout and "verl_omni is not importable here" in proc.stdout, proc.stdout
    proc = _run(tmp_path, MODULE_SKIP, "verl_omni is not importable here; run bash scripts/test_verl_omni.sh",
                "verl_omni")
    assert proc.returncode != 0 and "undeclared skip in the 'verl_omni' run" in proc.stdout, proc.stdout
    proc = _run(tmp_path, TEST_SKIP, "needs a CUDA GPU", "verl_omni")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped, 1 xfailed" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_a_run_without_a_declared_list_fails_every_skip(tmp_path):
    proc = _run(tmp_path, TEST_SKIP, "needs a CUDA GPU", "a_tier_nobody_declared")
    assert proc.returncode != 0 and "is not a run in tests/conftest.py DECLARED_SKIPS" in proc.stdout, proc.stdout
