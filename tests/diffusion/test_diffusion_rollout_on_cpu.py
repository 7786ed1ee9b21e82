import pytest
import torch

from digenrl_verl.diffusion.noise import SampleKey, make_sample_generators
from digenrl_verl.diffusion.rollout import RolloutConfig, Trajectory, rollout
from digenrl_verl.diffusion.sde import sde_step

PROMPTS = ["a red cube", "a blue sphere", "a green cone"]


def _batch(adapter, order=(0, 1, 2), group=2):
    prompts = [PROMPTS[i] for i in order for _ in range(group)]
    keys = [SampleKey(5, f"uid{i}", j) for i in order for j in range(group)]
    return adapter.encode_prompts(prompts), keys


@pytest.mark.parametrize("cfg", [
    RolloutConfig(num_inference_steps=6, sde_type="sde", timestep_selection="flow_grpo", timestep_fraction=0.99),
    RolloutConfig(num_inference_steps=6, sde_type="dance", noise_level=0.3, timestep_selection="dance_grpo",
                  timestep_fraction=0.6),
    RolloutConfig(num_inference_steps=6, sde_type="cps", noise_level=0.8, timestep_selection="window",
                  sde_window_size=2, sde_window_range=(0, 4)),
])
def test_trajectory_fields_and_recorded_steps_replay(tiny_adapter, cfg):
    cond, keys = _batch(tiny_adapter)
    traj = rollout(tiny_adapter, cond, keys, cfg)
    b, k = len(keys), cfg.num_train_steps
    assert traj.latents.shape == traj.next_latents.shape == (b, k, 3, 8, 8)
    assert traj.sigmas.shape == traj.next_sigmas.shape == traj.log_probs.shape == traj.step_index.shape == (b, k)
    assert traj.step_index.dtype == torch.int64 and traj.final_latents.shape == (b, 3, 8, 8)
    schedule = tiny_adapter.sigmas(cfg.num_inference_steps)
    assert torch.equal(traj.sigmas, schedule[traj.step_index])
    assert torch.equal(traj.next_sigmas, schedule[traj.step_index + 1])
    assert torch.isfinite(traj.log_probs).all()
    # Each recorded step replays: the same velocity at (x, σ) gives the recorded log-prob of x'.
    with torch.no_grad():
        for j in range(k):
            v = tiny_adapter.velocity(traj.latents[:, j], traj.sigmas[:, j], cond)
            out = sde_step(cfg.sde_type, v, traj.latents[:, j], traj.sigmas[:, j], traj.next_sigmas[:, j],
                           cfg.noise_level, prev_sample=traj.next_latents[:, j])
            assert (out.log_prob - traj.log_probs[:, j]).abs().max() <= 1e-6


def test_flow_grpo_trajectory_is_a_chain(tiny_adapter):
    cfg = RolloutConfig(num_inference_steps=5, timestep_fraction=1.0)
    cond, keys = _batch(tiny_adapter)
    traj = rollout(tiny_adapter, cond, keys, cfg)
    assert torch.equal(traj.next_latents[:, :-1], traj.latents[:, 1:])
    assert torch.equal(traj.next_latents[:, -1], traj.final_latents)
    x0 = tiny_adapter.initial_noise(make_sample_generators(cfg.seed, keys).init)
    assert torch.equal(traj.latents[:, 0], x0)  # starts from each key's own `init` stream


def test_same_key_same_trajectory_regardless_of_neighbours(tiny_adapter):
    cfg = RolloutConfig(num_inference_steps=6, timestep_selection="window", sde_window_size=2)
    cond, keys = _batch(tiny_adapter)
    a = rollout(tiny_adapter, cond, keys, cfg)
    again = rollout(tiny_adapter, cond, keys, cfg)
    for name, t in a.tensors().items():
        assert torch.equal(t, again.tensors()[name]), name  # same batch: bit-identical
    cond_p, keys_p = _batch(tiny_adapter, order=(2, 0, 1))
    p = rollout(tiny_adapter, cond_p, keys_p, cfg)
    perm = torch.tensor([4, 5, 0, 1, 2, 3])  # rows of `a` in the order of `p`
    a_perm = a.index_select(perm)
    assert torch.equal(p.step_index, a_perm.step_index)
    for name in ("latents", "next_latents", "final_latents", "log_probs"):
        torch.testing.assert_close(getattr(p, name), getattr(a_perm, name), rtol=1e-5, atol=1e-5)
    one = rollout(tiny_adapter, cond.index_select([3]), keys[3:4], cfg)  # alone, batch of 1
    torch.testing.assert_close(one.final_latents, a.final_latents[3:4], rtol=1e-5, atol=1e-5)
    other = rollout(tiny_adapter, cond, [SampleKey(6, k.uid, k.index) for k in keys], cfg)
    assert not torch.allclose(other.final_latents, a.final_latents)


def test_window_steps_outside_are_ode_and_init_same_noise(tiny_adapter):
    cfg = RolloutConfig(num_inference_steps=6, timestep_selection="window", sde_window_size=2,
                        sde_window_range=(3, 5), init_same_noise=True)
    cond, keys = _batch(tiny_adapter, group=3)
    traj = rollout(tiny_adapter, cond, keys, cfg)
    assert traj.step_index.tolist() == [[3, 4]] * 9
    # Same initial noise and ODE before the window: the group agrees up to the window, then diverges.
    for g in range(3):
        rows = traj.latents[3 * g:3 * g + 3, 0]
        torch.testing.assert_close(rows, rows[:1].expand_as(rows), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(traj.next_latents[3 * g, 0], traj.next_latents[3 * g + 1, 0])
    assert not torch.allclose(traj.latents[0, 0], traj.latents[3, 0])
    ode = rollout(tiny_adapter, cond, keys, RolloutConfig(num_inference_steps=6, sde_type="ode", noise_level=0.0,
                                                           init_same_noise=True))
    assert ode.num_steps == 0 and ode.latents.shape == (9, 0, 3, 8, 8)
    torch.testing.assert_close(ode.final_latents[1], ode.final_latents[0], rtol=1e-5, atol=1e-6)


def test_trajectory_helpers(tiny_adapter):
    cond, keys = _batch(tiny_adapter)
    traj = rollout(tiny_adapter, cond, keys, RolloutConfig(num_inference_steps=4))
    parts = [traj.index_select([0, 1]), traj.index_select([2, 3, 4, 5])]
    whole = Trajectory.cat(parts)
    for name, t in traj.tensors().items():
        assert torch.equal(whole.tensors()[name], t)
    back = Trajectory.from_tensors(traj.tensors(), traj.sde_type, traj.noise_level)
    assert back.num_steps == 3 and back.batch_size == 6
    with pytest.raises(KeyError, match="log_probs"):
        Trajectory.from_tensors({k: v for k, v in traj.tensors().items() if k != "log_probs"}, "sde", 0.7)
    with pytest.raises(ValueError, match="sample keys"):
        rollout(tiny_adapter, cond, keys[:2], RolloutConfig())
