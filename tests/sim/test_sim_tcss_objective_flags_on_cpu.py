"""`digenrl-sim` has the stale-row objective's flags (its flags come from `ScheduleSettings`), and says that they have
no effect there: the simulator models time, and the objective costs no extra pass."""

from __future__ import annotations

import warnings

import pytest

from digenrl_verl.sim.cli import _parser, settings_from_flags


def test_objective_flags_parse_into_the_settings_and_warn_by_name():
    args = _parser().parse_args(["--tcss-objective", "clip", "--tcss-is-cap", "3"])
    with pytest.warns(UserWarning) as caught:
        settings = settings_from_flags(args, "disaggregated")
    messages = [str(w.message) for w in caught]
    assert any(m.startswith("--tcss-objective has no effect in the simulator") for m in messages), messages
    assert any(m.startswith("--tcss-is-cap has no effect in the simulator") for m in messages), messages
    assert settings.tcss.objective == "clip" and settings.tcss.is_cap == 3.0


def test_no_warning_without_the_flags():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings = settings_from_flags(_parser().parse_args(["--tcss-staleness", "1"]), "disaggregated")
    assert settings.tcss.objective == "decoupled"
