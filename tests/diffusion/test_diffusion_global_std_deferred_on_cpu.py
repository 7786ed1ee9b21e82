"""verl-omni's global std (`algorithm.global_std=true`) without the step barrier: the deferred scaling.

The executor's real UPDATE / OPT_STEP code (`trainer.ray_executor.RayExecutor`) drives one in-process trainer rank:
its UPDATE accumulates the tiny denoiser's real Flow-GRPO / DanceGRPO loss (`diffusion.tsp.accumulate_gradients`),
its OPT_STEP is the package trainer's own `workers.roles.TrainingMixin.opt_step` (scale, clip, AdamW). A step run the
barrier's way (every group scored, then the advantages) and the deferred way (each group trained as soon as it is
scored, in a scoring order chosen so the clamp's candidates must wait) give the same gradient and weights to 1e-5,
on a constructed batch whose advantages are partly clamped. Two mutations (a clamped sample trained early, the scale
applied twice) must break the equality, so the comparison can fail.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from digenrl_verl.diffusion.advantages import (AdvantageConfig, certainly_unclamped, normalize_rewards,
                                               std_lower_bound)
from digenrl_verl.diffusion.loss import LossConfig
from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients
from digenrl_verl.schedule.types import Task, TaskKind
from digenrl_verl.trainer import ray_executor
from digenrl_verl.trainer.ray_executor import RayExecutor
from digenrl_verl.workers.roles import TrainingMixin

TOL = 1e-5
GROUP = 3
PROMPTS = ["a red cube", "a blue sphere", "a green cone", "a white torus"]
# group 0 has an outlier (a = +2 against -1, -1): scored first, its |a| exceed c x the early bound and must wait;
# with c = 1 the final std (~0.9) clamps the outlier's advantage
REWARDS = [0.0, 0.0, 3.0, 0.4, 0.5, 0.6, 0.2, 0.9, 0.5, 1.0, 1.1, 0.7]
CLIP = 1.0
ROLLOUTS = {
    "flow_grpo": RolloutConfig(num_inference_steps=5, sde_type="sde", noise_level=0.7),
    "dance_grpo": RolloutConfig(num_inference_steps=6, sde_type="dance", noise_level=0.3,
                                timestep_selection="dance_grpo", timestep_fraction=0.6),
}


class _Call:
    """An actor method: `.remote(...)` runs it here and returns a fresh ref."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        self.fn(*args)
        return object()


class _Rank(TrainingMixin):
    """One trainer rank in this process: the package trainer's `opt_step`, an UPDATE that accumulates the real loss
    over the rows it is named (the executor's arguments, unpacked by the package trainer's `update_call`)."""

    def __init__(self, adapter, cond, traj, loss_cfg: LossConfig, scale_twice: bool = False) -> None:
        self.adapter, self.cond, self.traj, self.loss_cfg = adapter, cond, traj, loss_cfg
        self.version, self.rank, self.busy_s, self.skipped_steps = 0, 0, 0.0, 0
        self.step_start_weights = {}
        self.grad_sync = SimpleNamespace(reduce_grads=lambda params: None, full=lambda t: t)
        # AdamW's eps=1 keeps its first step linear in the gradient (at 1e-8 it is ~lr*sign(g), which flips on elements
        # that cancel to ~0); lr=1 makes the step large against the weights' rounding
        self.train_spec = SimpleNamespace(optim=SimpleNamespace(grad_clip=1.0, lr=1.0), recompute_old_log_probs=False)
        self.lr_factor = lambda step: 1.0
        self.optimizer = torch.optim.AdamW(list(self.trainable().values()), lr=1.0, eps=1.0)
        self.scale_twice = scale_twice
        self.stepped_grads: dict[str, torch.Tensor] = {}
        self.update_remote = _Call(self.update_call)
        self.opt_step_call = _Call(self._opt_step)

    def trainable(self) -> dict[str, torch.Tensor]:
        return {str(i): p for i, p in enumerate(self.adapter.trainable_parameters())}

    def update(self, sample_ids, advantages, denominator, tsp, version, max_share, *parts) -> None:
        idx = torch.tensor(list(sample_ids))
        accumulate_gradients(self.adapter, self.cond.index_select(idx), self.traj.index_select(idx), advantages,
                             self.loss_cfg, TSPConfig("batched"), denominator)

    def _opt_step(self, version, grad_scale=1.0) -> None:
        scale = grad_scale * (grad_scale if self.scale_twice else 1.0)
        self.stepped_grads = {k: p.grad.detach() * scale for k, p in self.trainable().items() if p.grad is not None}
        TrainingMixin.opt_step(self, version, scale)


