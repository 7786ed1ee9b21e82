"""Validation barriers (`ScheduleConfig.validate_every`, verl-omni's trainer.test_freq): the steps with
(s + 1) % k == 0 and the last step are barrier steps; the driver drains at them as at checkpoint barriers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl_verl.errors import ConfigError
from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import SimExecutor
from digenrl_verl.sim.profiles import CostProfile

PROFILE = CostProfile("val", gen=4.0, score=0.5, update_loop=2.0, update_tsp=1.0, tag_overhead=1.25, opt_step=0.5,
                      sync=1.0, checkpoint=3.0)
LAYOUTS = {"disaggregated": "gen=2xG,trn=2xT", "colocated": "col=2xG"}


def _config(mode: str, **kw) -> ScheduleConfig:
    return ScheduleConfig(mode=mode, pools=ClusterSpec.parse(LAYOUTS[mode]).pools, prompts_per_step=4, n=2,
                          num_steps=5, tag=TagConfig("off"), tcss=TcssConfig(staleness=0), **kw)


def test_validate_steps_are_every_k_and_the_last_and_barriers_include_them():
    cfg = _config("disaggregated", validate_every=2, checkpoint_every=3)
    assert [s for s in range(5) if cfg.is_validate_step(s)] == [1, 3, 4]
    assert [s for s in range(5) if cfg.is_save_step(s)] == [2]
    assert [s for s in range(5) if cfg.is_checkpoint_step(s)] == [1, 2, 3, 4]
    assert [cfg.next_barrier_step(s) for s in range(5)] == [1, 1, 2, 3, 4]
    plain = _config("disaggregated")
    assert not any(plain.is_checkpoint_step(s) for s in range(5)) and plain.next_barrier_step(0) == 4


@pytest.mark.parametrize("mode", sorted(LAYOUTS))
def test_the_driver_drains_at_each_validation_barrier(mode):
    cfg = _config(mode, validate_every=2)
    driver = Driver(cfg, SimExecutor(ClusterSpec.parse(LAYOUTS[mode]), PROFILE))
    assert [r.step for r in driver.run()] == list(range(5))
    assert check_run(cfg, driver.trace.completions) == []  # drained: nothing of s + 1 before the barrier ends
    ckpts = [c.task for c in driver.trace.sorted_completions() if c.task.kind == TaskKind.CHECKPOINT]
    assert [(t.step, t.version) for t in ckpts] == [(1, 2), (3, 4), (4, 5)]


@pytest.mark.parametrize("save_every,validate_every", [(0, 2), (3, 2), (2, 0), (0, 3)])
def test_tcss_generation_stops_at_validation_barriers_too(save_every, validate_every):
    """With staleness 1 the driver plans ahead only up to the next barrier, save or validation (invariant 9: nothing
    of step s + 1 runs before the barrier after step s ended), and still generates stale where it may."""
    cfg = replace(_config("disaggregated", validate_every=validate_every, checkpoint_every=save_every),
                  tcss=TcssConfig(staleness=1, max_stale_fraction=1.0, guard=False))
    driver = Driver(cfg, SimExecutor(ClusterSpec.parse(LAYOUTS["disaggregated"]), PROFILE))
    assert [r.step for r in driver.run()] == list(range(5))
    assert check_run(cfg, driver.trace.completions) == []
    barriers = [s for s in range(5) if cfg.is_checkpoint_step(s)]
    ckpts = [c.task.step for c in driver.trace.sorted_completions() if c.task.kind == TaskKind.CHECKPOINT]
    assert ckpts == barriers
    stale = [c.task for c in driver.trace.sorted_completions()
             if c.task.kind in (TaskKind.GEN, TaskKind.TAG_GEN) and c.task.version < c.task.step]
    assert stale and all(t.step - 1 not in barriers for t in stale)  # never stale across a barrier


def test_bad_validate_every_is_rejected_by_name():
    with pytest.raises(ConfigError, match="validate_every"):
        _config("colocated", validate_every=-1)
