"""verl-omni's 29 FlowGRPO / DanceGRPO example scripts (a1139baf), replayed through our entry point with the one flag
and a dry run (scripts/replay_verl_omni_recipes.py): each is accepted or rejected by a message naming the key or
model; none fails in Hydra (no `+` advice) or with a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

from _upstream import VERL_OMNI_ARCHIVE, require  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = VERL_OMNI_ARCHIVE


@pytest.mark.slow
def test_every_example_script_is_accepted_or_rejected_by_name(tmp_path):
    require(ARCHIVE)
    out = tmp_path / "replay.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "replay_verl_omni_recipes.py"), "--json", str(out)],
                          capture_output=True, text=True, timeout=1800)
    print(proc.stdout)
    rows = json.loads(out.read_text())
    assert len(rows) == 29
    bad = [(r["script"], r["result"], r["detail"]) for r in rows if r["result"] not in ("accepted", "rejected")]
    assert not bad, bad
    assert proc.returncode == 0
    # "accepted" means "trains what verl-omni would": the plan's values are verl-omni's composed config's for every
    # key both have, but the keys the plugin cannot follow (NOT_VERL_OMNI_DEFAULTS, each printed in the plan)
    from digenrl_verl.config.verl_omni import NOT_VERL_OMNI_DEFAULTS

    accepted = [r for r in rows if r["result"] == "accepted"]
    assert accepted
    differ = {r["script"]: d for r in accepted for d in r["differs"].split("; ") if d
              and d.split(":")[0] not in NOT_VERL_OMNI_DEFAULTS}
    assert not differ, differ
    for r in rows:
        assert "use +" not in r["detail"] and "To append" not in r["detail"]
        if r["result"] == "rejected":  # the message starts with the key it rejects (`key=value ...`, `key: ...`), as
            # in test_verl_omni_entry_points
            assert re.match(r"[a-z_]+(\.\w+)*=|[a-z_]+(\.\w+)+[ :]", r["detail"]), r