class _Actor:
    def __init__(self, rank: _Rank) -> None:
        self.update_call, self.opt_step = rank.update_remote, rank.opt_step_call


class _Batch:
    def __init__(self, uids) -> None:
        self.non_tensor_batch = {"uid": uids}

    def __len__(self) -> int:
        return len(self.non_tensor_batch["uid"])


def _setup(make_tiny_adapter, name):
    adapter = make_tiny_adapter()
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    keys = [SampleKey(1, f"u{i // GROUP}", i % GROUP) for i in range(len(prompts))]
    cond = adapter.encode_prompts(prompts)
    traj = rollout(adapter, cond, keys, ROLLOUTS[name])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # off-policy a little, so the ratio clip is active on some rows
        for p in adapter.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 2e-3)
    return adapter, cond, traj


def _run_step(adapter, cond, traj, cfg: AdvantageConfig, order, *, scale_twice=False, ranks=1):
    """One global step through the executor: groups scored in `order`, each UPDATEd as soon as the executor allows
    (the barrier: after the last score), then OPT_STEP. `ranks` trainer ranks share the model (their gradients add
    up, as the all-reduce sums them); rank 0 steps. Returns (rank 0, executor)."""
    trainers = tuple(f"trn:{r}" for r in range(ranks))
    rank = _Rank(adapter, cond, traj, LossConfig(clip_ratio=1e-3), scale_twice)
    actors = {w: _Actor(rank) for w in trainers}
    for w in trainers[1:]:
        actors[w].opt_step = _Call(lambda version, grad_scale=1.0: None)
    uids = [f"u{i // GROUP}" for i in range(len(REWARDS))]
    ex = RayExecutor(actors, lambda step: _Batch(uids), cfg, traj.num_steps)
    ex._trajectories.update({(0, s): "traj" for s in range(len(REWARDS))})
    ids = itertools.count()
    group = [tuple(range(g * GROUP, (g + 1) * GROUP)) for g in order]

    def update(g, samples):
        split = tuple((w, samples[i::ranks]) for i, w in enumerate(trainers))
        ex.submit(Task(next(ids), TaskKind.UPDATE, 0, g, trainers, 0, split))

    for g, samples in zip(order, group):
        ex._scores[0].update({s: REWARDS[s] for s in samples})
        if cfg.deferred_std:
            update(g, samples)
    if not cfg.deferred_std:
        for g, samples in zip(order, group):
            update(g, samples)
    ex.submit(Task(next(ids), TaskKind.OPT_STEP, 0, None, trainers, 1, tuple((w, ()) for w in trainers)))
    return rank, ex


def _rel(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)) for k in a)


def _weights(adapter) -> dict[str, torch.Tensor]:
    return {str(i): p.detach().clone() for i, p in enumerate(adapter.trainable_parameters())}


def _compare(make_tiny_adapter, name, order, ranks=1, **mutation):
    adapter, cond, traj = _setup(make_tiny_adapter, name)
    cfg = AdvantageConfig(adv_clip_max=CLIP, timesteps_per_sample=traj.num_steps)
    start = {k: v.clone() for k, v in _weights(adapter).items()}
    barrier, _ = _run_step(adapter, cond, traj, cfg, order, ranks=ranks)
    after_barrier = _weights(adapter)
    with torch.no_grad():
        for p, v in zip(adapter.trainable_parameters(), start.values()):
            p.copy_(v)
    deferred, ex = _run_step(adapter, cond, traj, replace(cfg, deferred_std=True), order, ranks=ranks, **mutation)
    return barrier, deferred, ex, after_barrier, _weights(adapter), start


