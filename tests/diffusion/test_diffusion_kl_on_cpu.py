"""The KL to the reference against hand-computed values, per sde_type and kl_type (verl-omni parity).

verl-omni's `KLLoss` is mean_dims((μ_θ − μ_ref)²) / (2·std_dev_t²), with the `std_dev_t` its scheduler returns:
σ_t = a·sqrt(σ/(1−σ)) for `sde`, σ'·sin(a·π/2) for `cps`, and the step std η·sqrt(σ−σ') for `dance_sde`.
The expected values below are computed from those formulas with plain floats (no project code), for one step
σ = 0.96 → σ' = 0.913 (the second step of 10 with shift 3) and two latent dimensions.
"""

import math

import pytest
import torch

from digenrl_verl.diffusion.loss import LossConfig, kl_denominator, policy_loss
from digenrl_verl.diffusion.sde import sde_step
from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients

SIGMA, SIGMA_NEXT = 0.96, 0.913
X = [0.5, -1.0]
V, V_REF = [0.2, 0.4], [0.1, 0.1]  # Δv = [0.1, 0.3]
BETA = 0.1


def _mean_sq_dmu(dmu_per_dv: float) -> float:
    """mean over the two dims of (μ_θ − μ_ref)², where μ is linear in v with slope `dmu_per_dv`."""
    return sum((dmu_per_dv * (a - b)) ** 2 for a, b in zip(V, V_REF)) / len(V)


def _hand_dance(eta: float) -> dict[str, float]:
    # μ = x + dσ·v − ½η²·score·dσ with score = −(x + (1−σ)·v)/σ  ⇒  ∂μ/∂v = dσ·(1 + ½η²(1−σ)/σ)
    dsigma = SIGMA_NEXT - SIGMA
    msq = _mean_sq_dmu(dsigma * (1 + 0.5 * eta**2 * (1 - SIGMA) / SIGMA))
    step_std = eta * math.sqrt(SIGMA - SIGMA_NEXT)
    return {"flow_grpo": msq / (2 * step_std**2), "exact": msq / (2 * step_std**2), "sigma_t": msq / (2 * eta**2)}


def _hand_sde(a: float) -> dict[str, float]:
    # σ_t = a·sqrt(σ/(1−σ)); μ = x(1 + σ_t²·dt/(2σ)) + v(1 + σ_t²(1−σ)/(2σ))·dt  ⇒  ∂μ/∂v = (1 + σ_t²(1−σ)/(2σ))·dt
    dt = SIGMA_NEXT - SIGMA
    st = a * math.sqrt(SIGMA / (1 - SIGMA))
    msq = _mean_sq_dmu((1 + st**2 * (1 - SIGMA) / (2 * SIGMA)) * dt)
    return {"flow_grpo": msq / (2 * st**2), "exact": msq / (2 * st**2 * -dt), "sigma_t": msq / (2 * st**2)}


def _hand_cps(a: float) -> dict[str, float]:
    # σ_t = σ'·sin(aπ/2) (also the step std); μ = (1−σ')(x − σv) + sqrt(σ'² − σ_t²)(x + (1−σ)v)
    st = SIGMA_NEXT * math.sin(a * math.pi / 2)
    msq = _mean_sq_dmu(-(1 - SIGMA_NEXT) * SIGMA + math.sqrt(SIGMA_NEXT**2 - st**2) * (1 - SIGMA))
    return {k: msq / (2 * st**2) for k in ("flow_grpo", "exact", "sigma_t")}


HAND = {"dance": (0.3, _hand_dance(0.3)), "sde": (0.7, _hand_sde(0.7)), "cps": (0.8, _hand_cps(0.8))}


def _project_kl(sde_type: str, noise_level: float, kl_type: str) -> float:
    x = torch.tensor([X])
    sig, sig_next = torch.tensor([SIGMA]), torch.tensor([SIGMA_NEXT])
    pol = sde_step(sde_type, torch.tensor([V]), x, sig, sig_next, noise_level, noise=torch.zeros(1, 2))
    ref = sde_step(sde_type, torch.tensor([V_REF]), x, sig, sig_next, noise_level, noise=torch.zeros(1, 2))
    logp = torch.zeros(1)
    loss, stats = policy_loss(logp, logp, torch.zeros(1), LossConfig(kl_coef=BETA, kl_type=kl_type), 1,
                              mean=pol.mean, ref_mean=ref.mean, std_dev_t=pol.std_dev_t, std=pol.std,
                              sde_type=sde_type)
    assert loss.item() == pytest.approx(BETA * stats.kl_sum, rel=1e-6)  # advantage 0: the loss is β·KL
    return stats.kl_sum


