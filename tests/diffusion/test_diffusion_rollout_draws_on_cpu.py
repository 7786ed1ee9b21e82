"""`rollout_draws` rebuilds exactly the draws `rollout` makes: replaying them through `sde_step(noise=...)` gives the
same trajectory bit for bit (so another sampler fed those draws, e.g. verl-omni's rollout adapters, can be compared
with `rollout`), and a wrong draw breaks the equality."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, RolloutDraws, Trajectory, rollout, rollout_draws
from digenrl_verl.diffusion.sde import sde_step

PROMPTS = ["a red cube", "a blue sphere", "a green cone"]

CONFIGS = {
    "sde_flow_grpo": RolloutConfig(num_inference_steps=5, sde_type="sde", timestep_selection="flow_grpo",
                                   timestep_fraction=0.6, seed=3),
    "dance_dance_grpo": RolloutConfig(num_inference_steps=6, sde_type="dance", noise_level=0.3,
                                      timestep_selection="dance_grpo", timestep_fraction=0.6, seed=4),
    "cps_window": RolloutConfig(num_inference_steps=6, sde_type="cps", noise_level=0.8, timestep_selection="window",
                                sde_window_size=2, sde_window_range=(0, 5), seed=5),
    "sde_window_full": RolloutConfig(num_inference_steps=4, sde_type="sde", timestep_selection="window",
                                     sde_window_size=0, seed=6),
    "dance_window_same_noise": RolloutConfig(num_inference_steps=6, sde_type="dance_sde", noise_level=1.2,
                                             timestep_selection="window", sde_window_size=3, sde_window_range=(1, 6),
                                             init_same_noise=True, seed=7),
    "ode": RolloutConfig(num_inference_steps=4, sde_type="ode", noise_level=0.0),
}


def _batch(adapter, group=2):
    prompts = [p for p in PROMPTS for _ in range(group)]
    keys = [SampleKey(5, f"uid{i // group}", i % group) for i in range(len(prompts))]
    return adapter.encode_prompts(prompts), keys


def replay(adapter, cond, cfg: RolloutConfig, draws: RolloutDraws) -> Trajectory:
    """`rollout`'s loop with every draw taken from `draws` (initial latents, per-step noise, the plan)."""
    n, k, b = cfg.num_inference_steps, cfg.num_train_steps, draws.init.shape[0]
    schedule = adapter.sigmas(n).to(torch.float32)
    x = draws.init.clone()
    latents = torch.zeros(b, k, *x.shape[1:])
    next_latents, log_probs = torch.zeros_like(latents), torch.zeros(b, k)
    train_steps, sde_mask = draws.plan.train_steps, draws.plan.sde_mask
    with torch.no_grad():
        for i in range(n):
            sigma, sigma_next = schedule[i].expand(b), schedule[i + 1].expand(b)
            v = adapter.velocity(x, sigma, cond).to(torch.float32)
            x_next = sde_step("ode", v, x, sigma, sigma_next, 0.0).prev_sample
            lp = torch.full((b,), float("nan"))
            rows = sde_mask[:, i].nonzero(as_tuple=True)[0]
            if rows.numel():
                out = sde_step(cfg.sde_type, v[rows], x[rows], sigma[rows], sigma_next[rows], cfg.noise_level,
                               noise=draws.sde_noise[i, rows])
                x_next[rows] = out.prev_sample
                lp[rows] = out.log_prob
            rec_b, rec_k = (train_steps == i).nonzero(as_tuple=True)
            latents[rec_b, rec_k] = x[rec_b]
            next_latents[rec_b, rec_k] = x_next[rec_b]
            log_probs[rec_b, rec_k] = lp[rec_b]
            x = x_next
    return Trajectory(latents=latents, next_latents=next_latents, sigmas=schedule[train_steps],
                      next_sigmas=schedule[train_steps + 1], log_probs=log_probs, step_index=train_steps,
                      final_latents=x, sde_type=cfg.sde_type, noise_level=float(cfg.noise_level))


def _mismatches(a: Trajectory, b: Trajectory) -> list[str]:
    return [name for name, t in a.tensors().items() if not torch.equal(t, b.tensors()[name])]


