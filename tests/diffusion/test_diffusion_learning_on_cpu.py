"""In-process Flow-GRPO on the tiny test network: rollout → decode → reward → advantages → TSP → AdamW.

Fixed seeds throughout; the margins are several times the spread of the reward at initialisation (std of the
mean of 16 evaluation samples ≈ 0.006 for brightness).
"""

import torch

from digenrl_verl.diffusion.advantages import AdvantageConfig, normalize_rewards
from digenrl_verl.diffusion.loss import LossConfig
from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, rollout
from digenrl_verl.diffusion.tsp import TSPConfig, accumulate_gradients
from digenrl_verl.rewards import Reward, get_reward

CFG = RolloutConfig(num_inference_steps=6, sde_type="sde", noise_level=0.7, timestep_fraction=0.99, seed=1)


class Darkness(Reward):
    """1 − brightness: the control run must move the other way."""

    def score(self, images, prompts, extra=None):
        return 1 - get_reward("brightness").score(images, prompts, extra)


def _evaluate(adapter, reward, prompts):
    ev = prompts * 8
    cond = adapter.encode_prompts(ev)
    traj = rollout(adapter, cond, [SampleKey(-1, "eval", i) for i in range(len(ev))], CFG)
    images = adapter.decode(traj.final_latents)
    return reward.score(images, ev).mean().item(), images, ev


def _train(adapter, reward, prompts, iters, lr, group=4):
    opt = torch.optim.AdamW(adapter.trainable_parameters(), lr=lr, weight_decay=0.0)
    batch = [p for p in prompts for _ in range(group)]
    uids = [f"p{i // group}" for i in range(len(batch))]
    cond = adapter.encode_prompts(batch)
    for it in range(iters):
        keys = [SampleKey(it, u, i % group) for i, u in enumerate(uids)]
        traj = rollout(adapter, cond, keys, CFG)
        scores = reward.score(adapter.decode(traj.final_latents), batch)
        adv = normalize_rewards(scores, uids, AdvantageConfig()).advantages
        opt.zero_grad()
        stats = accumulate_gradients(adapter, cond, traj, adv, LossConfig(clip_ratio=1e-4), TSPConfig("batched", 16),
                                     traj.batch_size * traj.num_steps)
        assert abs(stats.ratio_max - 1) <= 1e-6  # one update per batch: always on-policy
        torch.nn.utils.clip_grad_norm_(adapter.trainable_parameters(), 1.0)
        opt.step()


def test_flow_grpo_raises_brightness_and_the_control_lowers_it(make_tiny_adapter):
    torch.set_num_threads(1)
    brightness, prompts = get_reward("brightness"), ["a cat", "a dog"]
    adapter = make_tiny_adapter(seed=0)
    before, _, _ = _evaluate(adapter, brightness, prompts)
    _train(adapter, brightness, prompts, iters=30, lr=1e-3)
    after, _, _ = _evaluate(adapter, brightness, prompts)
    assert after > before + 0.15, (before, after)

    control = make_tiny_adapter(seed=0)
    _train(control, Darkness(), prompts, iters=30, lr=1e-3)
    darker, _, _ = _evaluate(control, brightness, prompts)
    assert darker < before - 0.15, (before, darker)


def test_flow_grpo_learns_the_prompt_conditioned_colour(make_tiny_adapter):
    torch.set_num_threads(1)
    reward, prompts = get_reward("color_match"), ["a red ball", "a blue ball"]
    adapter = make_tiny_adapter(seed=0)
    before, _, _ = _evaluate(adapter, reward, prompts)
    _train(adapter, reward, prompts, iters=40, lr=3e-3)
    after, images, ev = _evaluate(adapter, reward, prompts)
    assert after > before + 0.06, (before, after)
    # The policy follows the prompt: red-prompt images are redder (R − B) than blue-prompt images.
    rgb = images.float().mean(dim=(2, 3))
    red_minus_blue = rgb[:, 0] - rgb[:, 2]
    is_red = torch.tensor(["red" in p for p in ev])
    assert red_minus_blue[is_red].mean() > red_minus_blue[~is_red].mean() + 10, red_minus_blue
