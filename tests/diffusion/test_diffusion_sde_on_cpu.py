import math

import pytest
import torch

from digenrl_verl.diffusion.sde import (
    flow_sde_mean,
    gaussian_log_prob,
    get_sde_kind,
    register_sde_kind,
    sde_kinds,
    sde_step,
)

torch.set_num_threads(1)


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _rows(val, b):
    return torch.full((b,), float(val), dtype=torch.float32)


def test_ode_equals_diffusers_euler_step():
    from diffusers import FlowMatchEulerDiscreteScheduler  # imported here: ~2 s that collection need not pay

    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(10)
    x = _rand(2, 4, 8, 8, seed=1)
    for i, t in enumerate(sched.timesteps):
        v = _rand(2, 4, 8, 8, seed=10 + i)
        ref = sched.step(v, t, x).prev_sample
        out = sde_step("ode", v, x, _rows(sched.sigmas[i], 2), _rows(sched.sigmas[i + 1], 2), 0.7)
        torch.testing.assert_close(out.prev_sample, ref, rtol=0, atol=0)
        assert out.log_prob is None
        assert torch.all(out.std == 0)
        x = ref


def test_dance_is_flow_grpo_drift_with_constant_eta():
    """dance(η) has exactly the `sde` mean/std/log-prob formulas evaluated at std_dev_t := η."""
    b, eta = 3, 0.3
    x, v = _rand(b, 4, 6, 6, seed=2), _rand(b, 4, 6, 6, seed=3)
    sigma = torch.tensor([0.95, 0.6, 0.2])
    sigma_next = torch.tensor([0.9, 0.45, 0.0])
    dance = sde_step("dance", v, x, sigma, sigma_next, eta, noise=_rand(b, 4, 6, 6, seed=4))
    mean_sde_form = flow_sde_mean(x, v, sigma, sigma_next, torch.full((b,), eta))
    torch.testing.assert_close(dance.mean, mean_sde_form, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dance.std, eta * torch.sqrt(sigma - sigma_next))
    torch.testing.assert_close(dance.std_dev_t, torch.full((b,), eta))
    lp_sde_form = gaussian_log_prob(dance.prev_sample, mean_sde_form, dance.std)
    torch.testing.assert_close(dance.log_prob, lp_sde_form, rtol=1e-6, atol=1e-5)
    # ...and differs from Flow-GRPO's `sde`, whose σ_t depends on σ.
    sde = sde_step("sde", v, x, sigma, sigma_next, eta, prev_sample=dance.prev_sample)
    assert (sde.mean - dance.mean).abs().max() > 1e-3
    assert get_sde_kind("dance_sde") is get_sde_kind("dance")


def test_sde_formulas_and_gaussian_log_prob_closed_form():
    b, a = 4, 0.7
    x, v, z = _rand(b, 2, 5, 5, seed=5), _rand(b, 2, 5, 5, seed=6), _rand(b, 2, 5, 5, seed=7)
    sigma = torch.tensor([1.0, 0.8, 0.5, 0.1])
    sigma_next = torch.tensor([0.96, 0.7, 0.3, 0.0])
    out = sde_step("sde", v, x, sigma, sigma_next, a, noise=z)
    for i in range(b):
        s, sn = float(sigma[i]), float(sigma_next[i])
        st = a * math.sqrt(s / (1 - (sn if s == 1 else s)))
        dt = sn - s
        mean = x[i] * (1 + st**2 * dt / (2 * s)) + v[i] * (1 + st**2 * (1 - s) / (2 * s)) * dt
        std = st * math.sqrt(-dt)
        torch.testing.assert_close(out.std_dev_t[i], torch.tensor(st), rtol=1e-6, atol=0)
        torch.testing.assert_close(out.std[i], torch.tensor(std), rtol=1e-6, atol=0)
        torch.testing.assert_close(out.mean[i], mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.prev_sample[i], out.mean[i] + out.std[i] * z[i])
        closed = torch.distributions.Normal(out.mean[i], out.std[i]).log_prob(out.prev_sample[i]).mean()
        torch.testing.assert_close(out.log_prob[i], closed, rtol=1e-6, atol=1e-5)
    # Evaluation of the same draw gives the same log-prob as sampling returned.
    ev = sde_step("sde", v, x, sigma, sigma_next, a, prev_sample=out.prev_sample)
    torch.testing.assert_close(ev.log_prob, out.log_prob, rtol=0, atol=0)


