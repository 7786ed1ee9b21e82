"""Fixtures for end-to-end runs: one tiny FLUX directory per session, runs on the shared Ray instance."""

from __future__ import annotations

import pytest

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
