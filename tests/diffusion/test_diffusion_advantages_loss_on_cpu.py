import math

import pytest
import torch

from digenrl_verl.diffusion.advantages import AdvantageConfig, combine_rewards, normalize_rewards
from digenrl_verl.diffusion.loss import LossConfig, LossStats, policy_loss
from digenrl_verl.metric_names import METRICS as M

UIDS = ["a", "a", "b", "b"]
R = torch.tensor([1.0, 2.0, 3.0, 4.0])


def test_global_std_unbiased_default():
    res = normalize_rewards(R, UIDS, AdvantageConfig())
    std = math.sqrt(((R - 2.5) ** 2).sum().item() / 3)  # 1.2910
    expected = torch.tensor([-0.5, 0.5, -0.5, 0.5]) / (std + 1e-4)
    torch.testing.assert_close(res.advantages, expected)
    assert res.num_groups == 2 and res.zero_std_groups == 0


def test_group_std_biased_and_no_std():
    res = normalize_rewards(R, UIDS, AdvantageConfig(global_std=False, unbiased_std=False, epsilon=1e-8))
    torch.testing.assert_close(res.advantages, torch.tensor([-1.0, 1.0, -1.0, 1.0]))  # group std 0.5
    res = normalize_rewards(R, UIDS, AdvantageConfig(global_std=False))  # unbiased group std √0.5
    torch.testing.assert_close(res.advantages, torch.tensor([-1.0, 1.0, -1.0, 1.0]) * 0.5 / (math.sqrt(0.5) + 1e-4))
    res = normalize_rewards(R * 10, UIDS, AdvantageConfig(norm_adv_by_std=False, adv_clip_max=None))
    torch.testing.assert_close(res.advantages, torch.tensor([-5.0, 5.0, -5.0, 5.0]))


def test_clamp_zero_std_groups_and_singletons():
    res = normalize_rewards(torch.tensor([0.0, 0.0, 0.0, 10.0]), ["a", "a", "a", "a"],
                            AdvantageConfig(adv_clip_max=1.0))
    # mean 2.5, unbiased std 5: [-0.5, -0.5, -0.5, 1.5] → the last is clamped to 1.0
    torch.testing.assert_close(res.advantages, torch.tensor([-2.5, -2.5, -2.5, 1.0 * (5 + 1e-4)]) / (5 + 1e-4))
    res = normalize_rewards(torch.tensor([1.0, 1.0, 2.0, 3.0, 7.0]), ["a", "a", "b", "b", "c"], AdvantageConfig())
    assert res.zero_std_groups == 2 and res.num_groups == 3  # "a" (equal) and "c" (single)
    assert res.zero_std_ratio == pytest.approx(2 / 3)
    assert res.advantages[0] == 0 and res.advantages[1] == 0 and res.advantages[4] == 0
    assert "adv/zero_std_ratio" in res.metrics()


def test_multi_reward_modes():
    r1, r2 = R, 5.0 - R
    uids = UIDS
    cfg = AdvantageConfig()
    ws = combine_rewards({"x": r1, "y": r2}, {"x": 1.0, "y": 1.0}, uids, cfg, "weighted_sum")
    assert torch.all(ws.advantages == 0) and ws.zero_std_groups == 2  # the sum is constant
    ws2 = combine_rewards({"x": r1, "y": r2}, {"x": 2.0, "y": 1.0}, uids, cfg, "weighted_sum")
    torch.testing.assert_close(ws2.advantages, normalize_rewards(r1 + 5.0, uids, cfg).advantages)
    nw = combine_rewards({"x": r1, "y": r2}, {"x": 1.0, "y": 0.5}, uids, cfg, "normalize_then_weight")
    a1 = normalize_rewards(r1, uids, cfg).advantages
    torch.testing.assert_close(nw.advantages, 0.5 * a1)  # A(r2) = −A(r1)
    assert nw.zero_std_groups == 0
    with pytest.raises(ValueError, match="weighted_sum"):
        combine_rewards({"x": r1}, {"x": 1.0}, uids, cfg, "mean")
    with pytest.raises(ValueError, match=r"\['z'\].*\['x'\]"):
        combine_rewards({"x": r1}, {"z": 1.0}, uids, cfg)