def test_cps_formulas_by_hand():
    a = 0.8
    x, v, z = _rand(2, 3, 4, 4, seed=8), _rand(2, 3, 4, 4, seed=9), _rand(2, 3, 4, 4, seed=10)
    sigma, sigma_next = torch.tensor([0.6, 0.3]), torch.tensor([0.4, 0.0])
    out = sde_step("cps", v, x, sigma, sigma_next, a, noise=z)
    for i in range(2):
        s, sn = float(sigma[i]), float(sigma_next[i])
        st = sn * math.sin(a * math.pi / 2)
        x0, x1 = x[i] - s * v[i], x[i] + (1 - s) * v[i]
        mean = (1 - sn) * x0 + math.sqrt(sn**2 - st**2) * x1
        torch.testing.assert_close(out.mean[i], mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.std[i], torch.tensor(st), rtol=1e-6, atol=1e-7)
        prev = mean + st * z[i]
        torch.testing.assert_close(out.prev_sample[i], prev, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.log_prob[i], -((prev - mean) ** 2).mean(), rtol=1e-4, atol=1e-6)
    # The last step (σ'=0) is deterministic and its scaled density is finite (0).
    assert out.std[1] == 0 and out.log_prob[1] == 0


@pytest.mark.parametrize("kind", ["sde", "cps", "dance"])
def test_zero_noise_reduces_to_ode(kind):
    x, v = _rand(2, 3, 4, 4, seed=11), _rand(2, 3, 4, 4, seed=12)
    sigma, sigma_next = torch.tensor([0.9, 0.5]), torch.tensor([0.7, 0.2])
    ode = sde_step("ode", v, x, sigma, sigma_next, 0.0)
    noisy = sde_step(kind, v, x, sigma, sigma_next, 0.0, noise=_rand(2, 3, 4, 4, seed=13))
    torch.testing.assert_close(noisy.prev_sample, ode.prev_sample, rtol=1e-5, atol=1e-6)


def test_per_row_sigmas_match_row_by_row():
    x, v = _rand(3, 3, 4, 4, seed=14), _rand(3, 3, 4, 4, seed=15)
    prev = _rand(3, 3, 4, 4, seed=16)
    sigma, sigma_next = torch.tensor([1.0, 0.5, 0.2]), torch.tensor([0.9, 0.4, 0.0])
    for kind in ["sde", "dance", "cps"]:
        full = sde_step(kind, v, x, sigma, sigma_next, 0.7, prev_sample=prev)
        for i in range(3):
            one = sde_step(kind, v[i:i + 1], x[i:i + 1], sigma[i:i + 1], sigma_next[i:i + 1], 0.7,
                           prev_sample=prev[i:i + 1])
            torch.testing.assert_close(one.log_prob, full.log_prob[i:i + 1], rtol=0, atol=0)
            torch.testing.assert_close(one.mean, full.mean[i:i + 1], rtol=0, atol=0)


def test_generators_give_per_row_reproducible_draws():
    x, v = _rand(2, 3, 4, 4, seed=17), _rand(2, 3, 4, 4, seed=18)
    sigma, sigma_next = torch.tensor([0.9, 0.9]), torch.tensor([0.8, 0.8])
    gens = lambda seeds: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    a = sde_step("sde", v, x, sigma, sigma_next, 0.7, generators=gens([1, 2]))
    b = sde_step("sde", v.flip(0), x.flip(0), sigma, sigma_next, 0.7, generators=gens([2, 1]))
    torch.testing.assert_close(a.prev_sample, b.prev_sample.flip(0), rtol=0, atol=0)
    c = sde_step("sde", v, x, sigma, sigma_next, 0.7, generators=gens([1, 3]))
    assert torch.equal(a.prev_sample[0], c.prev_sample[0]) and not torch.equal(a.prev_sample[1], c.prev_sample[1])


def test_math_is_fp32_for_low_precision_inputs():
    x, v = _rand(2, 3, 4, 4, seed=19).bfloat16(), _rand(2, 3, 4, 4, seed=20).bfloat16()
    out = sde_step("sde", v, x, torch.tensor([0.9, 0.5]), torch.tensor([0.8, 0.4]), 0.7,
                   noise=torch.zeros(2, 3, 4, 4))
    assert out.prev_sample.dtype == out.mean.dtype == out.log_prob.dtype == torch.float32


def test_errors_name_the_key_and_choices():
    x = torch.zeros(1, 2, 2)
    s, sn = torch.tensor([0.5]), torch.tensor([0.4])
    with pytest.raises(ValueError, match=r"sde_type='sdee'.*'cps'"):
        sde_step("sdee", x, x, s, sn, 0.7)
    with pytest.raises(ValueError, match="ode.*never trained"):
        sde_step("ode", x, x, s, sn, 0.7, prev_sample=x)
    with pytest.raises(ValueError, match="noise_level"):
        sde_step("sde", x, x, s, sn, 0.0, prev_sample=x)
    with pytest.raises(ValueError, match=r"\[B\]"):
        sde_step("sde", x, x, torch.tensor(0.5), sn, 0.7, prev_sample=x)
    with pytest.raises(ValueError, match="already registered"):
        register_sde_kind(get_sde_kind("sde"))
    assert {"sde", "cps", "dance", "dance_sde", "ode"} <= set(sde_kinds())
