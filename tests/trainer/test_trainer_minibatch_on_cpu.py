"""Several optimizer steps per global step (verl-omni's ``ppo_mini_batch_size < data.train_batch_size``): the config
adapter, the executor's loss normalisation, and (slow, Ray) equivalence with the per-timestep colocated loop."""

from __future__ import annotations

import warnings

import pytest
import ray
import torch

from digenrl_verl.diffusion.advantages import AdvantageConfig
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.types import Task, TaskKind
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.ray_executor import RayExecutor
from digenrl_verl.trainer.runner import DigenRLTrainer

A = "actor_rollout_ref"
DISAGG = ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.gap=true", "trainer.digenrl.tsp.enabled=true",
          "trainer.digenrl.tag.policy=bts", "trainer.digenrl.tcss.staleness=0"]


def _build(model_dir, *overrides):
    return build_run(compose([TINY_CPU, f"{A}.model.path={model_dir}", *overrides]))


@pytest.mark.parametrize("mode", [["trainer.digenrl.mode=colocated"], DISAGG])
def test_half_batch_mini_batches_are_accepted_and_planned(tiny_flux_dir, mode):
    run = _build(tiny_flux_dir, *mode, "data.train_batch_size=4", f"{A}.actor.ppo_mini_batch_size=2")
    assert run.schedule.mini_batches_per_step == 2
    assert "2 optimizer steps per global step (ppo_mini_batch_size=2 prompts each" in run.describe()
    whole = _build(tiny_flux_dir, *mode, "data.train_batch_size=4", f"{A}.actor.ppo_mini_batch_size=4")
    assert whole.schedule.mini_batches_per_step == 1 and "optimizer steps per global step" not in whole.describe()
    assert _build(tiny_flux_dir, *mode, "data.train_batch_size=4").schedule.mini_batches_per_step == 1  # null


@pytest.mark.parametrize("value", [3, 8, 0])
def test_a_mini_batch_that_does_not_divide_the_batch_is_rejected_by_name(tiny_flux_dir, value):
    with pytest.raises(ValueError) as err:
        _build(tiny_flux_dir, "data.train_batch_size=4", f"{A}.actor.ppo_mini_batch_size={value}")
    msg = str(err.value)
    assert msg.startswith(f"{A}.actor.ppo_mini_batch_size={value}"), msg
    assert "data.train_batch_size=4" in msg and "divisor of 4" in msg, msg


def test_two_trainer_ranks_get_verls_cut_or_a_printed_fall_back(tiny_flux_dir):
    two = ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.pools.trainer.workers_per_node=2",
           f"{A}.actor.strategy=ddp", f"{A}.rollout.n=2"]
    run = _build(tiny_flux_dir, *two, "data.train_batch_size=4", f"{A}.actor.ppo_mini_batch_size=2")
    assert run.schedule.minibatch_dp_ranks == 2  # 2 prompts per mini-batch: one whole group per rank and block
    assert ("2 optimizer steps per global step (ppo_mini_batch_size=2 prompts each, cut as verl cuts them over 2 "
            "data-parallel ranks: mini-batch j is every trainer rank's j-th block") in run.describe()
    assert not [d for d in run.decisions if "ppo_mini_batch_size" in d]
    with pytest.warns(UserWarning, match=r"ppo_mini_batch_size=1: verl cuts each of the 2 trainer ranks' shares"):
        odd = _build(tiny_flux_dir, *two, "data.train_batch_size=2", f"{A}.actor.ppo_mini_batch_size=1")
    assert odd.schedule.minibatch_dp_ranks == 1 and "prompts each, in order" in odd.describe()
    [line] = [d for d in odd.decisions if d.startswith(f"{A}.actor.ppo_mini_batch_size=1")]
    assert "would split prompt groups" in line and "j-th contiguous block of whole prompt groups" in line


TWO_TRAINER_RANKS = ["trainer.digenrl.mode=disaggregated", "trainer.digenrl.pools.trainer.workers_per_node=2",
                     f"{A}.actor.strategy=ddp", f"{A}.rollout.n=2"]


@pytest.mark.parametrize("batch,mini,dp", [(4, 2, 2), (6, 2, 2), (2, 1, 1), (6, 3, 1), (3, 3, 1)])
def test_the_config_warns_exactly_when_the_schedule_falls_back(tiny_flux_dir, batch, mini, dp):
    """One rule (`schedule.config.verl_cut_keeps_groups`) for both layers: the schedule cuts over the 2 trainer ranks
    or falls back to whole contiguous groups, and the config layer warns exactly on the fall-back (one mini-batch,
    3 prompts over 2 ranks: nothing to cut, no warning)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _build(tiny_flux_dir, *TWO_TRAINER_RANKS, f"data.train_batch_size={batch}",
                     f"{A}.actor.ppo_mini_batch_size={mini}")
    warned = [str(w.message) for w in caught if "verl cuts each of the 2 trainer ranks" in str(w.message)]
    assert run.schedule.minibatch_dp_ranks == dp
    assert bool(warned) == (batch // mini > 1 and dp == 1), warned


def test_the_loss_is_normalised_over_the_mini_batch_rows():
    rows = list(range(16))  # a step of 16 samples, K=3 trained steps each
    task = Task(1, TaskKind.UPDATE, 0, 0, ("trn:0",), 0, (("trn:0", (0, 1)),))
    whole = RayExecutor({}, lambda step: rows, AdvantageConfig(), 3)
    halves = RayExecutor({}, lambda step: rows, AdvantageConfig(), 3, mini_batches_per_step=2)
    assert whole.loss_denominator(task) == 48.0 and halves.loss_denominator(task) == 24.0


GRAD_TOL = 1e-5  # as tests/trainer/test_trainer_e2e_on_cpu.py


class OptStepGradientExecutor(RayExecutor):
    """Records, before each OPT_STEP of step 0, the gradient it will reduce (summed over the trainer ranks)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.grads: list[dict[str, torch.Tensor]] = []

    def submit(self, task):
        if task.kind == TaskKind.OPT_STEP and task.step == 0:
            parts = ray.get([self.workers[w].accumulated_gradients.remote() for w in task.workers])
            self.grads.append({k: sum(p[k] for p in parts if k in p) for k in parts[0]})
        super().submit(task)


