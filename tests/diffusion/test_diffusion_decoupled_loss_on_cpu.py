"""The decoupled objective for stale (TCSS) rows (`LossConfig.stale_is_cap`, from `trainer.digenrl.tcss.objective`):
a stale row adds w·(−A)·∇logp_θ with w = π_prox/π_b detached (π_prox = this forward's weights), rows over the cap add
nothing, and on-policy rows keep the clipped objective bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from digenrl_verl.diffusion.loss import LossConfig, LossStats, policy_loss
from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients, compute_log_probs
from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.schedule.config import TcssConfig

CLIP = 1e-4  # the recipes' clip
# 6 rows: 0-2 on-policy (ratio 1, e^0.1, e^-0.1), 3-5 stale with log-ratios vs their behaviour policy of
# +0.1, −0.1 and +2.0 (w = e^0.1, e^-0.1, e^2 ≈ 7.39 > the cap 5)
LOG_RATIO = [0.0, 0.1, -0.1, 0.1, -0.1, 2.0]
ADV = [1.0, 1.0, -1.0, 1.0, 1.0, -1.0]
STALE = [False, False, False, True, True, True]


def _rows(cfg: LossConfig, stale=STALE, denom: float = 6.0):
    logp = torch.tensor(LOG_RATIO, dtype=torch.float64, requires_grad=True)
    loss, st = policy_loss(logp, torch.zeros(6, dtype=torch.float64), torch.tensor(ADV, dtype=torch.float64), cfg,
                           denom, stale=None if stale is None else torch.tensor(stale))
    loss.backward()
    return loss, st, logp.grad


def test_stale_rows_get_the_importance_weighted_gradient_and_the_cap_drops_rows():
    loss, st, grad = _rows(LossConfig(clip_ratio=CLIP, stale_is_cap=5.0))
    w = [math.exp(x) for x in LOG_RATIO]
    # ∂loss/∂logp_i = −A_i·w_i / denominator on the stale rows within the cap, whatever the clip (both are outside it)
    assert grad[3].item() == pytest.approx(-ADV[3] * w[3] / 6, rel=1e-12)
    assert grad[4].item() == pytest.approx(-ADV[4] * w[4] / 6, rel=1e-12)
    assert grad[5].item() == 0.0  # w = e² > 5: dropped, as AReaL's behav_imp_weight_cap
    # the clipped objective gives rows 3 (A > 0, ratio > 1+ε) no gradient and row 4 the unclipped −A·ratio one
    _, st_clip, grad_clip = _rows(LossConfig(clip_ratio=CLIP))
    assert grad_clip[3].item() == 0.0 and grad_clip[4].item() == pytest.approx(-w[4] / 6)
    # the loss value of a stale row is −A·w (ρ = π_θ/π_prox = 1): rows 0-2 as clipped, row 5 contributes 0
    clipped_rows = [max(-a * math.exp(x), -a * min(max(math.exp(x), 1 - CLIP), 1 + CLIP))
                    for a, x in zip(ADV[:3], LOG_RATIO[:3])]
    assert loss.item() == pytest.approx((sum(clipped_rows) - ADV[3] * w[3] - ADV[4] * w[4]) / 6, rel=1e-12)
    m = st.metrics()
    assert m[M["stale_is_weight_mean"]] == pytest.approx(sum(w[3:]) / 3)
    assert m[M["stale_is_weight_max"]] == pytest.approx(w[5])
    assert m[M["stale_is_capped_frac"]] == pytest.approx(1 / 3)
    # zero-gradient rows: on-policy row 1 (A > 0, ratio > 1+ε; row 2: A < 0, ratio < 1−ε), stale row 5 (capped)
    assert m[M["stale_zero_grad_frac"]] == pytest.approx(1 / 3)
    assert m[M["pg_zero_grad_frac"]] == pytest.approx(3 / 6)
    assert (grad == 0).tolist() == [False, True, True, False, False, True]
    # the stale rows' clip fraction still measures how far they are from their behaviour policy
    assert m[M["stale_clip_frac"]] == 1.0 == st_clip.metrics()[M["stale_clip_frac"]]
    assert st_clip.metrics()[M["stale_is_capped_frac"]] == 0.0  # the clipped objective has no cap


def test_on_policy_rows_are_unchanged_bit_for_bit():
    _, st_d, grad_d = _rows(LossConfig(clip_ratio=CLIP, stale_is_cap=5.0))
    _, st_c, grad_c = _rows(LossConfig(clip_ratio=CLIP))
    assert torch.equal(grad_d[:3], grad_c[:3])  # the same bits on the on-policy rows of a mixed micro-batch
    # without stale rows the decoupled config is the clipped objective, value and gradient
    loss_d, _, g_d = _rows(LossConfig(clip_ratio=CLIP, stale_is_cap=5.0), stale=[False] * 6)
    loss_c, _, g_c = _rows(LossConfig(clip_ratio=CLIP), stale=None)
    assert torch.equal(loss_d, loss_c) and torch.equal(g_d, g_c)
    assert st_d.metrics()[M["onpolicy_clip_frac"]] == st_c.metrics()[M["onpolicy_clip_frac"]] == 2 / 3


def test_stale_rows_gradient_through_a_model_is_the_unclipped_importance_weighted_one(tiny_adapter,
                                                                                      off_policy_rollout):
    # a real forward: stale samples one "optimizer step" from their behaviour policy; the decoupled objective's
    # gradient equals that of the unclipped ratio objective −A·π_θ/π_b (whose gradient at θ is −A·w·∇logp_θ)
    cond, traj = off_policy_rollout(3e-2)
    w = torch.exp(compute_log_probs(tiny_adapter, cond, traj) - traj.log_probs)
    assert float((w - 1).abs().min()) > CLIP  # every row outside the recipes' clip
    stale = torch.ones(6, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    k = traj.num_steps

    def grads(loss_cfg: LossConfig, tsp: TSPConfig) -> tuple[dict[int, torch.Tensor], LossStats]:
        st = accumulate_gradients(tiny_adapter, cond, traj, adv, loss_cfg, tsp, 6 * k, stale=stale)
        out = {i: p.grad.clone() for i, p in enumerate(tiny_adapter.trainable_parameters())}
        for p in tiny_adapter.trainable_parameters():
            p.grad = None
        return out, st

    unclipped, _ = grads(LossConfig(clip_ratio=1e6), TSPConfig("batched"))
    for tsp in (TSPConfig("batched", 4), TSPConfig("per_timestep")):
        dec, st = grads(LossConfig(clip_ratio=CLIP, stale_is_cap=5.0), tsp)
        for name, gr in unclipped.items():
            torch.testing.assert_close(dec[name], gr, rtol=1e-5, atol=1e-9)
        m = st.metrics()
        assert m[M["stale_is_weight_mean"]] == pytest.approx(float(w.mean()), rel=1e-5)
        assert m[M["stale_zero_grad_frac"]] == 0.0 and m[M["stale_clip_frac"]] == 1.0
    clipped, _ = grads(LossConfig(clip_ratio=CLIP), TSPConfig("batched"))
    rel = max(float((clipped[n] - unclipped[n]).norm() / unclipped[n].norm()) for n in unclipped)
    assert rel > 0.1  # the clipped objective's gradient is another one (about half the rows add nothing)


def test_run_level_importance_weight_metrics_merge_by_stale_rows():
    a = LossStats(rows=4, stale_rows=2, stale_is_weight_sum=2.2, stale_is_weight_max=1.2, stale_is_capped=1)
    b = LossStats(rows=4, stale_rows=0)
    c = LossStats(rows=6, stale_rows=4, stale_is_weight_sum=3.6, stale_is_weight_max=0.95)
    total = (a + b + c).metrics()
    assert total[M["stale_is_weight_mean"]] == pytest.approx(5.8 / 6)
    assert total[M["stale_is_weight_max"]] == 1.2 and total[M["stale_is_capped_frac"]] == pytest.approx(1 / 6)
    assert b.metrics()[M["stale_is_weight_max"]] == 0.0  # no stale row: 0, not -inf, in the metric rows
    run = LossStats.run_clip_metrics([a.metrics(), b.metrics(), c.metrics()])
    for key in (M["stale_is_weight_mean"], M["stale_is_weight_max"], M["stale_is_capped_frac"]):
        assert run[key] == pytest.approx(total[key])


def test_objective_settings_are_checked_and_routed_as_a_cap():
    assert TcssConfig().objective == "decoupled" and TcssConfig().stale_is_cap == 5.0
    assert TcssConfig(objective="clip").stale_is_cap is None
    assert TcssConfig(is_cap=2).stale_is_cap == 2
    with pytest.raises(ValueError, match=r"tcss\.objective='ppo'.*\['decoupled', 'clip'\]"):
        TcssConfig(objective="ppo")
    for bad in (1.0, 0.5, True, "5"):
        with pytest.raises(ValueError, match=r"tcss\.is_cap=.*> 1"):
            TcssConfig(is_cap=bad)
    with pytest.warns(UserWarning, match=r"tcss\.is_cap=3.*no effect with tcss\.objective=clip"):
        TcssConfig(objective="clip", is_cap=3.0)
    with pytest.raises(ValueError, match=r"stale_is_cap=1\.0.*> 1"):
        LossConfig(stale_is_cap=1.0)
    assert LossConfig().stale_is_cap is None  # the loss alone: stale rows clipped like the others


def test_stale_rows_without_importance_weights_report_zero_and_the_run_merge_takes_logged_rows():
    """An objective that computes no importance weight (verl-omni's loss on its actor worker) leaves the max at
    -inf: the metric row says 0, and the run-level merge also reads rows as logged (non-finite numbers as text)."""
    stats = LossStats(rows=8, stale_rows=4, stale_clipped=4, stale_zero_grad=1)
    assert stats.metrics()[M["stale_is_weight_max"]] == 0.0
    logged = [{**stats.metrics(), M["stale_is_weight_max"]: "-inf"}, stats.metrics()]
    total = LossStats.run_clip_metrics(logged)
    assert total[M["stale_is_weight_max"]] == 0.0 and total[M["stale_clip_frac"]] == 1.0
    assert total[M["stale_zero_grad_frac"]] == pytest.approx(0.25)
