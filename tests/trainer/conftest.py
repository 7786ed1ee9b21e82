"""Fixtures for end-to-end runs: one tiny FLUX directory per session, runs on the shared Ray instance."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
import torch

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.runner import DigenRLTrainer


@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory):
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir("FluxPipeline", tmp_path_factory.mktemp("models") / "tiny_flux", seed=0)


@pytest.fixture
def train_run(ray_session, tiny_flux_dir, tmp_path):
    """train_run(*overrides, trainer_cls=DigenRLTrainer) -> the finished trainer (workers still alive)."""
    made = []

    def run(*overrides, trainer_cls=DigenRLTrainer, name="run"):
        cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                       f"trainer.digenrl.output_dir={tmp_path / name}",
                       "trainer.logger=[console]", *overrides])
        trainer = trainer_cls(build_run(cfg))
        made.append(trainer)
        trainer.fit()
        return trainer

    yield run
    for t in made:
        t.shutdown()


#: the uninterrupted reference of the resume tests (reliability: after a trainer failure; elastic: with another
#: generator count) and of the run whose killed generator rejoins: disaggregated, TAG off (one generator lane, so the
#: schedule's order is fixed), 4 steps, a checkpoint every 2; each sample drawn alone (`trainer.digenrl.rows_alone`),
#: so a run with two generators (a group split over both) draws the same samples bit for bit. Batched, the same 4
#: steps with two generators end 0.9 % (relative, worst tensor) from these weights: a uint8 pixel flip of a
#: differently batched sample moves the group's advantages (tests/trainer/test_trainer_sample_placement_on_cpu.py)
UNINTERRUPTED = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.optim.lr=3e-3",
                 "trainer.digenrl.mode=disaggregated", "trainer.digenrl.tag.policy=off",
                 "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.digenrl.rows_alone=true"]


@dataclass(frozen=True)
class Uninterrupted:
    overrides: tuple[str, ...]  # `UNINTERRUPTED`
    state: dict[str, torch.Tensor]  # trn:0's trainable weights after the last step
    checkpoints: Path  # its trainer.default_local_dir (global_step_2, global_step_4)


@pytest.fixture(scope="session")
def uninterrupted_run(ray_session, tiny_flux_dir, tmp_path_factory) -> Uninterrupted:
    """`UNINTERRUPTED` run once per session: the tests that resume the same run compare with it."""
    out = tmp_path_factory.mktemp("uninterrupted")
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", f"trainer.digenrl.output_dir={out}",
                   f"trainer.default_local_dir={out / 'ckpt'}", "trainer.logger=[console]", *UNINTERRUPTED])
    trainer = DigenRLTrainer(build_run(cfg))
    try:
        trainer.fit()
        state = ray.get(trainer.workers["trn:0"].trainable_state.remote())
    finally:
        trainer.shutdown()
    return Uninterrupted(tuple(UNINTERRUPTED), state, out / "ckpt")
