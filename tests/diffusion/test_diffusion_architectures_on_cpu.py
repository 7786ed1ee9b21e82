"""The diffusion math through every real diffusers architecture (tiny random models, loaded from disk)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from digenrl_verl.diffusion.loss import LossConfig
from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients, compute_log_probs
from digenrl_verl.models import build_tiny_model_dir, get_model_spec, load_adapter, tiny_architectures
from digenrl_verl.rewards import get_reward


# One selection/step kind per architecture, as their recipes use them.
ROLLOUTS = {
    "StableDiffusion3Pipeline": RolloutConfig(num_inference_steps=4, sde_type="sde", noise_level=0.7,
                                              timestep_fraction=0.99),
    "FluxPipeline": RolloutConfig(num_inference_steps=4, sde_type="dance", noise_level=0.3,
                                  timestep_selection="dance_grpo", timestep_fraction=0.7),
    "QwenImagePipeline": RolloutConfig(num_inference_steps=4, sde_type="sde", noise_level=1.2,
                                       timestep_selection="window", sde_window_size=2, sde_window_range=(0, 3)),
    "WanPipeline": RolloutConfig(num_inference_steps=4, sde_type="dance_sde", noise_level=1.2,
                                 timestep_selection="window", sde_window_size=2, sde_window_range=(0, 3)),
    "HunyuanVideoPipeline": RolloutConfig(num_inference_steps=4, sde_type="cps", noise_level=0.8,
                                          timestep_selection="window", sde_window_size=2, sde_window_range=(0, 3)),
}
PROMPTS = ["a red dog on grass", "a photo of a cat"]

assert set(ROLLOUTS) == set(tiny_architectures())


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diffusion_tiny_models")
    return {arch: build_tiny_model_dir(arch, root / arch, seed=0) for arch in tiny_architectures()}


def _sample(adapter, cfg, group=2):
    prompts = [p for p in PROMPTS for _ in range(group)]
    keys = [SampleKey(3, f"u{i // group}", i % group) for i in range(len(prompts))]
    cond = adapter.encode_prompts(prompts)
    return cond, keys, rollout(adapter, cond, keys, cfg)


def _grads(adapter):
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in adapter.trainable_parameters()]


def _zero(adapter):
    for p in adapter.trainable_parameters():
        p.grad = None


def _max_rel_err(a, b):
    scale = max(float(y.abs().max()) for y in b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) / scale


@pytest.mark.parametrize("arch", tiny_architectures())
def test_on_policy_ratio_and_tsp_gradient(tiny_dirs, arch):
    torch.set_num_threads(2)
    adapter = load_adapter(tiny_dirs[arch], **get_model_spec(arch).tiny_sampling)
    cfg = ROLLOUTS[arch]
    cond, keys, traj = _sample(adapter, cfg)
    b, k = traj.batch_size, traj.num_steps
    assert traj.latents.shape == (b, k, *adapter.latent_shape()) and torch.isfinite(traj.log_probs).all()

    # Deterministic per key: the same batch again is bit-identical.
    again = rollout(adapter, cond, keys, cfg)
    assert torch.equal(again.next_latents, traj.next_latents) and torch.equal(again.log_probs, traj.log_probs)

    # On-policy: recomputed log-probs give ratio 1 in both schedules.
    for mode in ("per_timestep", "batched"):
        lp = compute_log_probs(adapter, cond, traj, tsp_cfg=TSPConfig(mode))
        assert (torch.exp(lp - traj.log_probs) - 1).abs().max() <= 1e-6, mode

    # TSP: batched (chunk 1, 3, all) gives the per-timestep gradient.
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss_cfg = LossConfig(clip_ratio=1e-4)
    stats = accumulate_gradients(adapter, cond, traj, adv, loss_cfg, TSPConfig("per_timestep"), b * k)
    assert abs(stats.ratio_max - 1) <= 1e-6 and abs(stats.ratio_min - 1) <= 1e-6
    ref = _grads(adapter)
    assert max(float(g.abs().max()) for g in ref) > 0
    for chunk in (1, 3, None):
        _zero(adapter)
        accumulate_gradients(adapter, cond, traj, adv, loss_cfg, TSPConfig("batched", chunk), b * k)
        assert _max_rel_err(_grads(adapter), ref) <= 1e-5, chunk
    _zero(adapter)

    # Decoded samples feed the rewards (images [B,3,H,W] or videos [B,T,3,H,W], uint8).
    images = adapter.decode(traj.final_latents)
    assert images.dtype == torch.uint8 and images.shape[0] == b
    scores = get_reward("brightness").score(images, [p for p in PROMPTS for _ in range(2)])
    assert scores.shape == (b,) and torch.isfinite(scores).all()
