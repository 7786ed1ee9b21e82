"""BTS cold start: bubbles before every cost is measured are decided on the prior from observed bounds."""

from __future__ import annotations

import random

import pytest

from digenrl_verl.schedule.bts import BtsCosts, BtsSolver, BtsState, GenPhase
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.tag import BtsTag, BubbleContext
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import SimExecutor
from digenrl_verl.sim.profiles import get_profile
from digenrl_verl.sim.scenarios import SCENARIOS, ladder_configs

PRIOR = BtsCosts(gen=57.5, score=0.0, update=0.0, tag=57.5)  # hetero-8+8 at its second bubble


def _ctx(state: BtsState, prior: BtsCosts | None, costs: BtsCosts | None = None) -> BubbleContext:
    return BubbleContext(now=57.5, step=0, pending=state.pending, tags_this_step=1, state=state, costs=costs,
                         tag_cost_known=True, prior=prior)


def test_prior_tie_is_decided_for_tag_and_only_on_the_prior():
    state = BtsState(30, GenPhase.GEN, 0.0, 1)
    result = BtsSolver(PRIOR).solve(state)
    assert result.tag_makespan == pytest.approx(result.skip_makespan)  # free updates: now or later ties
    decision = BtsTag().decide(_ctx(state, PRIOR))
    assert decision.tag and decision.reason.startswith("prior(g=57.5 sc=0 t=0 g'=57.5) bts")
    # the same numbers as measured costs keep the plain rule (ties skip)
    assert not BtsTag().decide(_ctx(state, None, costs=PRIOR)).tag
    # cold start off: the old behaviour
    off = BtsTag(cold_start=False).decide(_ctx(state, PRIOR))
    assert not off.tag and off.reason == "no estimate yet"
    assert not BtsTag().decide(_ctx(state, None)).tag  # no prior either: nothing to decide on


def test_prior_still_skips_a_tag_that_lengthens_generation():
    # one micro-batch left, the generator finishes it long before a TAG would: skip even with free updates
    costs = BtsCosts(gen=57.5, score=0.0, update=0.0, tag=200.0)
    state = BtsState(1, GenPhase.GEN, 5.0, 0)
    result = BtsSolver(costs).solve(state, tie_tag=True)
    assert result.skip_makespan < result.tag_makespan and not result.tag_now
    assert not BtsTag().decide(_ctx(state, costs)).tag


@pytest.mark.parametrize("seed", range(2))
def test_tie_tag_changes_only_tied_decisions(seed):
    rng = random.Random(seed)
    tied = 0
    for _ in range(80):
        g = rng.uniform(0.5, 3.0)
        costs = BtsCosts(gen=g, score=rng.choice([0.0, 0.1 * g]), update=rng.choice([0.0, 0.2 * g, g]),
                         tag=g * rng.uniform(0.5, 2.0))
        state = BtsState(rng.randint(1, 10), GenPhase.GEN, rng.uniform(0.0, g), rng.randint(0, 1))
        plain, tie = BtsSolver(costs).solve(state), BtsSolver(costs).solve(state, tie_tag=True)
        assert (tie.makespan, tie.tag_makespan, tie.skip_makespan) == (plain.makespan, plain.tag_makespan,
                                                                       plain.skip_makespan)
        is_tie = plain.tag_makespan is not None and plain.tag_makespan == pytest.approx(plain.skip_makespan,
                                                                                        rel=1e-9, abs=1e-9)
        tied += is_tie
        assert tie.tag_now == (plain.tag_now or is_tie)
    assert tied > 0  # the property was exercised


def _hetero_bts(policy: BtsTag, profiler=None) -> tuple[Driver, float]:
    """Run the +TAG BTS row of hetero-8+8; returns the driver and step 0's duration."""
    s = SCENARIOS["hetero-8+8"]
    profile, cluster = get_profile(s.profile), ClusterSpec.parse(s.cluster)
    cfg, cl = ladder_configs(s, cluster, profile)["+TAG BTS"]
    driver = Driver(cfg, SimExecutor(cl, profile), tag_policy=policy, profiler=profiler)
    first = driver.run()[0]
    return driver, first.end - first.start


def test_cold_start_reaches_the_seeded_profile_step_time_on_hetero():
    """hetero-8+8: the second bubble (t = 57.5 s) comes before the first GEN (83.3 s) and the first UPDATE
    end. Plain BTS skips it; the prior (g >= 57.5 s elapsed, t >= 0) inserts a TAG, and step 0 is then
    as fast as with a cost profile seeded from a previous run."""
    cold, cold0 = _hetero_bts(BtsTag())
    _, plain0 = _hetero_bts(BtsTag(cold_start=False))
    seeded, seeded0 = _hetero_bts(BtsTag(), profiler=cold.profiler)
    assert cold0 == pytest.approx(seeded0) and cold0 < plain0 - 1.0
    second = [d for d in cold.trace.decisions if d.action in ("tag", "skip")][1]
    assert second.time == pytest.approx(57.5) and second.action == "tag"
    assert second.detail.startswith("prior(g=57.5 ") and " t=0 " in second.detail  # true g is 83.3
    assert not any(d.detail.startswith("prior") for d in seeded.trace.decisions)
