"""Several optimizer steps per global step over several trainer (data-parallel) ranks: the prompt groups each
optimizer step trains are the ones verl's own code gives.

verl-omni's `update_actor` hands the step batch to the actor worker group, whose dispatch splits it over the
data-parallel ranks (`_split_args_kwargs_data_proto`: contiguous, equal shares); each rank then cuts its share with
`tensordict_utils.make_iterator` (mini_batch_size = ppo_mini_batch_size * n / dp, verl-omni's `shuffle=false`,
seed + dp rank) and runs one optimizer step per mini-batch, all ranks in lock-step: optimizer step j trains every
rank's j-th block. Both functions are called here from the installed verl; the driver's optimizer steps (simulated
executor: the same driver the Ray runtime runs) must train exactly those groups.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import _split_args_kwargs_data_proto
from verl.utils import tensordict_utils as tu

from digenrl_verl.schedule.config import ScheduleConfig, minibatch_groups, verl_cut_keeps_groups
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import SimExecutor
from digenrl_verl.sim.profiles import CostProfile

N = 4  # samples per prompt
SEED = 42  # verl-omni's actor.data_loader_seed (unused without shuffle, passed as verl-omni passes it)


def verl_step_groups(prompts: int, ranks: int, minibatches: int) -> list[list[int]]:
    """The prompt groups of each optimizer step of verl-omni's actor update, computed by verl's own dispatch split and
    mini-batch iterator (rows: the step batch, prompt p's n samples at rows p*n .. p*n+n-1)."""
    rows = prompts * N
    batch = TensorDict({"prompt": torch.arange(rows) // N}, batch_size=[rows])
    (shares,), _ = _split_args_kwargs_data_proto(ranks, batch)
    per_gpu = prompts // minibatches * N // ranks  # verl-omni: mini_batch_size // dp size
    steps: list[set[int]] = [set() for _ in range(minibatches)]
    for rank, share in enumerate(shares):
        blocks = list(tu.make_iterator(share, mini_batch_size=per_gpu, epochs=1, seed=SEED + rank,
                                       dataloader_kwargs={"shuffle": False}))
        assert len(blocks) == minibatches
        for j, block in enumerate(blocks):
            steps[j] |= set(block["prompt"].tolist())
    return [sorted(s) for s in steps]


def driver_step_groups(cfg: ScheduleConfig, cluster: ClusterSpec) -> dict[int, list[list[int]]]:
    """Per global step, the prompt groups of the UPDATEs before each of its OPT_STEPs (the driver's trace)."""
    profile = CostProfile("test", gen=4.0, score=0.5, update_loop=2.0, update_tsp=1.0, tag_overhead=1.2,
                          opt_step=0.5, sync=1.0)
    driver = Driver(cfg, SimExecutor(cluster, profile))
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    out: dict[int, list[list[int]]] = {}
    for step in range(cfg.num_steps):
        done = sorted((c for c in driver.trace.completions if c.ok and c.task.step == step
                       and c.task.kind in (TaskKind.UPDATE, TaskKind.OPT_STEP)), key=lambda c: c.start)
        groups: list[list[int]] = [[]]
        for c in done:
            if c.task.kind == TaskKind.OPT_STEP:
                groups.append([])
            else:
                groups[-1] += sorted({s // N for s in c.task.samples})
        assert groups[-1] == []  # the step ends with an optimizer step
        out[step] = [sorted(g) for g in groups[:-1]]
    return out


CASES = [(8, 2), (8, 4), (16, 2), (4, 2)]  # (prompts per step, optimizer steps per step), 2 trainer ranks


@pytest.mark.parametrize("mode,cluster", [("disaggregated", "gen=3xG,trn=2xT"), ("colocated", "col=2xG")])
@pytest.mark.parametrize("prompts,k", CASES, ids=[f"{p}prompts-k{k}" for p, k in CASES])
def test_each_optimizer_step_trains_verls_groups_at_dp2(mode, cluster, prompts, k):
    spec = ClusterSpec.parse(cluster)
    cfg = ScheduleConfig(mode=mode, pools=spec.pools, prompts_per_step=prompts, n=N, num_steps=2,
                         mini_batches_per_step=k)
    assert cfg.minibatch_dp_ranks == 2
    want = verl_step_groups(prompts, ranks=2, minibatches=k)
    assert want != [list(g) for g in minibatch_groups(prompts, k)]  # not the contiguous cut: this test can fail
    assert want == [list(g) for g in minibatch_groups(prompts, k, dp_ranks=2)]
    for step, got in driver_step_groups(cfg, spec).items():
        assert got == want, (step, got, want)


@pytest.mark.parametrize("prompts,k", [(8, 2), (6, 3)])
def test_one_data_parallel_rank_is_verls_contiguous_cut(prompts, k):
    spec = ClusterSpec.parse("gen=2xG,trn=1xT")
    cfg = ScheduleConfig(mode="disaggregated", pools=spec.pools, prompts_per_step=prompts, n=N, num_steps=1,
                         mini_batches_per_step=k)
    want = verl_step_groups(prompts, ranks=1, minibatches=k)
    assert want == [list(range(j * prompts // k, (j + 1) * prompts // k)) for j in range(k)]
    assert driver_step_groups(cfg, spec)[0] == want


def test_blocks_that_would_split_groups_fall_back_to_whole_contiguous_groups():
    """2 prompts, k=2, 2 ranks: verl's rank blocks are half a group each, which a micro-batch here cannot be; the
    schedule takes contiguous whole groups instead (the config layer prints that, tests/trainer)."""
    spec = ClusterSpec.parse("gen=2xG,trn=2xT")
    cfg = ScheduleConfig(mode="disaggregated", pools=spec.pools, prompts_per_step=2, n=N, num_steps=1,
                         mini_batches_per_step=2)
    assert cfg.minibatch_dp_ranks == 1
    assert verl_step_groups(2, ranks=2, minibatches=2) == [[0, 1], [0, 1]]  # each step: half of both groups
    assert driver_step_groups(cfg, spec)[0] == [[0], [1]]


GRID = [(p, k, r) for p in (1, 2, 3, 4, 6, 8) for k in (1, 2, 3, 4) if p % k == 0 for r in (1, 2, 4)]


@pytest.mark.parametrize("prompts,k,ranks", GRID, ids=[f"{p}prompts-k{k}-dp{r}" for p, k, r in GRID])
def test_the_one_rule_for_whole_groups_is_verls_own_split(prompts, k, ranks):
    """`verl_cut_keeps_groups`, which decides both the schedule's cut (`minibatch_dp_ranks`) and the config layer's
    warning, says True exactly when verl's own dispatch split + mini-batch iterator put each prompt group in one
    optimizer step; when it does, the schedule cuts over every rank and trains verl's groups."""
    verl = verl_step_groups(prompts, ranks=ranks, minibatches=k)
    whole = sum(len(g) for g in verl) == prompts  # no group in two optimizer steps
    assert verl_cut_keeps_groups(prompts, k, ranks) == whole
    cfg = ScheduleConfig(mode="colocated", pools={"col": {"size": ranks}}, prompts_per_step=prompts, n=N,
                         mini_batches_per_step=k)
    cut = minibatch_groups(prompts, k, cfg.minibatch_dp_ranks)
    assert [list(g) for g in cut] == (verl if whole else [list(range(j * prompts // k, (j + 1) * prompts // k))
                                                          for j in range(k)])
