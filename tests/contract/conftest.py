"""The contract tier: the package's `vllm` judge backend against the real vLLM (CPU-importable parts).

Runs in `.venv-contract` (scripts/contract_venv.sh; `bash scripts/test_contract.sh`). Every test module starts with
`pytest.importorskip("vllm")`, so the main suite (`.venv`, no vLLM) collects them and reports them as skipped.
Nothing here imports vLLM at module level.
"""