def test_clipped_objective_by_hand():
    logp = torch.tensor([0.0, 0.1, -0.2, 0.1], requires_grad=True)
    old = torch.zeros(4)
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0])
    loss, st = policy_loss(logp, old, adv, LossConfig(clip_ratio=0.05), loss_denominator=8)
    r = [1.0, math.exp(0.1), math.exp(-0.2), math.exp(0.1)]
    rows = [-1.0, r[1], max(-2 * r[2], -2 * 0.95), max(-r[3], -1.05)]  # last row is clipped: -1.05
    assert loss.item() == pytest.approx(sum(rows) / 8, rel=1e-6)
    loss.backward()
    # d/dlogp of -A·ratio where unclipped, 0 where the clipped branch is active
    expected = torch.tensor([-1.0, r[1], -2 * r[2], 0.0]) / 8
    torch.testing.assert_close(logp.grad, expected)
    m = st.metrics()
    assert m["actor/pg_clipfrac"] == pytest.approx(3 / 4)
    assert m["actor/approx_kl"] == pytest.approx(0.5 * (0 + 0.01 + 0.04 + 0.01) / 4, rel=1e-5)
    assert m["actor/ratio_min"] == pytest.approx(r[2], rel=1e-6)
    assert m["actor/ratio_max"] == pytest.approx(r[1], rel=1e-6)
    assert m["actor/ratio_mean"] == pytest.approx(sum(r) / 4, rel=1e-6)
    assert m["actor/pg_loss"] == pytest.approx(sum(rows) / 4, rel=1e-5)


@pytest.mark.parametrize("kl_type,denom,expected", [
    ("flow_grpo", "std_dev_t", [1 / (2 * 0.25), (4 / 3) / (2 * 4)]),  # sde_type='sde': ÷ σ_t²
    ("sigma_t", "std_dev_t", [1 / (2 * 0.25), (4 / 3) / (2 * 4)]),
    ("exact", "std", [1 / (2 * 0.01), (4 / 3) / 2]),
])
def test_kl_forms_by_hand(kl_type, denom, expected):
    mean = torch.zeros(2, 3, requires_grad=True)
    ref = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])
    stds = {"std_dev_t": torch.tensor([0.5, 2.0]), "std": torch.tensor([0.1, 1.0])}
    logp = torch.zeros(2)
    cfg = LossConfig(kl_coef=0.1, kl_type=kl_type)
    loss, st = policy_loss(logp, logp, torch.zeros(2), cfg, 2, mean=mean, ref_mean=ref, sde_type="sde",
                           **{denom: stds[denom]})
    assert loss.item() == pytest.approx(0.1 * sum(expected) / 2, rel=1e-6)
    assert st.metrics()["actor/kl_loss"] == pytest.approx(sum(expected) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="needs"):
        policy_loss(logp, logp, torch.zeros(2), cfg, 2, mean=mean, ref_mean=ref, sde_type="sde")


def test_stats_merge_and_validation():
    a = LossStats(rows=2, pg_sum=1.0, clipped=1, ratio_sum=2.0, ratio_min=0.9, ratio_max=1.1)
    b = LossStats(rows=2, pg_sum=3.0, clipped=0, ratio_sum=2.0, ratio_min=0.8, ratio_max=1.0)
    m = (a + b).metrics()
    assert m["actor/pg_loss"] == 1.0 and m["actor/pg_clipfrac"] == 0.25
    assert m["actor/ratio_min"] == 0.8 and m["actor/ratio_max"] == 1.1
    with pytest.raises(ValueError, match=r"kl_type=.*\['flow_grpo', 'exact', 'sigma_t'\]"):
        LossConfig(kl_type="k3")
    with pytest.raises(ValueError, match="clip_ratio"):
        LossConfig(clip_ratio=0)
    with pytest.raises(ValueError, match="loss_denominator"):
        policy_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), LossConfig(), 0)


