"""Validation keys (trainer.test_freq, trainer.val_before_train, data.val_files, data.val_max_samples) reach the
typed config and the schedule; bad values fail naming the key."""

from __future__ import annotations

import warnings

import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.runner import DigenRLTrainer

DISAGG = ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.tcss.staleness=0"]


def _build(model_dir, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model_dir}", *overrides]))


def test_validation_keys_reach_the_run_and_the_schedule(tiny_flux_dir, tmp_path):
    val = tmp_path / "val.txt"
    val.write_text("a red cube\na blue ball\na green cone\n")
    run = _build(tiny_flux_dir, *DISAGG, "trainer.total_training_steps=5", "trainer.test_freq=2",
                 "trainer.val_before_train=true", f"data.val_files={val}", "data.val_max_samples=2")
    assert (run.validation.test_freq, run.validation.before_train) == (2, True)
    assert (run.data.val_files, run.data.val_max_samples) == (str(val), 2)
    assert run.schedule.validate_every == 2
    assert [s for s in range(5) if run.schedule.is_validate_step(s)] == [1, 3, 4]
    assert any("validation:" in d and "data.val_files" in d for d in run.decisions)
    assert "validation:" in run.describe()


def test_validation_is_off_by_default(tiny_flux_dir):
    run = _build(tiny_flux_dir)
    assert not run.validation.enabled and run.schedule.validate_every == 0
    assert not any("validation" in d for d in run.decisions)


@pytest.mark.parametrize("override, key", [
    ("trainer.test_freq=true", "trainer.test_freq"),
    ("trainer.test_freq=two", "trainer.test_freq"),
    ("trainer.val_before_train=maybe", "trainer.val_before_train"),
    ("data.val_max_samples=0", "data.val_max_samples"),
])
def test_bad_validation_values_name_the_key(tiny_flux_dir, override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        _build(tiny_flux_dir, override)


def test_periodic_validation_with_tcss_staleness_is_accepted(tiny_flux_dir):
    run = _build(tiny_flux_dir, "trainer.digenrl.mode=disaggregated", "trainer.digenrl.tcss.staleness=1",
                 "trainer.test_freq=2", "trainer.val_before_train=true")
    assert run.validation.before_train and run.schedule.validate_every == 2 and run.schedule.tcss.staleness == 1


def test_a_missing_validation_file_fails_naming_the_key_before_any_worker(tiny_flux_dir, tmp_path):
    with pytest.raises(ValueError, match=r"data\.val_files: .*nope\.txt.* does not exist"):
        # the run's build reads the files (their negative-prompt columns), before the trainer: no Ray, no worker yet
        DigenRLTrainer(_build(tiny_flux_dir, "trainer.val_before_train=true", f"data.val_files={tmp_path / 'nope.txt'}",
                              f"trainer.digenrl.output_dir={tmp_path / 'out'}"))


def test_validation_prompts_default_to_the_training_prompts_and_are_capped(tiny_flux_dir, tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("one\ntwo\nthree\nfour\n")
    run = _build(tiny_flux_dir, "trainer.test_freq=1", f"data.train_files={train}", "data.val_max_samples=2",
                 f"trainer.digenrl.output_dir={tmp_path / 'out'}")
    assert DigenRLTrainer(run)._val == (["one", "two"], ["train.txt", "train.txt"], [{}, {}])
    assert any("the training prompts" in d for d in run.decisions)
