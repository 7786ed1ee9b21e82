"""scripts/tier_preflight.py: a tier's broken import fails the pre-flight by name (never a module-level skip), also
when it sits in a test module beside the one asked for, which imports it by name (as
test_verl_omni_flag_equals_stock_on_cpu imports test_verl_omni_entry_points); the helpers tests/conftest.py registers
(`_upstream`) are left to pytest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PREFLIGHT = Path(__file__).resolve().parents[2] / "scripts" / "tier_preflight.py"


def _preflight(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PREFLIGHT), *map(str, files)], capture_output=True, text=True,
                          timeout=120)


def _tier(tmp_path: Path, helper_imports: str) -> Path:
    (tmp_path / "test_helpers_here.py").write_text(f"from _upstream import require\n{helper_imports}\n")
    asked = tmp_path / "test_asked.py"
    asked.write_text("import json\n\ntry:\n    from test_helpers_here import require\nexcept ImportError:\n    pass\n")
    return asked


def test_a_broken_import_in_an_imported_sibling_fails_the_preflight(tmp_path):
    proc = _preflight(_tier(tmp_path, "import digenrl_no_such_module"))
    assert proc.returncode == 1, proc.stderr
    assert "cannot import digenrl_no_such_module: ModuleNotFoundError" in proc.stderr
    assert "_upstream" not in proc.stderr and "test_helpers_here" not in proc.stderr.replace(str(tmp_path), "")
    assert "2 test files import failed" in proc.stderr


def test_the_preflight_passes_when_every_import_resolves(tmp_path):
    proc = _preflight(_tier(tmp_path, "import json"))
    assert proc.returncode == 0, proc.stderr
    assert "that 2 test files import are importable" in proc.stderr