@pytest.mark.parametrize("sde_type", list(HAND))
@pytest.mark.parametrize("kl_type", ["flow_grpo", "exact", "sigma_t"])
def test_kl_matches_hand_computed_values(sde_type, kl_type):
    noise_level, expected = HAND[sde_type]
    # rel 1e-4: the project's means are fp32 (μ ≈ 0.5, Δμ ≈ 5e-3), the hand values fp64
    assert _project_kl(sde_type, noise_level, kl_type) == pytest.approx(expected[kl_type], rel=1e-4)


def test_dance_default_kl_is_verl_omnis_and_sigma_t_is_dsigma_times_smaller():
    # The literal values pin the hand formulas themselves (η = 0.3, Δv = [0.1, 0.3], σ 0.96 → 0.913).
    hand = HAND["dance"][1]
    assert hand["flow_grpo"] == pytest.approx(0.0131045598, rel=1e-8)
    assert hand["sigma_t"] == pytest.approx(6.159143100e-4, rel=1e-8)
    assert LossConfig().kl_type == "flow_grpo"
    default = _project_kl("dance", 0.3, LossConfig().kl_type)
    assert default == pytest.approx(0.0131045598, rel=1e-4)
    assert _project_kl("dance", 0.3, "sigma_t") == pytest.approx(default * (SIGMA - SIGMA_NEXT), rel=1e-5)
    # `sde`: the default divides by σ_t², as Flow-GRPO and verl-omni do (not by the step variance).
    assert _project_kl("sde", 0.7, "flow_grpo") == pytest.approx(7.278922672e-6, rel=1e-4)
    assert _project_kl("dance_sde", 0.3, "flow_grpo") == pytest.approx(default, rel=1e-7)


def test_flow_grpo_kl_needs_the_sde_type():
    with pytest.raises(ValueError, match="needs the sde_type"):
        kl_denominator("flow_grpo", None, torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match=r"needs std_dev_t and std \(sde_type='dance'\)"):
        kl_denominator("flow_grpo", "dance", torch.ones(1), None)


def test_tsp_update_passes_the_step_kind_to_the_kl(make_tiny_adapter):
    """Through `accumulate_gradients` (the trainer's path): on `dance` the default KL equals the exact one
    (both ÷ the step variance) and `sigma_t` is smaller; on `sde` the default equals `sigma_t`."""
    from digenrl_verl.diffusion.noise import SampleKey
    from digenrl_verl.diffusion.rollout import RolloutConfig, rollout

    cfgs = {"dance": RolloutConfig(num_inference_steps=6, sde_type="dance", noise_level=0.3,
                                   timestep_selection="dance_grpo", timestep_fraction=0.6),
            "sde": RolloutConfig(num_inference_steps=5, sde_type="sde", noise_level=0.7)}
    kl = {}
    for name, cfg in cfgs.items():
        adapter = make_tiny_adapter(seed=1)
        prompts = ["a red cube", "a red cube", "a blue sphere", "a blue sphere"]
        keys = [SampleKey(1, f"u{i // 2}", i % 2) for i in range(4)]
        cond = adapter.encode_prompts(prompts)
        traj = rollout(adapter, cond, keys, cfg)
        with torch.no_grad():  # policy ≠ reference
            for p in adapter.trainable_parameters():
                p.add_(0.01)
        for kl_type in ("flow_grpo", "exact", "sigma_t"):
            stats = accumulate_gradients(adapter, cond, traj, torch.zeros(4), LossConfig(kl_coef=0.1, kl_type=kl_type),
                                         TSPConfig("batched"), traj.batch_size * traj.num_steps)
            kl[name, kl_type] = stats.kl_sum
    assert kl["dance", "flow_grpo"] > 0
    assert kl["dance", "flow_grpo"] == pytest.approx(kl["dance", "exact"], rel=1e-5)
    assert kl["dance", "sigma_t"] < 0.5 * kl["dance", "flow_grpo"]
    assert kl["sde", "flow_grpo"] == pytest.approx(kl["sde", "sigma_t"], rel=1e-6)
    assert kl["sde", "flow_grpo"] != pytest.approx(kl["sde", "exact"], rel=1e-2)
