"""How the trainer pool splits its model: replicated data parallel or FSDP2 (`fully_shard`).

`actor_rollout_ref.actor.strategy` selects it:

* `ddp` — every trainer rank holds the whole model; the gradients accumulated over a step are summed over
  the trainer ranks with one flat all-reduce at the optimizer step (`Collectives.all_reduce_grads`).
* `fsdp2` (and `fsdp`, verl-omni's default, which this plugin serves with FSDP2 as well) — PyTorch FSDP2:
  every transformer block, then the whole transformer, is `fully_shard`-ed over the trainer process group.
  Parameters, gradients and AdamW moments are `DTensor` shards; each forward all-gathers a block's weights,
  each backward reduce-scatters its gradients (summed, not averaged: the loss is already divided by the step's
  row count, see `diffusion/loss.py`). Same gradient as `ddp`, up to fp32 summation order.

FSDP2 makes every forward and backward a collective over the trainer ranks, so those ranks must run them in
lock-step: the same calls in the same order with the same number of passes. The schedule gives that by
construction (trainer tasks — UPDATE, TAG_GEN, OPT_STEP, SYNC — always span the whole trainer pool and reach
every actor in submission order); the workers pad passes where ranks hold uneven row counts (`lockstep`), and
`build_run` requires that every trainer rank gets at least one sample of each micro-batch. A trainer pool of one
rank, and colocated mode (whose ranks sample independent micro-batches), use `ddp`.

Weights leave the trainer as full tensors (`full`): weight sync to the generators, checksums and checkpoints,
so the checkpoint format and the generators do not depend on the strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

import torch
from torch import nn

STRATEGY_KEY = "actor_rollout_ref.actor.strategy"
STRATEGIES = ("ddp", "fsdp", "fsdp2")


@dataclass(frozen=True)
class ShardingSpec:
    """Args:
        strategy: `ddp` or `fsdp2` (`fsdp` is accepted and means `fsdp2`).
        layer_prefixes: module-name prefixes of the blocks that become their own FSDP units
            (`actor_rollout_ref.model.fsdp_layer_prefixes`, e.g. `transformer_blocks.`); a block is a module
            named `<prefix><index>`. None or empty: every item of every `nn.ModuleList` child of the transformer.
        min_num_params: blocks with fewer parameters stay in the root unit
            (`actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params`).
        reshard_after_forward: free the gathered weights after each forward (memory) or keep them until the
            backward (one all-gather fewer) (`actor_rollout_ref.actor.fsdp_config.reshard_after_forward`).
    """

    strategy: str = "ddp"
    layer_prefixes: tuple[str, ...] | None = None
    min_num_params: int = 0
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"{STRATEGY_KEY}={self.strategy!r}; valid: {list(STRATEGIES)}")
        if self.min_num_params < 0:
            raise ValueError("actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params must be >= 0, got "
                             f"{self.min_num_params}")

    @property
    def sharded(self) -> bool:
        return self.strategy in ("fsdp", "fsdp2")


class GradientSync(Protocol):
    """What the trainer's steps need from a parallel strategy."""

    lockstep: bool  # every trainer rank must run the same forward/backward passes in the same order

    def reduce_grads(self, params: list[nn.Parameter]) -> None:
        """Make every rank's `.grad` the step's summed gradient (of its shard)."""

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """The whole value of a parameter or optimizer moment (collective under FSDP2)."""

    def place(self, like: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """`value` (a whole tensor) laid out like `like` (its shard under FSDP2), on `like`'s device."""


class ReplicatedDataParallel:
    """`ddp`: whole model per rank, one flat all-reduce of the accumulated gradients per optimizer step."""

    lockstep = False

    def __init__(self, collectives) -> None:
        self.collectives = collectives

    def reduce_grads(self, params: list[nn.Parameter]) -> None:
        self.collectives.all_reduce_grads(params)

    def full(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def place(self, like: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return value.to(device=like.device, dtype=like.dtype, copy=True)


class FullyShardedDataParallel:
    """`fsdp2`: the transformer is `fully_shard`-ed over the trainer process group (see the module docstring)."""

    lockstep = True

    def __init__(self, module: nn.Module, blocks_root: nn.Module, group, spec: ShardingSpec,
                 device: torch.device) -> None:
        # FSDP's modules load here, not at import: the config imports this module (STRATEGY_KEY, ShardingSpec), and
        # torch.distributed.fsdp / .tensor add about a second to every config-only import (tests, the bridge)
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        self.mesh = DeviceMesh.from_group(group, device.type)
        self.units = []
        for block in shard_blocks(blocks_root, spec):
            self.units.append(fully_shard(block, mesh=self.mesh, reshard_after_forward=spec.reshard_after_forward))
        self.units.append(fully_shard(module, mesh=self.mesh, reshard_after_forward=spec.reshard_after_forward))
        for unit in self.units:
            # the loss is Σ rows / (rows of the whole step): shards must be summed over ranks, not averaged
            # (a plain SUM reduction: gloo has no PREMUL_SUM, which a divide factor would otherwise use)
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)

    def reduce_grads(self, params: list[nn.Parameter]) -> None:
        return None  # every backward already reduce-scattered its gradients into the shards

    def full(self, t: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        return t.full_tensor() if isinstance(t, DTensor) else t

    def place(self, like: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, distribute_tensor

        value = value.to(device=like.device if not isinstance(like, DTensor) else like.to_local().device,
                         dtype=like.dtype)
        if not isinstance(like, DTensor):
            return value.clone()
        # every rank holds the whole value (all read the same checkpoint file): cut locally, no communication
        return distribute_tensor(value, like.device_mesh, like.placements, src_data_rank=None)


def shard_blocks(root: nn.Module, spec: ShardingSpec) -> list[nn.Module]:
    """The modules of `root` that become their own FSDP units, in module order (see `ShardingSpec`)."""
    blocks = []
    if spec.layer_prefixes:
        for name, module in root.named_modules():
            for prefix in spec.layer_prefixes:
                rest = name[len(prefix):] if name.startswith(prefix) else ""
                if rest.isdigit():
                    blocks.append(module)
                    break
    else:
        for child in root.children():
            if isinstance(child, nn.ModuleList):
                blocks.extend(child)
    if spec.layer_prefixes and not blocks:
        lists = [name + "." for name, child in root.named_children() if isinstance(child, nn.ModuleList)]
        raise ValueError(f"actor_rollout_ref.model.fsdp_layer_prefixes={list(spec.layer_prefixes)} names no block of "
                         f"{type(root).__name__}; its block lists: {lists} (or null: all of them)")
    return [b for b in blocks if sum(p.numel() for p in b.parameters()) >= spec.min_num_params]


def full_state(sync: GradientSync, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`{name: whole tensor}` of (possibly sharded) tensors, detached; collective under FSDP2."""
    return {k: sync.full(v.detach()) for k, v in named.items()}
