"""verl-omni's learning-rate schedule: verl's constant / cosine schedules with warm-up (verl.utils.torch_functional),
sized by the run's global steps and stepped once per global step, as verl-omni's actor steps its scheduler after a
global step's last mini-batch."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run
from digenrl_verl.workers.roles import lr_schedule
from digenrl_verl.workers.specs import OptimSpec

OPT = "actor_rollout_ref.actor.optim"


def _factors(optim: OptimSpec, steps: int) -> list[float]:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    factor = lr_schedule(opt, optim)
    return [factor(k) for k in range(steps)]


def test_constant_with_warm_up_and_cosine_follow_verls_rules():
    assert _factors(OptimSpec(lr_warmup_steps=2, total_steps=4), 4) == [0.0, 0.5, 1.0, 1.0]
    assert _factors(OptimSpec(lr_warmup_steps_ratio=0.5, total_steps=4), 4) == [0.0, 0.5, 1.0, 1.0]  # int(0.5 x 4)
    assert _factors(OptimSpec(), 3) == [1.0, 1.0, 1.0]  # verl-omni's default: constant, no warm-up
    cos = _factors(OptimSpec(lr_scheduler_type="cosine", total_steps=4, min_lr_ratio=0.1), 4)
    assert cos[0] == pytest.approx(1.0) and cos[-1] < cos[1] < cos[0] and min(cos) >= 0.1
    assert cos[2] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 4)))


def test_the_optimizer_keys_build_the_schedule_over_the_runs_steps(tiny_flux_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        spec = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                                  f"{OPT}.lr_warmup_steps_ratio=0.5", f"{OPT}.lr_scheduler_type=cosine",
                                  f"{OPT}.min_lr_ratio=0.2", "trainer.total_training_steps=6"]))
    o = spec.train.optim
    assert (o.lr_scheduler_type, o.total_steps, o.warmup_steps, o.min_lr_ratio) == ("cosine", 6, 3, 0.2)
    model = f"actor_rollout_ref.model.path={tiny_flux_dir}"
    alias = build_run(compose([TINY_CPU, model, f"{OPT}.warmup_style=cosine"]))
    assert alias.train.optim.lr_scheduler_type == "cosine" and any("warmup_style" in d for d in alias.decisions)
    with pytest.raises(ValueError, match=rf"{OPT}\.lr_scheduler_type='linear'"):
        build_run(compose([TINY_CPU, model, f"{OPT}.lr_scheduler_type=linear"]))


@pytest.mark.slow
def test_a_run_steps_the_rate_once_per_global_step_and_logs_it(train_run):
    """Two mini-batches per global step (two optimizer steps): the rate moves once per global step."""
    t = train_run("data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=1", "trainer.total_training_steps=3",
                  f"{OPT}.lr_warmup_steps=2", "trainer.digenrl.final_eval_prompts=0", name="lr")
    lrs = [h["actor/lr"] for h in t.reporter.history]
    assert lrs == pytest.approx([0.0, 0.5e-4, 1e-4])  # the preset's lr 1e-4, warm-up 2 (verl: 0 at the first step)
