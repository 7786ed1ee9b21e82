"""GAP-aware splitting and gathering of a step's DataProto (no Ray needed)."""

import numpy as np
import pytest
import torch
from verl import DataProto

from digenrl_verl.trainer.data import make_step_batch
from digenrl_verl.workers.dispatch import gather_in_sample_order, split_by_assignment


def _batch(prompts=3, n=4):
    b = make_step_batch([f"prompt {i}" for i in range(prompts)], ["builtin"] * prompts, list(range(prompts)), n, step=7)
    b.batch = DataProto.from_dict(tensors={"x": torch.arange(prompts * n, dtype=torch.float32)[:, None]}).batch
    return b


def test_gap_assignment_spreads_one_group_over_ranks_and_gathers_back():
    b = _batch(prompts=3, n=4)
    # GAP: group 1 (rows 4..7) over 3 ranks, uneven: 2/1/1
    assignment = [[4, 7], [5], [6]]
    parts = split_by_assignment(b, assignment)
    assert [len(p) for p in parts] == [2, 1, 1]
    assert set(parts[0].non_tensor_batch["uid"]) == {"p1"}
    gathered = gather_in_sample_order(parts, assignment)
    assert gathered.batch["x"][:, 0].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert gathered.non_tensor_batch["sample_index"].tolist() == [0, 1, 2, 3]


def test_empty_shards_are_allowed_and_skipped_on_gather():
    b = _batch(prompts=1, n=2)
    parts = split_by_assignment(b, [[0, 1], [], []])
    assert [len(p) for p in parts] == [2, 0, 0]
    assert gather_in_sample_order(parts, [[0, 1], [], []]).batch["x"][:, 0].tolist() == [0.0, 1.0]


def test_row_given_twice_or_out_of_range_is_rejected():
    b = _batch(prompts=1, n=2)
    with pytest.raises(ValueError, match="two ranks"):
        split_by_assignment(b, [[0, 1], [1]])
    with pytest.raises(ValueError, match="outside"):
        split_by_assignment(b, [[0, 5]])


def test_step_batch_layout_matches_grpo_groups():
    b = make_step_batch(["a", "b"], ["s", "s"], [10, 11], n=3, step=2)
    assert b.non_tensor_batch["uid"].tolist() == ["p10"] * 3 + ["p11"] * 3
    assert b.non_tensor_batch["sample_index"].tolist() == [0, 1, 2, 0, 1, 2]
    assert b.meta_info["global_step"] == 2
    assert isinstance(b.non_tensor_batch["sample_index"], np.ndarray)


@pytest.mark.slow  # starts the session's Ray instance
def test_a_pool_the_cluster_cannot_place_fails_fast_naming_it(ray_session):
    from digenrl_verl.workers.pools import PoolManager, PoolSpec

    manager = PoolManager({"g": PoolSpec("g", (1,), custom_resource="no_such_kind")}, {"generator": "g"})
    with pytest.raises(ValueError, match="trainer.digenrl.pools.generator.*no_such_kind"):
        manager.pool_for("generator")