class GradientTrainer(DigenRLTrainer):
    def make_executor(self):
        return OptStepGradientExecutor(self.workers, self.step_batch, self.run.advantage,
                                       self.run.policy.rollout.num_train_steps, on_result=self.on_result,
                                       on_checkpoint=self.on_checkpoint,
                                       mini_batches_per_step=self.run.schedule.mini_batches_per_step)


def _max_rel_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in a)


@pytest.mark.slow
def test_two_optimizer_steps_match_the_per_timestep_colocated_loop(train_run):
    # 2 prompts x 4 samples, ppo_mini_batch_size=1: two optimizer steps in the global step. AdamW's eps=1 makes the
    # first step's weight change linear in its gradient (at eps=1e-8 it is ~lr*sign(g), which flips on elements that
    # cancel to ~0 and would move the second mini-batch's gradient by more than rounding), and lr=1e-2 makes the
    # change matter: the second mini-batch is trained at weights the first one moved.
    shape = ["data.train_batch_size=2", f"{A}.rollout.n=4", "trainer.total_training_steps=1",
             f"{A}.actor.ppo_mini_batch_size=1", f"{A}.actor.optim.eps=1.0", f"{A}.actor.optim.lr=1e-2"]
    reference = train_run(*shape, "trainer.digenrl.mode=colocated", "trainer.digenrl.tsp.enabled=false",
                          trainer_cls=GradientTrainer, name="per_timestep")
    disagg = train_run(*shape, *DISAGG, trainer_cls=GradientTrainer, name="disaggregated")
    # recomputed old log-probs: the fp32 diffusers trainer recomputes the rollout's log-probs exactly, but only with
    # the step-start weights; the second mini-batch must not use the weights the first optimizer step produced
    recompute = train_run(*shape, *DISAGG, f"{A}.rollout.recompute_old_log_probs=true", trainer_cls=GradientTrainer,
                          name="recompute")
    for t in (reference, disagg, recompute):
        opts = [c.task for c in t.driver.trace.sorted_completions() if c.task.kind == TaskKind.OPT_STEP]
        assert [(o.version, sorted(o.flags)) for o in opts] == [(0, ["minibatch"]), (1, [])]
        assert check_run(t.run.schedule, t.driver.trace.completions) == []
        assert len(t.executor.grads) == 2
    kinds = {c.task.kind for c in disagg.driver.trace.sorted_completions()}
    assert TaskKind.SYNC in kinds  # a disaggregated run (TAG may or may not fire at this size)
    ref = reference.executor.grads
    assert all(max(float(g.abs().max()) for g in step.values()) > 0 for step in ref)
    first_vs_second = _max_rel_diff(ref[1], ref[0])
    assert first_vs_second > 100 * GRAD_TOL  # the two mini-batches are different data
    errors = {f"{name} opt {j}": _max_rel_diff(t.executor.grads[j], ref[j])
              for name, t in (("disaggregated", disagg), ("recompute", recompute)) for j in (0, 1)}
    print(f"per-OPT_STEP gradient errors vs the per-timestep colocated loop (k=2): {errors}")
    assert max(errors.values()) <= GRAD_TOL, errors
    # the step's logged grad_norm is the mean over its two optimizer steps (verl's mean over mini-batches)
    norms = [float(torch.sqrt(sum((g.double() ** 2).sum() for g in step.values()))) for step in ref]
    assert reference.reporter.history[0]["actor/grad_norm"] == pytest.approx(sum(norms) / 2, rel=1e-4), norms
    col = ray.get(reference.workers["col:0"].trainable_state.remote())
    trn = ray.get(disagg.workers["trn:0"].trainable_state.remote())
    gen = ray.get(disagg.workers["gen:0"].trainable_state.remote())
    assert _max_rel_diff(trn, col) <= GRAD_TOL and _max_rel_diff(gen, trn) == 0.0  # weights synced once, at the end


@pytest.mark.slow
def test_two_optimizer_steps_with_tcss_keep_the_schedule_invariants(train_run):
    t = train_run("data.train_batch_size=2", f"{A}.rollout.n=4", "trainer.total_training_steps=3",
                  f"{A}.actor.ppo_mini_batch_size=1", *DISAGG[:-1], "trainer.digenrl.tcss.staleness=1",
                  "trainer.digenrl.tcss.guard=false", "trainer.digenrl.tcss.max_stale_fraction=0.5", name="tcss")
    completions = t.driver.trace.completions
    assert check_run(t.run.schedule, completions) == []
    opts = sorted((c.task.step, c.task.version) for c in completions if c.ok and c.task.kind == TaskKind.OPT_STEP)
    assert opts == [(0, 0), (0, 1), (1, 1), (1, 2), (2, 2), (2, 3)]
    stale = [c for c in completions if c.ok and "stale" in c.task.flags]
    print(f"TCSS with 2 optimizer steps per global step: {len(stale)} stale generation task(s)")
    versions = {s["version"] for s in t.worker_stats().values()}
    assert versions == {3}  # after the last SYNC every worker holds the last version