@pytest.mark.parametrize("name", CONFIGS)
def test_replaying_the_draws_reproduces_rollout_bit_for_bit(tiny_adapter, name):
    cfg = CONFIGS[name]
    cond, keys = _batch(tiny_adapter)
    ref = rollout(tiny_adapter, cond, keys, cfg)
    draws = rollout_draws(tiny_adapter, cfg, keys)
    n, b = cfg.num_inference_steps, len(keys)
    assert draws.init.shape == (b, *tiny_adapter.latent_shape()) and draws.init.dtype == torch.float32
    assert draws.sde_noise.shape == (n, b, *tiny_adapter.latent_shape())
    assert draws.plan.sde_mask.shape == (b, n) and torch.equal(draws.plan.train_steps, ref.step_index)
    # Zero exactly where a row runs the ODE; a standard-normal draw elsewhere.
    drawn = draws.sde_noise.flatten(2).ne(0).all(-1).T  # [B, N]
    assert torch.equal(drawn, draws.plan.sde_mask)
    assert not draws.sde_noise.flatten(2).ne(0).any(-1).T[~draws.plan.sde_mask].any()
    assert _mismatches(replay(tiny_adapter, cond, cfg, draws), ref) == []


def test_init_same_noise_and_per_row_streams(tiny_adapter):
    cfg = CONFIGS["dance_window_same_noise"]
    cond, keys = _batch(tiny_adapter, group=3)
    draws = rollout_draws(tiny_adapter, cfg, keys)
    assert torch.equal(draws.init[0], draws.init[1]) and not torch.equal(draws.init[0], draws.init[3])
    # A row's draws depend only on its own key: the same key alone gives the same draws.
    alone = rollout_draws(tiny_adapter, cfg, keys[4:5])
    assert torch.equal(alone.init[0], draws.init[4]) and torch.equal(alone.sde_noise[:, 0], draws.sde_noise[:, 4])


@pytest.mark.parametrize("mutation", ["swap_steps", "swap_rows", "other_seed", "init"])
def test_a_wrong_draw_breaks_the_replay(tiny_adapter, mutation):
    cfg = CONFIGS["sde_flow_grpo"]
    cond, keys = _batch(tiny_adapter)
    ref = rollout(tiny_adapter, cond, keys, cfg)
    draws = rollout_draws(tiny_adapter, cfg, keys)
    noise, init = draws.sde_noise.clone(), draws.init.clone()
    if mutation == "swap_steps":  # the same draws in another step order
        noise[[0, 1]] = noise[[1, 0]]
    elif mutation == "swap_rows":  # another row's stream
        noise[:, [0, 1]] = noise[:, [1, 0]]
    elif mutation == "other_seed":
        noise = rollout_draws(tiny_adapter, RolloutConfig(**{**vars(cfg), "seed": cfg.seed + 1}), keys).sde_noise
    else:
        init[2] = -init[2]
    bad = replay(tiny_adapter, cond, cfg, RolloutDraws(init=init, sde_noise=noise, plan=draws.plan))
    wrong = _mismatches(bad, ref)
    assert "final_latents" in wrong and "next_latents" in wrong, wrong
    scale = ref.final_latents.abs().max()
    assert (bad.final_latents - ref.final_latents).abs().max() / scale > 1e-2


def test_real_architecture_twin(tmp_path):
    """The same on a real diffusers twin (packed Qwen-Image latents, true CFG), window mode as verl-omni runs it."""
    from digenrl_verl.models import build_tiny_model_dir, get_model_spec, load_adapter

    torch.set_num_threads(2)
    arch = "QwenImagePipeline"
    adapter = load_adapter(build_tiny_model_dir(arch, tmp_path / "qwen", seed=0), **get_model_spec(arch).tiny_sampling)
    cfg = RolloutConfig(num_inference_steps=4, sde_type="sde", noise_level=0.7, timestep_selection="window",
                        sde_window_size=2, sde_window_range=(0, 3), seed=7)
    cond, keys = _batch(adapter, group=1)
    ref = rollout(adapter, cond, keys, cfg)
    draws = rollout_draws(adapter, cfg, keys)
    assert _mismatches(replay(adapter, cond, cfg, draws), ref) == []
