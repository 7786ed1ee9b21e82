from hypothesis import given, settings
from hypothesis import strategies as st

from digenrl_verl.schedule.plan import BatchAxisPlanner, GapPlanner, split_even


def test_fig5_counts_gap_four_units_batch_axis_two():
    # the paper's Fig. 5: 2 GPUs, 4 prompts x 2 samples
    gap = GapPlanner().microbatches(0, prompts=4, n=2, ranks=2)
    batch = BatchAxisPlanner().microbatches(0, prompts=4, n=2, ranks=2)
    assert len(gap) == 4 and len(batch) == 2
    lane = GapPlanner().lanes(["gen:0", "gen:1"], n=2)
    assert lane == [("gen:0", "gen:1")]
    # a GAP unit is one group spread over both GPUs; a batch-axis unit is one whole group per GPU
    assert GapPlanner().assign(gap[1], lane[0], 2) == (("gen:0", (2,)), ("gen:1", (3,)))
    assert BatchAxisPlanner().assign(batch[1], ("gen:0", "gen:1"), 2) == (("gen:0", (4, 5)), ("gen:1", (6, 7)))


@settings(max_examples=200, deadline=None)
@given(prompts=st.integers(1, 40), n=st.integers(1, 24), ranks=st.integers(1, 40), gap=st.booleans())
def test_plans_cover_every_sample_exactly_once(prompts, n, ranks, gap):
    planner = GapPlanner() if gap else BatchAxisPlanner()
    workers = [f"gen:{i}" for i in range(ranks)]
    mbs = planner.microbatches(3, prompts, n, ranks)
    lanes = planner.lanes(workers, n)
    assert sorted(w for lane in lanes for w in lane) == sorted(workers)  # lanes partition the pool
    seen = []
    for i, mb in enumerate(mbs):
        assert mb.index == i and mb.step == 3
        assert mb.samples == tuple(p * n + j for p in mb.prompts for j in range(n))  # whole groups only
        for lane in lanes:
            assignment = planner.assign(mb, lane, n)
            assigned = [s for _, idx in assignment for s in idx]
            assert sorted(assigned) == sorted(mb.samples)
            assert all(w in lane for w, _ in assignment)
            sizes = [len(idx) for _, idx in assignment]
            if gap:
                assert max(sizes) - min(sizes) <= 1 and len(assignment) == len(lane)  # no idle rank in a lane
        seen.extend(mb.samples)
    assert sorted(seen) == list(range(prompts * n))
    if gap:
        assert len(mbs) == prompts and all(len(lane) <= n for lane in lanes)
    else:
        assert len(mbs) == -(-prompts // ranks)


def test_split_even_drops_workers_without_items():
    assert split_even([7], ["a", "b", "c"]) == (("a", (7,)),)
    assert split_even(list(range(7)), ["a", "b", "c"]) == (("a", (0, 1, 2)), ("b", (3, 4)), ("c", (5, 6)))


def test_uneven_gap_lanes():
    # n=3 samples on 4 ranks: two lanes of two ranks, each running its own group (2+1 samples)
    lanes = GapPlanner().lanes([f"gen:{i}" for i in range(4)], n=3)
    assert lanes == [("gen:0", "gen:1"), ("gen:2", "gen:3")]