@pytest.mark.parametrize("name", list(ROLLOUTS))
def test_deferred_scaling_gives_the_barriers_gradient_and_weights_with_clamped_advantages(make_tiny_adapter, name):
    barrier, deferred, ex, w_barrier, w_deferred, start = _compare(make_tiny_adapter, name, order=(0, 1, 2, 3))
    k = ex.rows_per_sample
    adv = normalize_rewards(torch.tensor(REWARDS), [f"u{i // GROUP}" for i in range(len(REWARDS))],
                            AdvantageConfig(adv_clip_max=CLIP, timesteps_per_sample=k)).advantages
    assert int((adv.abs() == CLIP).sum()) >= 1  # the batch has clamped advantages
    assert 0 < ex.late_samples < len(REWARDS)  # some trained at once, some waited for the std
    moved = {k: w_barrier[k] - start[k] for k in start}  # the barrier's weight change, and the deferred one's
    grad_err, weight_err = _rel(deferred.stepped_grads, barrier.stepped_grads), _rel(w_deferred, w_barrier)
    change_err = _rel({k: w_deferred[k] - start[k] for k in start}, moved)
    print(f"{name}: K={k}, late samples {ex.late_samples}/{len(REWARDS)}, clamped {int((adv.abs() == CLIP).sum())}; "
          f"gradient error {grad_err:.2e}, weight error {weight_err:.2e}, weight-change error {change_err:.2e}, "
          f"weight change {_rel(w_barrier, start):.2e}")
    assert grad_err <= TOL and weight_err <= TOL and change_err <= 10 * TOL
    assert _rel(w_barrier, start) > 1000 * TOL  # the step moved the weights far more than the tolerance


def test_every_scoring_order_gives_the_barriers_gradient(make_tiny_adapter):
    for order in [(3, 2, 1, 0), (1, 0, 3, 2)]:
        barrier, deferred, ex, *_ = _compare(make_tiny_adapter, "flow_grpo", order)
        assert _rel(deferred.stepped_grads, barrier.stepped_grads) <= TOL, order


def test_the_late_samples_spread_over_more_ranks_than_there_are_of_them(make_tiny_adapter):
    """4 trainer ranks, 3 late samples: one rank pads its pass with a late sample at advantage 0."""
    barrier, deferred, ex, *_ = _compare(make_tiny_adapter, "flow_grpo", (0, 1, 2, 3), ranks=4)
    assert ex.late_samples == 3
    assert _rel(deferred.stepped_grads, barrier.stepped_grads) <= TOL


def test_a_clamped_sample_trained_early_breaks_the_equality(make_tiny_adapter, monkeypatch):
    monkeypatch.setattr(ray_executor, "certainly_unclamped", lambda a, bound, cfg: True)  # the mutation
    barrier, deferred, ex, *_ = _compare(make_tiny_adapter, "flow_grpo", order=(0, 1, 2, 3))
    assert ex.late_samples == 0
    assert _rel(deferred.stepped_grads, barrier.stepped_grads) > 100 * TOL


def test_the_scale_applied_twice_breaks_the_equality(make_tiny_adapter):
    barrier, deferred, *_ = _compare(make_tiny_adapter, "flow_grpo", order=(0, 1, 2, 3), scale_twice=True)
    assert _rel(deferred.stepped_grads, barrier.stepped_grads) > 100 * TOL


@pytest.mark.parametrize("unbiased,t", [(True, 1), (True, 4), (False, 3)])
def test_the_std_bound_holds_for_every_prefix_and_certain_samples_are_not_clamped(unbiased, t):
    """For every scoring prefix of a random step the bound is at most the step's std, and a sample the bound calls
    certain is not clamped by the step's final advantages."""
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(24, generator=g, dtype=torch.float64) * 2
    rewards[5] = 9.0  # an outlier, clamped at the end
    uids = [i // 4 for i in range(24)]
    cfg = AdvantageConfig(adv_clip_max=1.5, unbiased_std=unbiased, timesteps_per_sample=t)
    final = normalize_rewards(rewards, uids, cfg).advantages
    full_std = float(rewards.repeat_interleave(t).std(correction=int(unbiased)))
    certain = 0
    for cut in range(4, 25, 4):
        seen = rewards[:cut].tolist()
        bound = std_lower_bound(seen, 24, cfg)
        assert bound <= full_std + 1e-12
        for i in range(cut):
            members = [j for j in range(cut) if uids[j] == uids[i]]
            a = rewards[i].item() - float(rewards[members].mean())
            if certainly_unclamped(a, bound, cfg):
                certain += 1
                assert abs(a / (full_std + cfg.epsilon)) <= 1.5 + 1e-9  # the clamp does not touch it
                assert float(final[i]) == pytest.approx(a / (full_std + cfg.epsilon), rel=1e-6, abs=1e-7)
    assert float(final.abs().max()) == pytest.approx(1.5) and certain > 0
