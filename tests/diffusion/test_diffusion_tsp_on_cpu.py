import pytest
import torch

from digenrl_verl.diffusion.loss import LossConfig
from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients, compute_log_probs, count_passes
from digenrl_verl.workers.roles import TrainingMixin
from digenrl_verl.workers.specs import TrainSpec

PROMPTS = ["a red cube", "a blue sphere", "a green cone"]
CFGS = {
    "flow_grpo": RolloutConfig(num_inference_steps=5, sde_type="sde", noise_level=0.7),
    "window_cps": RolloutConfig(num_inference_steps=6, sde_type="cps", noise_level=0.8, timestep_selection="window",
                                sde_window_size=3, sde_window_range=(0, 5)),
    "dance": RolloutConfig(num_inference_steps=6, sde_type="dance", noise_level=0.3, timestep_selection="dance_grpo",
                           timestep_fraction=0.6),
}


def _sample(adapter, cfg, group=2):
    prompts = [p for p in PROMPTS for _ in range(group)]
    keys = [SampleKey(1, f"u{i // group}", i % group) for i in range(len(prompts))]
    cond = adapter.encode_prompts(prompts)
    return cond, rollout(adapter, cond, keys, cfg)


def _grads(adapter):
    return [p.grad.detach().clone() for p in adapter.trainable_parameters()]


def _zero(adapter):
    for p in adapter.trainable_parameters():
        p.grad = None


def _max_rel_err(a, b):
    return max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)) for x, y in zip(a, b))


