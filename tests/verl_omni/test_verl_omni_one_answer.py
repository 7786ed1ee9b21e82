"""One script, one answer, whichever entry point: a verl-omni script that trains on verl-omni's actor worker through
v0 `main_diffusion` (trainer.trainer_class=digenrl) is accepted the same way by `python -m
digenrl_verl.integrations.verl_omni ... trainer.use_v1=true trainer.v1.trainer_mode=digenrl` (issue 33: the Ulysses
SP-2 Qwen-Image script was refused there, "not supported by digenrl_verl", because that path checked the config
without verl-omni's composed actor config). Both as dry runs: the exit status and plan.json's trainer engine and
host keys must agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if __name__ != "__main__":
    pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")

from digenrl_verl.integrations.verl_omni_recipes import RECIPES  # noqa: E402

A = "actor_rollout_ref"
SP2 = (f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=2",)  # run_qwen_image_ocr_lora_sp2.sh's difference
ENTRIES = {"v0": ("verl_omni.trainer.main_diffusion", ("trainer.trainer_class=digenrl", "trainer.digenrl")),
           "v1": ("digenrl_verl.integrations.verl_omni",
                  ("trainer.use_v1=true", "trainer.v1.trainer_mode=digenrl", "+trainer.digenrl"))}


def _inputs(tmp_path: Path) -> Path:
    import pandas as pd

    from digenrl_verl.models.tiny import build_tiny_model_dir

    recipe = RECIPES["qwen_image_flowgrpo_lora"]
    for file, fn in recipe.reward_files.items():
        (tmp_path / file).write_text(f"def {fn}(**kwargs):\n    return 0.0\n")
    rows = [{"prompt": [{"role": "user", "content": f'A sign that reads "{w}"'}], "data_source": "ocr",
             "reward_model": {"ground_truth": w, "style": "rule"}} for w in ("HELLO", "RL", "GPU", "PIPELINE")]
    for split in ("train", "test"):
        pd.DataFrame(rows).to_parquet(tmp_path / f"{split}.parquet")
    return build_tiny_model_dir(recipe.architecture, tmp_path / "model", seed=0)


def _dry_run(entry: str, model: Path, tmp_path: Path) -> tuple[int, dict, str]:
    module, (*select, section) = ENTRIES[entry][0], ENTRIES[entry][1]
    recipe, out = RECIPES["qwen_image_flowgrpo_lora"], tmp_path / entry
    argv = recipe.render(str(model), str(tmp_path), str(tmp_path), switch_off=True, extra=[
        *recipe.tiny, *SP2, "trainer.device=cpu", "trainer.n_gpus_per_node=3", f"{A}.actor.strategy=fsdp2",
        f"{A}.model.attn_backend=native", *select, f"{section}.dry_run=true", f"{section}.output_dir={out}"])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VERL_PLATFORM": "cpu", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, "-m", module, *argv, f"hydra.run.dir={tmp_path / 'hydra' / entry}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else {}
    return proc.returncode, plan, (proc.stdout + proc.stderr)[-4000:]


@pytest.mark.slow
def test_the_sp2_script_gets_one_answer_on_both_entry_points(tmp_path):
    model = _inputs(tmp_path)
    (v0, plan0, log0), (v1, plan1, log1) = (_dry_run(e, model, tmp_path) for e in ("v0", "v1"))
    assert v0 == 0 and plan0.get("trainer_engine") == "verl_omni", log0  # trains on verl-omni's worker there
    assert v1 == v0 and plan1.get("trainer_engine") == plan0["trainer_engine"], log1
    key = f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size"
    for name in (key, f"{A}.actor.fsdp_config.param_offload", f"{A}.actor.fsdp_config.optimizer_offload"):
        assert plan1["config"].get(name) == plan0["config"].get(name) is not None, name
    assert plan1["config"][key] == 2
