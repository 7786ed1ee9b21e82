"""Validation runs on Ray (verl-omni's trainer.test_freq / val_before_train): metrics at verl-omni's steps, logged
and summarised, and training unperturbed (the same weights as the run without validation)."""

from __future__ import annotations

import json

import pytest
import ray
import torch

from digenrl_verl.metric_names import METRICS as M

pytestmark = pytest.mark.slow  # trains on Ray workers

TINY = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "trainer.total_training_steps=4",
        "trainer.digenrl.mode=disaggregated", "trainer.digenrl.tcss.staleness=0", "trainer.digenrl.tag.policy=off",
        "actor_rollout_ref.actor.optim.lr=3e-3", "trainer.digenrl.final_eval_prompts=0",
        "reward.reward_functions={brightness: 1.0}"]  # the tiny demo's reward (as recipes/run_tiny_cpu.sh)


def _weights(trainer) -> dict[str, torch.Tensor]:
    return ray.get(trainer.workers["trn:0"].trainable_state.remote())


def test_validation_at_steps_0_2_4_does_not_perturb_training(train_run, tmp_path):
    val = tmp_path / "val.txt"
    val.write_text("a red cube on a table\na blue ball in the sky\na green cone\n")
    t = train_run(*TINY, "trainer.test_freq=2", "trainer.val_before_train=true", f"data.val_files={val}",
                  name="val")
    key = "val-core/val.txt/reward/mean@1"
    # verl-omni's steps: before training (0), after its global steps 2 and 4 (our steps 1 and 3, the last)
    assert sorted(t.validations) == [0, 2, 4]
    assert all(set(m) == {key, "val-aux/reward/nonfinite_samples"} for m in t.validations.values())
    assert all(m["val-aux/reward/nonfinite_samples"] == 0 for m in t.validations.values())
    rows = [json.loads(x) for x in (t.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if key in r] == [0, 2, 4]
    assert t.summary[key] == t.validations[4][key] and key in t.summary_text
    # deterministic: validating the same weights twice gives the same score
    prompts = val.read_text().splitlines()
    again = t.ode_rewards(prompts, ["val.txt"] * 3, [{}] * 3, sampling=t.run.validation.rollout).to(torch.float64)
    again = again.mean()
    assert float(again) == t.validations[4][key]
    plain = train_run(*TINY, name="plain")
    assert plain.validations == {}
    a, b = _weights(t), _weights(plain)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # training unperturbed, bit for bit
    assert [h[M["reward_mean"]] for h in t.reporter.history] == [h[M["reward_mean"]] for h in plain.reporter.history]
    # and validation did see training: the step-0 score (initial weights) differs from the last one
    assert t.validations[0][key] != t.validations[4][key]


def test_colocated_validation_and_checkpoints_share_the_barriers(train_run):
    # 4 steps, test_freq=3: verl-omni validates after its steps 3 and 4 (the last); save_freq=3 saves 3, and, as
    # verl, the last step 4, at a barrier that is a validation one only (the save must not be lost there)
    t = train_run("data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "trainer.total_training_steps=4",
                  "trainer.digenrl.final_eval_prompts=0", "trainer.test_freq=3", "trainer.save_freq=3",
                  "data.val_max_samples=2", name="colocated")
    assert sorted(t.validations) == [3, 4]
    assert set(t.validations[4]) == {"val-core/builtin/reward/mean@1", "val-aux/reward/nonfinite_samples"}
    saved = sorted(p.name for p in (t.output_dir / "checkpoints").iterdir() if p.name.startswith("global_step_"))
    assert saved == ["global_step_3", "global_step_4"]


def test_val_kwargs_draw_n_seeded_samples_per_prompt_on_the_trainer(train_run, tmp_path):
    """verl-omni's rollout.val_kwargs on Ray: n=3 SDE samples (noise 0.7, 4 steps, seed 5) per validation prompt,
    reported as mean@3 / std@3 / best@k / worst@k; the same weights and seed give the same samples, another seed
    others, and a prompt's samples differ from each other (each has its own noise)."""
    from dataclasses import replace

    val = tmp_path / "val.txt"
    val.write_text("a red cube on a table\na blue ball in the sky\n")
    v = "actor_rollout_ref.rollout.val_kwargs"
    t = train_run(*[o for o in TINY if not o.startswith("trainer.total_training_steps")],
                  "trainer.total_training_steps=1", "trainer.val_before_train=true", "trainer.test_freq=1",
                  f"data.val_files={val}",
                  f"{v}.n=3", f"{v}.algo.noise_level=0.7", f"{v}.pipeline.num_inference_steps=4", f"+{v}.seed=5",
                  name="val_kwargs")
    sampling = t.run.validation.rollout
    assert (t.run.validation.n, sampling.num_inference_steps, sampling.noise_level, sampling.seed) == (3, 4, 0.7, 5)
    assert sorted(t.validations) == [0, 1]
    m = t.validations[0]
    assert {k for k in m if k.startswith("val-core/")} == {f"val-core/val.txt/reward/{k}" for k in
                                                          ("mean@3", "best@3/mean", "best@3/std")}
    assert "val-aux/val.txt/reward/std@3" in m and m["val-aux/reward/nonfinite_samples"] == 0
    prompts = val.read_text().splitlines()
    first = t.ode_rewards(prompts, ["val.txt"] * 2, [{}] * 2, n=3, sampling=sampling).to(torch.float64)
    again = t.ode_rewards(prompts, ["val.txt"] * 2, [{}] * 2, n=3, sampling=sampling).to(torch.float64)
    other = t.ode_rewards(prompts, ["val.txt"] * 2, [{}] * 2, n=3, sampling=replace(sampling, seed=6))
    assert torch.equal(first, again) and not torch.equal(first, other.to(torch.float64))
    assert float(first.mean()) == pytest.approx(t.validations[1]["val-core/val.txt/reward/mean@3"], rel=1e-12)
    per_prompt = first.view(2, 3)
    assert all(len(set(row.tolist())) == 3 for row in per_prompt)  # three different samples of each prompt