def _perturb(adapter, scale=2e-3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


@pytest.mark.parametrize("name", list(CFGS))
@pytest.mark.parametrize("mode", ["per_timestep", "batched"])
def test_on_policy_ratio_is_one(tiny_adapter, name, mode):
    cond, traj = _sample(tiny_adapter, CFGS[name])
    recomputed = compute_log_probs(tiny_adapter, cond, traj, tsp_cfg=TSPConfig(mode=mode))
    assert (torch.exp(recomputed - traj.log_probs) - 1).abs().max() <= 1e-6
    adv = torch.linspace(-1, 1, traj.batch_size)
    stats = accumulate_gradients(tiny_adapter, cond, traj, adv, LossConfig(), TSPConfig(mode=mode),
                                 traj.batch_size * traj.num_steps)
    assert abs(stats.ratio_min - 1) <= 1e-6 and abs(stats.ratio_max - 1) <= 1e-6
    assert stats.clipped == 0 and stats.rows == traj.batch_size * traj.num_steps


@pytest.mark.parametrize("name", list(CFGS))
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_batched_gradient_equals_per_timestep_for_any_chunk(make_tiny_adapter, name, kl_coef):
    adapter = make_tiny_adapter(seed=1)
    cond, traj = _sample(adapter, CFGS[name])
    _perturb(adapter)  # off-policy a little: ratios ≠ 1, some rows clipped, reference ≠ policy
    adv = torch.tensor([1.0, -0.5, 2.0, -2.0, 0.3, -0.3])
    loss_cfg = LossConfig(clip_ratio=1e-4, kl_coef=kl_coef)
    denom = traj.batch_size * traj.num_steps
    accumulate_gradients(adapter, cond, traj, adv, loss_cfg, TSPConfig("per_timestep"), denom)
    ref = _grads(adapter)
    assert max(float(g.abs().max()) for g in ref) > 0
    stats = []
    for chunk in (1, 3, None, 0):
        _zero(adapter)
        stats.append(accumulate_gradients(adapter, cond, traj, adv, loss_cfg, TSPConfig("batched", chunk), denom))
        assert _max_rel_err(_grads(adapter), ref) <= 1e-5, chunk
    assert 0 < stats[0].clipped < stats[0].rows  # both branches of the clip are exercised
    assert stats[0].metrics()["actor/loss"] == pytest.approx(stats[2].metrics()["actor/loss"], rel=1e-5)
    _zero(adapter)


def test_partition_invariance_of_the_normalisation(make_tiny_adapter):
    adapter = make_tiny_adapter(seed=2)
    cond, traj = _sample(adapter, CFGS["window_cps"], group=3)  # 9 samples
    _perturb(adapter)
    adv = torch.linspace(-1.5, 1.5, 9)
    loss_cfg, tsp = LossConfig(clip_ratio=1e-2), TSPConfig("batched", 4)
    denom = traj.batch_size * traj.num_steps
    accumulate_gradients(adapter, cond, traj, adv, loss_cfg, tsp, denom)
    whole = _grads(adapter)
    # Uneven micro-batches, processed in another order (as two ranks would), accumulate the same gradient.
    _zero(adapter)
    for idx in ([5, 6, 7, 8], [0, 1, 2, 3, 4]):
        i = torch.tensor(idx)
        accumulate_gradients(adapter, cond.index_select(i), traj.index_select(i), adv[i], loss_cfg, tsp, denom)
    assert _max_rel_err(_grads(adapter), whole) <= 1e-5
    # A per-micro-batch mean (the naive normalisation) would not: the partition matters for it.
    _zero(adapter)
    for idx in ([5, 6, 7, 8], [0, 1, 2, 3, 4]):
        i = torch.tensor(idx)
        accumulate_gradients(adapter, cond.index_select(i), traj.index_select(i), adv[i], loss_cfg, tsp,
                             2 * len(idx) * traj.num_steps)
    assert _max_rel_err(_grads(adapter), whole) > 1e-3
    _zero(adapter)


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_lockstep_padding_passes_run_the_model_but_add_no_gradient(make_tiny_adapter, kl_coef):
    adapter = make_tiny_adapter(seed=3)
    cond, traj = _sample(adapter, CFGS["flow_grpo"], group=1)  # 3 samples
    _perturb(adapter)
    adv = torch.tensor([1.0, -1.0, 0.5])
    loss_cfg, tsp = LossConfig(clip_ratio=1e-2, kl_coef=kl_coef), TSPConfig("batched", 2)
    denom = traj.batch_size * traj.num_steps
    own = count_passes(traj.batch_size, traj.num_steps, tsp)
    assert own == -(-traj.batch_size * traj.num_steps // 2)
    plain = accumulate_gradients(adapter, cond, traj, adv, loss_cfg, tsp, denom)
    ref = _grads(adapter)
    _zero(adapter)
    calls = []
    hook = adapter.transformer.register_forward_hook(lambda *a: calls.append(1))
    try:
        padded = accumulate_gradients(adapter, cond, traj, adv, loss_cfg, tsp, denom, min_passes=own + 3)
        forwards = len(calls)
        calls.clear()
        old = compute_log_probs(adapter, cond, traj, tsp_cfg=tsp, min_passes=own + 2)
        assert len(calls) == own + 2
    finally:
        hook.remove()
    # every pass is a policy forward (the KL term's reference forwards run on the frozen copy, not hooked here)
    assert forwards == own + 3
    assert all(torch.equal(g, r) for g, r in zip(_grads(adapter), ref))  # padding adds exactly nothing
    assert padded.rows == plain.rows and padded.metrics() == plain.metrics()
    assert torch.equal(old, compute_log_probs(adapter, cond, traj, tsp_cfg=tsp))
    _zero(adapter)


def test_recomputed_old_log_probs_and_errors(tiny_adapter):
    cond, traj = _sample(tiny_adapter, CFGS["flow_grpo"])
    old = compute_log_probs(tiny_adapter, cond, traj)
    adv = torch.ones(traj.batch_size)
    accumulate_gradients(tiny_adapter, cond, traj, adv, LossConfig(), TSPConfig(), 30, old_log_probs=old)
    ref_lp = compute_log_probs(tiny_adapter, cond, traj, reference=True)
    torch.testing.assert_close(ref_lp, old)  # reference = the initial weights here
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        accumulate_gradients(tiny_adapter, cond, traj, adv, LossConfig(), TSPConfig(), 30, old_log_probs=old[:, :2])
    with pytest.raises(ValueError, match=r"mode='stacked'.*per_timestep"):  # a ConfigError naming the field
        TSPConfig(mode="stacked")
    with pytest.raises(ValueError, match="chunk_size=-1"):
        TSPConfig(chunk_size=-1)
    ode_traj = rollout(tiny_adapter, cond, [SampleKey(0, "u", i) for i in range(6)],
                       RolloutConfig(num_inference_steps=4, sde_type="ode", noise_level=0.0))
    with pytest.raises(ValueError, match="cannot be trained"):
        accumulate_gradients(tiny_adapter, cond, ode_traj, adv, LossConfig(), TSPConfig(), 1)


class _RecomputeHost(TrainingMixin):
    """The trainer's old-log-prob recompute pass on a bare adapter (no Ray, no process group)."""

    def __init__(self, adapter, log_prob_micro_batch_size, lockstep=False):
        self.adapter = adapter
        self.train_spec = TrainSpec(recompute_old_log_probs=True, log_prob_micro_batch_size=log_prob_micro_batch_size)
        self.lockstep = lockstep


@pytest.mark.parametrize("mode", ["per_timestep", "batched"])
def test_old_log_probs_in_log_prob_micro_batches_equal_one_pass(make_tiny_adapter, mode):
    # actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu: the recompute pass runs in chunks of that many
    # samples per rank (verl-omni's meaning); the log-probs do not depend on the chunking
    adapter = make_tiny_adapter(seed=4)
    cond, traj = _sample(adapter, CFGS["window_cps"], group=2)  # 6 samples
    _perturb(adapter)
    tsp = TSPConfig(mode, 4 if mode == "batched" else None)
    whole = compute_log_probs(adapter, cond, traj, tsp_cfg=tsp)
    calls = []
    hook = adapter.transformer.register_forward_hook(lambda *a: calls.append(1))
    try:
        for size, forwards in ((None, count_passes(6, traj.num_steps, tsp)), (6, count_passes(6, traj.num_steps, tsp)),
                               (4, count_passes(4, traj.num_steps, tsp) + count_passes(2, traj.num_steps, tsp)),
                               (1, 6 * count_passes(1, traj.num_steps, tsp))):
            calls.clear()
            got = _RecomputeHost(adapter, size)._old_log_probs(cond, traj, tsp, max_share=6)
            assert torch.allclose(got, whole, rtol=0, atol=1e-5), size
            assert len(calls) == forwards, size
        # lock-step (FSDP2) ranks pad to the passes of the largest share: here 8 samples in chunks of 4
        calls.clear()
        host = _RecomputeHost(adapter, 4, lockstep=True)
        got = host._old_log_probs(cond, traj, tsp, max_share=8)
        assert torch.allclose(got, whole, rtol=0, atol=1e-5)
        assert len(calls) == 2 * count_passes(4, traj.num_steps, tsp)
    finally:
        hook.remove()
