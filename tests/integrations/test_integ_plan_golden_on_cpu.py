"""The resolved plan (what `trainer.digenrl.dry_run=true` prints) of every recipe in recipes/ and of the three
transcribed verl-omni recipes, checked against a golden file per recipe.

The golden files were written before the typed-config refactor; a change of a plan is a change of behaviour and
must be made on purpose:
`DIGENRL_UPDATE_GOLDEN=1 bash scripts/test.sh tests/integrations/test_integ_plan_golden_on_cpu.py`
rewrites them, and the diff goes into review.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import pytest
from _recipe_dry_runs import SHELL_RECIPES  # shell recipe -> the architecture of its tiny model

from digenrl_verl.integrations.verl_omni_recipes import DIGENRL_FLAG, RECIPES
from digenrl_verl.main import compose
from digenrl_verl.trainer.config import build_run

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden_plans"
UPDATE = os.environ.get("DIGENRL_UPDATE_GOLDEN") == "1"
DRY_RUN_END = "dry run: config valid, no worker started"


#: a seed drawn for a key left null (verl-omni's default): different in every run
_DRAWN = re.compile(r"this run uses \d+ \(set (\S+)=\d+ to repeat it\)")
#: the verl-omni script whose plan.json is kept as a golden file too
PLAN_JSON_RECIPE = "qwen_image_flowgrpo_lora"


def _normalise(text: str, **paths: str) -> str:
    for name, path in paths.items():
        text = text.replace(path, f"<{name.upper()}>")
    return _DRAWN.sub(r"this run uses <DRAWN> (set \1=<DRAWN> to repeat it)", text).strip() + "\n"


def _normalise_plan(plan: dict, spec, **paths: str) -> str:
    """plan.json as text, with paths and drawn seeds replaced (`_normalise`)."""
    config = plan["config"]
    for key in ("data.seed", "actor_rollout_ref.rollout.seed"):
        if any(d.startswith(f"{key}=None") for d in spec.decisions):
            config[key] = "<DRAWN>"
    return _normalise(json.dumps(plan, indent=1, sort_keys=True), **paths)


def _check(name: str, plan: str, suffix: str = ".txt") -> None:
    golden = GOLDEN / f"{name}{suffix}"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(plan)
    assert golden.is_file(), f"no golden plan for {name}: run with DIGENRL_UPDATE_GOLDEN=1 and review the file"
    assert plan == golden.read_text(), f"the resolved plan of {name} changed (golden: {golden})"


def test_every_recipe_has_a_golden_plan():
    shell = {p.stem for p in (ROOT / "recipes").glob("run_*.sh")}
    assert shell == set(SHELL_RECIPES), "a recipe was added or removed: list it in SHELL_RECIPES"


@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(SHELL_RECIPES))
def test_shell_recipe_plan_matches_golden(stem, recipe_dry_runs):
    p, model, prompts = recipe_dry_runs[stem]  # `bash recipes/<stem>.sh` with DRY_RUN=1, run once per session
    assert p.returncode == 0, p.stderr[-2000:]
    assert DRY_RUN_END in p.stdout
    _check(stem, _normalise(p.stdout, model=model, train_files=prompts))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_verl_omni_recipe_plan_matches_golden(name, tiny_dirs, reward_dir, data_dir):
    recipe = RECIPES[name]
    model = tiny_dirs[recipe.architecture]
    cfg = compose(recipe.render(model, reward_dir, data_dir, switch_off=True, extra=[DIGENRL_FLAG]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        spec = build_run(cfg)
    paths = dict(model=model, reward_dir=reward_dir, data_dir=data_dir)
    _check(f"verl_omni_{name}", _normalise(spec.describe(), **paths))
    if name == PLAN_JSON_RECIPE:  # the machine-readable plan (plan.json) of one verl-omni script
        _check(f"verl_omni_{name}", _normalise_plan(spec.plan(), spec, **paths), suffix=".plan.json")
