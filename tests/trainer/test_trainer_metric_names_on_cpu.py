"""Step metric names (issue 21): verl-omni's name for each quantity both compute, ours under `digenrl/` otherwise.

Read from the real verl-omni a1139baf (its source archive in ../shared/upstream/; skipped without it): its data,
timing and throughput metric functions (`diffusion_metric_utils.py`, needing only numpy, torch and verl's
DataProto) run on the batch our functions see, and must give the same names and values; the `actor/*` and
`training/*` names are the string literals of its losses, engine worker and trainers (verl's for `actor/pg_loss`).
The same comparison against an installed verl-omni (its advantage estimator included):
tests/verl_omni/test_verl_omni_metric_names.py. A short real run's metrics.jsonl uses these names only.
"""

from __future__ import annotations

import ast
import json
import math
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from digenrl_verl.diffusion.advantages import AdvantageConfig, normalize_rewards
from digenrl_verl.metric_names import DIGENRL, METRICS, VERL_OMNI
from digenrl_verl.trainer.reporting import data_metrics, perf_metrics, staleness_metrics

from _upstream import VERL_OMNI_ARCHIVE, VERL_ARCHIVE, require

ROOT = Path(__file__).resolve().parents[2]
OMNI_ARCHIVE = VERL_OMNI_ARCHIVE
M = METRICS
# 3 prompt groups of 2 (one of equal rewards), one NaN reward (left out, counted), 2 trained steps per sample
REWARDS = {0: 0.2, 1: 0.6, 2: 0.5, 3: 0.5, 4: 0.1, 5: 0.9, 6: float("nan")}
UIDS = ["a", "a", "b", "b", "c", "c", "c"]
STEPS = 2
ADV = AdvantageConfig(adv_clip_max=0.5)  # a clamp the logged advantages are not under (verl-omni clamps in the loss)


def _sources(archive: Path, suffixes: tuple[str, ...]) -> dict[str, str]:
    with tarfile.open(require(archive)) as tar:
        found = {m.name: m for m in tar.getmembers() if m.name.endswith(suffixes)}
        assert len(found) == len(suffixes), (suffixes, sorted(found))
        return {name: tar.extractfile(m).read().decode() for name, m in found.items()}


def _verl_omni_metric_utils() -> types.ModuleType:
    (src,) = _sources(OMNI_ARCHIVE, ("verl_omni/trainer/diffusion/diffusion_metric_utils.py",)).values()
    module = types.ModuleType("verl_omni_diffusion_metric_utils")
    exec(compile(src, "diffusion_metric_utils.py", "exec"), module.__dict__)
    return module


def _batch():
    """The DataProto verl-omni computes its metrics from: the finite samples' rewards and (unclamped) advantages,
    expanded over the trained steps as verl-omni's trainer does, and their uids."""
    from verl import DataProto

    ids = [i for i in sorted(REWARDS) if math.isfinite(REWARDS[i])]
    r = torch.tensor([REWARDS[i] for i in ids], dtype=torch.float64)
    adv = normalize_rewards(r, [UIDS[i] for i in ids], AdvantageConfig(adv_clip_max=None)).advantages.double()
    tensors = {"sample_level_rewards": r[:, None].expand(-1, STEPS), "advantages": adv[:, None].expand(-1, STEPS),
               "returns": adv[:, None].expand(-1, STEPS)}
    return DataProto.from_dict(tensors, non_tensors={"uid": np.array([UIDS[i] for i in ids], dtype=object)})


def _compare(ours: dict, theirs: dict, names: list[str]) -> None:
    for q, name in ((q, VERL_OMNI[q]) for q in VERL_OMNI if VERL_OMNI[q] in names):
        print(f"{q:24s} ours {name:48s} verl-omni {name if name in theirs else '(none)'}")
        assert name in theirs and name in ours, (q, name, sorted(theirs))
        # verl-omni's group statistics are float32
        assert ours[name] == pytest.approx(theirs[name], rel=1e-6, abs=1e-9), (name, ours[name], theirs[name])


def test_the_table_splits_verl_omnis_names_from_ours():
    assert not set(VERL_OMNI) & set(DIGENRL) and len(set(METRICS.values())) == len(METRICS)
    assert all(name.startswith("digenrl/") for name in DIGENRL.values())
    assert not any(name.startswith("digenrl/") for name in VERL_OMNI.values())


