"""Fixtures for the verl-omni compatibility tests: tiny model directories per architecture and stand-in
reward files for the custom reward paths verl-omni's recipes name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# tests/_recipe_dry_runs.py, importable as `_recipe_dry_runs` by this folder's modules (as tests/conftest.py registers
# tests/_upstream.py; tests/ itself stays off sys.path)
_spec = importlib.util.spec_from_file_location("_recipe_dry_runs",
                                               Path(__file__).resolve().parents[1] / "_recipe_dry_runs.py")
sys.modules["_recipe_dry_runs"] = _module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

ARCHITECTURES = ("QwenImagePipeline", "StableDiffusion3Pipeline", "WanPipeline", "FluxPipeline",
                 "HunyuanVideoPipeline")

# Stand-ins for verl-omni's genrm_ocr.py / hpsv3_reward.py (those need a served VLM / the HPSv3 model): same
# file and function names, verl-omni's call signature, a plain image statistic as the score.
_STAND_IN = '''
def {name}(data_source=None, solution_image=None, ground_truth=None, extra_info=None, **kwargs):
    """Stand-in with verl-omni's reward signature: mean intensity in [0, 1]."""
    return float(solution_image.float().mean() / 255.0)
'''


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """architecture → a tiny diffusers directory (built once per session)."""
    from digenrl_verl.models.tiny import build_tiny_model_dir

    root = tmp_path_factory.mktemp("integ_models")
    return {a: str(build_tiny_model_dir(a, root / a, seed=0)) for a in ARCHITECTURES}


@pytest.fixture(scope="session")
def reward_dir(tmp_path_factory):
    from digenrl_verl.integrations.verl_omni_recipes import RECIPES

    d = tmp_path_factory.mktemp("integ_rewards")
    for recipe in RECIPES.values():
        for file, fn in recipe.reward_files.items():
            (d / file).write_text(_STAND_IN.format(name=fn))
    return str(d)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """train.parquet / test.parquet in verl's layout: chat-message prompts, data_source, reward_model.ground_truth."""
    import pandas as pd

    d = tmp_path_factory.mktemp("integ_data")
    words = ["HELLO", "RL", "DIFFUSION", "GPU", "SCHEDULE", "PIPELINE"]
    # 1024 prompts: verl-omni's dataloader drops a partial batch (an epoch needs data.train_batch_size prompts) and
    # the run length is the epochs' steps at most (the recipes' total_training_steps must fit in their epochs)
    rows = [{"prompt": [{"role": "user", "content": f'A sign that reads "{w}"'}], "data_source": "ocr",
             "reward_model": {"ground_truth": w, "style": "rule"}} for _ in range(171) for w in words][:1024]
    for name in ("train", "test"):
        pd.DataFrame(rows).to_parquet(d / f"{name}.parquet")
    return str(d)


@pytest.fixture(scope="session")
def recipe_dry_runs(request, tiny_dirs, tmp_path_factory):
    """stem -> (CompletedProcess, model dir, prompt file) of every shell recipe's dry run that the selected tests read
    (tests/_recipe_dry_runs.py), each run once per session: the golden-plan test and the recipes' dry-run test share
    them."""
    import _recipe_dry_runs

    return _recipe_dry_runs.run(_recipe_dry_runs.wanted(request.session.items), tiny_dirs, tmp_path_factory.mktemp)
