"""The vLLM pins, spelled alike everywhere: the `[vllm]` extra (the `vllm` judge backend), the contract tier's venv,
and the docs. One vLLM-Omni: verl-omni's (its venv's pin), since the package's own vLLM-Omni engine was retired
(issue 29): no vllm-omni in the extra or in the contract venv."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from digenrl_verl.engines import base

ROOT = Path(__file__).parents[2]


def test_the_vllm_pins_are_spelled_alike_in_the_extra_the_contract_venv_and_the_docs():
    setup = ast.parse((ROOT / "setup.py").read_text())
    extras = next(ast.literal_eval(node.value) for node in ast.walk(setup) if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "EXTRAS" for t in node.targets))
    assert extras["vllm"] == [f"vllm=={base.VLLM_PIN}"]
    contract = (ROOT / "scripts" / "contract_venv.sh").read_text()
    assert f'VLLM_VERSION="${{DIGENRL_CONTRACT_VLLM:-{base.VLLM_PIN}}}"' in contract
    assert "vllm-omni==" not in contract
    tier = (ROOT / "scripts" / "verl_omni_venv.sh").read_text()
    assert f'"vllm-omni=={base.VERL_OMNI_VLLM_OMNI_PIN}"' in tier
    known = {("vllm", base.VLLM_PIN), ("vllm", base.VERL_OMNI_VLLM_PIN), ("vllm-omni", base.VERL_OMNI_VLLM_OMNI_PIN)}
    mention = re.compile(r"\b(vllm(?:-omni)?)(?:==| )(\d+\.\d+\.\d+\w*)", re.IGNORECASE)
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = {(doc.name, name.lower(), version) for doc in docs for name, version in mention.findall(doc.read_text())}
    assert found and not {f for f in found if f[1:] not in known}, found