def test_data_metrics_have_verl_omnis_names_and_values():
    vo = _verl_omni_metric_utils()
    theirs = vo.compute_data_metrics_diffusion(_batch())
    ours = data_metrics(REWARDS, UIDS, ADV)
    _compare(ours, theirs, list(theirs))
    # every data metric verl-omni computes, we compute; the rest of ours is under digenrl/
    assert set(theirs) == {n for n in ours if not n.startswith("digenrl/")}
    assert ours[M["reward_nonfinite"]] == 1 and ours[M["reward_zero_std_ratio"]] == pytest.approx(1 / 3)
    assert ours[M["advantage_max"]] > ADV.adv_clip_max  # before the loss's clamp, as verl-omni logs them


def test_timing_and_throughput_have_verl_omnis_names_and_values():
    vo = _verl_omni_metric_utils()
    batch, timing = _batch(), {"step": 2.5}
    theirs = {**vo.compute_timing_metrics_diffusion(timing, num_images=len(batch)),
              **vo.compute_throughput_metrics_diffusion(batch, timing, n_gpus=3)}
    ours = perf_metrics(step=4, samples=len(batch), step_s=2.5, devices=3)
    _compare(ours, theirs, [n for n in ours if n != M["global_step"]])
    assert ours[M["global_step"]] == 5  # verl counts global steps from 1


def _literals(sources: dict[str, str]) -> set[str]:
    """String constants of the sources, plus `actor/<key>` for the keys verl-omni's engine worker and loss put in
    the metric dicts its trainer renames with the `actor/` prefix (`rename_dict(actor_output, "actor/")`)."""
    out: set[str] = set()
    for src in sources.values():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.add(node.value)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.value, ast.Name) \
                    and node.value.id in ("final_metrics", "metrics"):
                out.add(f"actor/{node.slice.value}")
    return out


def test_actor_and_training_names_are_verl_omnis():
    omni = _sources(OMNI_ARCHIVE, ("verl_omni/trainer/diffusion/diffusion_algos.py",
                                   "verl_omni/workers/utils/losses.py", "verl_omni/workers/engine_workers.py",
                                   "verl_omni/trainer/diffusion/v1/trainer_base.py",
                                   "verl_omni/trainer/diffusion/ray_diffusion_trainer.py"))
    assert all('rename_dict(actor_output, "actor/")' in src for name, src in omni.items() if "trainer" in name
               and "diffusion_algos" not in name)
    names = _literals(omni)
    verl = _literals(_sources(VERL_ARCHIVE, ("verl/workers/utils/losses.py",)))
    for q in (q for q, n in VERL_OMNI.items() if n.startswith(("actor/", "training/"))):
        where = "verl-omni" if VERL_OMNI[q] in names else "verl" if VERL_OMNI[q] in verl else None
        print(f"{q:24s} ours {VERL_OMNI[q]:48s} in {where}")
        assert where == "verl-omni" or (q, where) == ("pg_loss", "verl"), (q, VERL_OMNI[q])


def test_staleness_is_the_trainers_version_minus_the_samples():
    got = staleness_metrics({3: 2, 2: 6}, version=3)  # 2 fresh samples, 6 one version behind
    assert got == {M["staleness_mean"]: 0.75, M["staleness_max"]: 1.0, M["staleness_min"]: 0.0}
    assert staleness_metrics({}, version=3) == {}


def test_the_docs_table_names_every_metric():
    text = (ROOT / "docs" / "verl_omni.md").read_text()
    section = text[text.index("## Metric names"):]
    section = section[:section.find("\n## ", 3)] if "\n## " in section[3:] else section
    missing = [name for name in METRICS.values() if f"`{name}`" not in section]
    assert not missing, missing


@pytest.mark.slow
def test_a_short_runs_metrics_file_uses_the_new_names(train_run):
    t = train_run("data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=1",
                  "trainer.digenrl.final_eval_prompts=0", name="names")
    rows = [json.loads(line) for line in (t.output_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "summary" not in r]
    assert len(steps) == 1
    (row,) = steps
    logged = set(row) - {"step"}
    assert logged <= set(METRICS.values()), sorted(logged - set(METRICS.values()))
    assert set(METRICS.values()) - logged == {M["kl_coef"]}  # everything else, kl_coef only with a KL loss
    assert row[M["num_images"]] == 4 and row[M["global_step"]] == row["step"] + 1
    assert row[M["throughput"]] == pytest.approx(4 / (row[M["step_s"]] * t.devices()))
    assert row[M["return_mean"]] == row[M["advantage_mean"]] and row[M["staleness_max"]] == 0
    assert t.summary["reward_last"] == row[M["reward_mean"]]
