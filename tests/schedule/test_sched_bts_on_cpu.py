"""BTS: exact against exhaustive search, memo-invariant, never worse than no-TAG or any static TAG(k)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from digenrl_verl.schedule.bts import (BtsCosts, BtsSolver, BtsState, GenPhase, exhaustive, lower_bound,
                                       no_tag_policy, rollout, static_policy)


def _instances(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        b = rng.randint(1, 12)
        g = rng.uniform(0.2, 3.0)
        ratio = rng.choice([0.05, 0.1, 0.3, 0.5, 1.0, 1.5, 3.0])  # update / generation
        costs = BtsCosts(gen=g, score=rng.choice([0.0, rng.uniform(0.0, 0.3 * g)]), update=ratio * g,
                         tag=g * rng.uniform(0.5, 3.0))
        phase = rng.choice(list(GenPhase))
        state = BtsState(pending=b, phase=phase,
                         remaining=0.0 if phase == GenPhase.IDLE else rng.uniform(0.0, g),
                         scoring_queue=rng.randint(0, 2))
        yield costs, state


@pytest.mark.parametrize("seed", range(4))
def test_bts_equals_exhaustive_and_beats_baselines(seed):
    for costs, state in _instances(seed, 60):
        best = exhaustive(costs, state)
        result = BtsSolver(costs).solve(state)
        assert result.makespan == pytest.approx(best, rel=1e-9, abs=1e-9)
        assert not result.budget_hit
        assert result.makespan <= rollout(costs, state, no_tag_policy()) + 1e-9
        best_static = min(rollout(costs, state, static_policy(k)) for k in range(state.pending + 1))
        assert result.makespan <= best_static + 1e-9
        assert lower_bound(costs, state) <= best + 1e-9  # the pruning bound is a valid bound


@pytest.mark.parametrize("seed", range(2))
def test_memo_and_pruning_do_not_change_results(seed):
    for costs, state in _instances(100 + seed, 60):
        ref = BtsSolver(costs, memo=False, prune=False, max_states=10**7).solve(state)
        assert not ref.budget_hit
        for memo, prune in ((True, False), (False, True), (True, True)):
            got = BtsSolver(costs, memo=memo, prune=prune, max_states=10**7).solve(state)
            assert got.makespan == pytest.approx(ref.makespan, rel=1e-9, abs=1e-9)
            assert got.tag_now == ref.tag_now


def test_memo_reused_across_solves_gives_the_same_answers():
    costs = BtsCosts(gen=1.0, score=0.05, update=0.3, tag=1.2)
    shared = BtsSolver(costs)
    for state in (BtsState(24), BtsState(20, GenPhase.GEN, 0.4, 1), BtsState(9, GenPhase.SCORE, 0.02, 0)):
        assert shared.solve(state).makespan == pytest.approx(BtsSolver(costs).solve(state).makespan)


def test_training_bound_step_never_tags():
    # g < t: TAG cannot help (the design's TAG balance: x* = 0)
    costs = BtsCosts(gen=1.0, score=0.0, update=2.0, tag=1.0)
    result = BtsSolver(costs).solve(BtsState(10))
    assert result.makespan == pytest.approx(rollout(costs, BtsState(10), no_tag_policy()))


def test_generation_bound_step_tags_and_gains():
    costs = BtsCosts(gen=1.0, score=0.0, update=0.1, tag=1.0)
    result = BtsSolver(costs).solve(BtsState(32, GenPhase.GEN, 1.0))
    no_tag = rollout(costs, BtsState(32, GenPhase.GEN, 1.0), no_tag_policy())
    assert result.tag_now and result.makespan < 0.6 * no_tag


@settings(max_examples=40, deadline=None)
@given(b=st.integers(20, 200), ratio=st.sampled_from([0.1, 0.5, 1.0]), budget=st.integers(5, 60))
def test_budget_fallback_is_feasible_and_flagged(b, ratio, budget):
    costs = BtsCosts(gen=1.0, score=0.05, update=ratio, tag=1.1)
    state = BtsState(b, GenPhase.GEN, 0.5)
    capped = BtsSolver(costs, max_states=budget).solve(state)
    exact = BtsSolver(costs, max_states=10**7).solve(state)
    assert capped.makespan >= exact.makespan - 1e-9  # a lookahead over rollouts is feasible, not better
    if capped.budget_hit:
        assert capped.makespan <= rollout(costs, state, no_tag_policy()) + 1e-9
    else:
        assert capped.makespan == pytest.approx(exact.makespan)
