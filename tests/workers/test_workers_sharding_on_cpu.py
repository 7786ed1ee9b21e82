"""Which modules become FSDP2 units, and the strategy spec's validation (the sharded runs are in tests/trainer)."""

from __future__ import annotations

import pytest
from torch import nn

from digenrl_verl.workers.sharding import ShardingSpec, shard_blocks


class _Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj_in = nn.Linear(4, 8)
        self.transformer_blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.single_transformer_blocks = nn.ModuleList(nn.Linear(8, 8, bias=False) for _ in range(3))
        self.norm = nn.LayerNorm(8)


def test_default_units_are_the_items_of_every_block_list():
    m = _Denoiser()
    assert shard_blocks(m, ShardingSpec("fsdp2")) == [*m.transformer_blocks, *m.single_transformer_blocks]


def test_prefixes_pick_blocks_by_name_and_min_num_params_keeps_small_ones_in_the_root():
    m = _Denoiser()
    assert shard_blocks(m, ShardingSpec("fsdp2", ("transformer_blocks.",))) == list(m.transformer_blocks)
    # Linear(8, 8) has 72 parameters, Linear(8, 8, bias=False) 64
    assert shard_blocks(m, ShardingSpec("fsdp2", None, min_num_params=70)) == list(m.transformer_blocks)


def test_prefixes_that_name_no_block_list_the_real_ones():
    with pytest.raises(ValueError, match=r"fsdp_layer_prefixes=\['blocks.'\].*'transformer_blocks.'"):
        shard_blocks(_Denoiser(), ShardingSpec("fsdp2", ("blocks.",)))


def test_spec_validation():
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.strategy='zero3'"):
        ShardingSpec("zero3")
    with pytest.raises(ValueError, match="min_num_params"):
        ShardingSpec("fsdp2", min_num_params=-1)
    assert ShardingSpec("fsdp").sharded and ShardingSpec("fsdp2").sharded and not ShardingSpec("ddp").sharded