def test_stale_and_on_policy_clip_fractions_are_counted_apart():
    # 6 rows, clip 0.05: rows 0-2 on-policy (ratio 1, 1, e^0.1: one clipped), rows 3-5 stale with ratios e^0.1,
    # e^-0.1, e^0.01: two clipped; the clipped branch (no gradient) wins on row 3 (A > 0, ratio > 1+ε) and row 2,
    # not on row 4 (A > 0, ratio < 1-ε: the unclipped, pessimistic branch keeps its gradient)
    logp = torch.tensor([0.0, 0.0, 0.1, 0.1, -0.1, 0.01], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0, -1.0])
    stale = torch.tensor([False, False, False, True, True, True])
    loss, st = policy_loss(logp, torch.zeros(6), adv, LossConfig(clip_ratio=0.05), 6, stale=stale)
    loss.backward()
    assert (logp.grad == 0).tolist() == [False, False, True, True, False, False]  # zero-grad rows: 2 and 3
    m = st.metrics()
    assert m["actor/pg_clipfrac"] == pytest.approx(3 / 6)
    assert m[M["onpolicy_clip_frac"]] == pytest.approx(1 / 3)
    assert m[M["stale_clip_frac"]] == pytest.approx(2 / 3)
    assert m[M["stale_zero_grad_frac"]] == pytest.approx(1 / 3)
    assert m[M["pg_zero_grad_frac"]] == pytest.approx(2 / 6)
    assert m[M["stale_rows"]] == 3
    # no mask: every row on-policy; merged with the masked stats the sums add up
    _, plain = policy_loss(logp.detach(), torch.zeros(6), adv, LossConfig(clip_ratio=0.05), 6)
    assert plain.metrics()[M["stale_rows"]] == 0 and plain.metrics()[M["stale_clip_frac"]] == 0.0
    assert plain.metrics()[M["onpolicy_clip_frac"]] == pytest.approx(3 / 6)
    both = (st + plain).metrics()
    assert both[M["stale_clip_frac"]] == pytest.approx(2 / 3)
    assert both[M["onpolicy_clip_frac"]] == pytest.approx((1 + 3) / (3 + 6))
    # run level, from the per-step metric rows: weighted by rows, not a mean of the steps' fractions
    run = LossStats.run_clip_metrics([st.metrics(), plain.metrics(), LossStats(rows=3, stale_rows=3).metrics()])
    assert run[M["stale_clip_frac"]] == pytest.approx(2 / 6)
    assert run[M["onpolicy_clip_frac"]] == pytest.approx(4 / 9)
    assert run[M["stale_zero_grad_frac"]] == pytest.approx(1 / 6)


def test_tsp_passes_the_stale_samples_to_their_rows(tiny_adapter, off_policy_rollout):
    # samples 0 and 3 of 6 are stale: their K rows each, whatever the chunking (chunks of 4 rows cross samples)
    from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients, compute_log_probs

    cond, traj = off_policy_rollout(2e-3)
    ratio = torch.exp(compute_log_probs(tiny_adapter, cond, traj) - traj.log_probs)
    clip = float((ratio - 1).abs().flatten().median())  # about half the rows clipped
    stale = torch.tensor([True, False, False, True, False, False])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    k = traj.num_steps
    for tsp in (TSPConfig("batched", 4), TSPConfig("per_timestep")):
        st = accumulate_gradients(tiny_adapter, cond, traj, adv, LossConfig(clip_ratio=clip), tsp, 6 * k,
                                  stale=stale)
        clipped = (ratio - 1).abs() > clip
        zero = ((adv[:, None] > 0) & (ratio > 1 + clip)) | ((adv[:, None] < 0) & (ratio < 1 - clip))
        m = st.metrics()
        assert m[M["stale_rows"]] == 2 * k
        assert m[M["stale_clip_frac"]] == pytest.approx(float(clipped[stale].float().mean()))
        assert m[M["onpolicy_clip_frac"]] == pytest.approx(float(clipped[~stale].float().mean()))
        assert m[M["stale_zero_grad_frac"]] == pytest.approx(float(zero[stale].float().mean()))
        assert 0 < m["actor/pg_clipfrac"] < 1  # the mask matters: stale and on-policy rows differ in general
        for p in tiny_adapter.trainable_parameters():
            p.grad = None
    with pytest.raises(ValueError, match="stale must be"):
        accumulate_gradients(tiny_adapter, cond, traj, adv, LossConfig(), TSPConfig(), 6 * k, stale=stale[:2])
