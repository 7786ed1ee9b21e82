"""The five adapters against the real diffusers pipelines, on tiny model directories.

- sampling with adapter.sigmas / velocity / decode and a plain Euler loop reproduces the diffusers
  pipeline's own output (latents and uint8 pixels) for the same initial noise;
- two loads of one directory give bit-identical velocities and decodes;
- velocity is a pure per-row function (TSP stacks timesteps in the batch);
- guidance is applied as each model does, and the transformer is fed the right timestep.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from digenrl_verl.models import Conditioning, load_adapter, tiny_architectures

VIDEO = {"WanPipeline", "HunyuanVideoPipeline"}


def _noise(adapter, n: int, seed: int = 0) -> torch.Tensor:
    return adapter.initial_noise([torch.Generator().manual_seed(seed + i) for i in range(n)])


def _euler(adapter, x: torch.Tensor, cond: Conditioning, sigmas: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        for i in range(len(sigmas) - 1):
            v = adapter.velocity(x, sigmas[i].expand(x.shape[0]), cond)
            x = x + (sigmas[i + 1] - sigmas[i]) * v
    return x


def _pipeline_pixels(out) -> torch.Tensor:
    arr = out.images if hasattr(out, "images") else out.frames
    t = torch.from_numpy((np.asarray(arr) * 255).round().astype(np.uint8))
    return t.permute(0, 3, 1, 2) if t.dim() == 4 else t.permute(0, 1, 4, 2, 3)


@pytest.mark.parametrize("arch", tiny_architectures())
def test_sampling_matches_diffusers_pipeline(arch, tiny_dirs, pipeline_kwargs, prompts):
    from diffusers import FlowMatchEulerDiscreteScheduler

    adapter = load_adapter(tiny_dirs[arch], keep_reference=False, **pipeline_kwargs[arch])
    if arch == "WanPipeline":  # Wan ships a multistep UniPC solver; compare under the Euler scheduler
        adapter.pipeline.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    prompts = prompts[:2]
    steps = 3
    x0 = _noise(adapter, len(prompts))
    ours = _euler(adapter, x0.clone(), adapter.encode_prompts(prompts), adapter.sigmas(steps))
    call = dict(pipeline_kwargs[arch], num_inference_steps=steps)
    with torch.no_grad():
        out = adapter.pipeline(prompts, latents=x0.clone(), output_type="latent", **call)
        theirs = out.images if hasattr(out, "images") else out.frames
        pixels = _pipeline_pixels(adapter.pipeline(prompts, latents=x0.clone(), output_type="np", **call))
    # SD3/FLUX/HunyuanVideo match bit for bit; Qwen pads text to a fixed length (masked), Wan batches CFG.
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    decoded = adapter.decode(ours)
    assert decoded.dtype == torch.uint8 and decoded.shape == pixels.shape
    assert (decoded.int() - pixels.int()).abs().max() <= 1


@pytest.mark.parametrize("arch", tiny_architectures())
def test_two_loads_are_bit_identical(arch, tiny_dirs, pipeline_kwargs, prompts, tiny_adapter):
    first = tiny_adapter(arch)
    second = load_adapter(tiny_dirs[arch], keep_reference=False, **pipeline_kwargs[arch])
    x = _noise(first, 2, seed=5)
    sigma = torch.tensor([0.9, 0.3])
    with torch.no_grad():
        c1, c2 = first.encode_prompts(prompts[:2]), second.encode_prompts(prompts[:2])
        for key in c1.tensors:
            assert torch.equal(c1.tensors[key], c2.tensors[key]), key
        assert torch.equal(first.velocity(x, sigma, c1), second.velocity(x, sigma, c2))
    assert torch.equal(first.decode(x), second.decode(x))
    assert torch.equal(first.sigmas(5), second.sigmas(5))


@pytest.mark.parametrize("arch", tiny_architectures())
def test_velocity_rows_are_independent(arch, tiny_adapter, prompts):
    """Rows at different σ stacked in one call (as TSP does) equal separate per-row calls."""
    adapter = tiny_adapter(arch)
    cond = adapter.encode_prompts(prompts)  # three prompts of different lengths
    tsp_cond = cond.repeat_interleave(2)  # rows: p0 p0 p1 p1 p2 p2
    sigmas = torch.tensor([0.95, 0.4, 0.8, 0.1, 0.6, 0.25])
    x = _noise(adapter, 6, seed=11)
    with torch.no_grad():
        stacked = adapter.velocity(x, sigmas, tsp_cond)
        assert stacked.dtype == torch.float32 and stacked.shape == x.shape
        for i in range(6):
            row = adapter.velocity(x[i : i + 1], sigmas[i : i + 1], tsp_cond.index_select([i]))
            torch.testing.assert_close(stacked[i : i + 1], row, rtol=1e-6, atol=1e-6 * float(row.abs().max()))
        # a row's conditioning does not depend on which prompts were encoded with it
        alone = adapter.encode_prompts(prompts[1:2])
        for key, value in alone.tensors.items():
            torch.testing.assert_close(value, cond.tensors[key][1:2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", tiny_architectures())
def test_every_trainable_parameter_gets_a_gradient(arch, tiny_adapter, prompts):
    """Trainable = influences the velocity (flat-buffer gradient all-reduce needs no None grads)."""
    adapter = tiny_adapter(arch)
    cond = adapter.encode_prompts(prompts[:2])
    v = adapter.velocity(_noise(adapter, 2), torch.tensor([0.7, 0.2]), cond)
    params = adapter.trainable_parameters()
    assert len(params) > 0
    grads = torch.autograd.grad(v.square().mean(), params, allow_unused=True)
    assert all(g is not None for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def _timestep_and_guidance(adapter, cond, sigma):
    seen: list[dict] = []
    handle = adapter.denoiser.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append({k: kwargs.get(k) for k in ("timestep", "guidance")}), with_kwargs=True
    )
    try:
        with torch.no_grad():
            adapter.velocity(_noise(adapter, len(sigma)), sigma, cond)
    finally:
        handle.remove()
    return seen


# What the transformer's `timestep` is fed (multiple of σ) and its embedded guidance (multiple of the scale).
FEEDS = {
    "StableDiffusion3Pipeline": (1000.0, None),
    "FluxPipeline": (1.0, 1.0),
    "QwenImagePipeline": (1.0, None),  # σ, scaled x1000 inside the Qwen timestep embedding
    "WanPipeline": (1000.0, None),
    "HunyuanVideoPipeline": (1000.0, 1000.0),
}


@pytest.mark.parametrize("arch", tiny_architectures())
def test_transformer_is_fed_the_models_timestep_and_guidance(arch, tiny_adapter, prompts):
    adapter = tiny_adapter(arch)
    sigma = torch.tensor([0.8, 0.35])
    calls = _timestep_and_guidance(adapter, adapter.encode_prompts(prompts[:2]), sigma)
    t_scale, g_scale = FEEDS[arch]
    for call in calls:
        t = call["timestep"]
        expected = sigma.repeat(t.shape[0] // 2) * t_scale  # CFG batches repeat the rows
        torch.testing.assert_close(t.float(), expected, rtol=1e-6, atol=0)
        if g_scale is None:
            assert call["guidance"] is None
        else:
            torch.testing.assert_close(call["guidance"].float(),
                                       torch.full((2,), adapter.config.guidance_scale * g_scale))
    assert len(calls) == (2 if arch == "QwenImagePipeline" else 1)  # true CFG: two forwards


@pytest.mark.parametrize("arch", ["StableDiffusion3Pipeline", "WanPipeline"])
def test_cfg_is_linear_in_the_scale_and_scale_one_is_conditional(arch, tiny_dirs, pipeline_kwargs, prompts):
    def velocity(scale: float) -> torch.Tensor:
        adapter = load_adapter(tiny_dirs[arch], keep_reference=False,
                               **dict(pipeline_kwargs[arch], guidance_scale=scale, negative_prompt="blurry"))
        cond = adapter.encode_prompts(prompts[:2])
        assert ("negative_prompt_embeds" in cond.tensors) == (scale > 1)
        with torch.no_grad():
            return adapter.velocity(_noise(adapter, 2, seed=3), torch.tensor([0.9, 0.5]), cond)

    v1, v2, v5 = velocity(1.0), velocity(2.0), velocity(5.0)
    assert not torch.allclose(v1, v5)
    # v(w) = u + w (c - u) with v(1) = c  ⇒  v(2) = c + (v(5) - c) / 4
    torch.testing.assert_close(v2, v1 + (v5 - v1) / 4, rtol=1e-4, atol=1e-5)


def test_qwen_true_cfg_keeps_the_conditional_norm_per_token(tiny_dirs, pipeline_kwargs, prompts):
    def velocity(scale: float) -> torch.Tensor:
        adapter = load_adapter(tiny_dirs["QwenImagePipeline"], keep_reference=False,
                               **dict(pipeline_kwargs["QwenImagePipeline"], true_cfg_scale=scale))
        with torch.no_grad():
            return adapter.velocity(_noise(adapter, 2, seed=4), torch.tensor([0.9, 0.5]),
                                    adapter.encode_prompts(prompts[:2]))

    conditional, guided = velocity(1.0), velocity(4.0)
    assert not torch.allclose(conditional, guided)
    torch.testing.assert_close(guided.norm(dim=-1), conditional.norm(dim=-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["FluxPipeline", "HunyuanVideoPipeline"])
def test_embedded_guidance_changes_the_velocity(arch, tiny_dirs, pipeline_kwargs, prompts):
    outs = []
    for scale in (1.0, 5.0):
        adapter = load_adapter(tiny_dirs[arch], keep_reference=False,
                               **dict(pipeline_kwargs[arch], guidance_scale=scale))
        with torch.no_grad():
            outs.append(adapter.velocity(_noise(adapter, 2), torch.tensor([0.9, 0.5]),
                                         adapter.encode_prompts(prompts[:2])))
    assert not torch.allclose(outs[0], outs[1])


@pytest.mark.parametrize("arch", tiny_architectures())
def test_prompts_change_the_conditioning(arch, tiny_adapter):
    adapter = tiny_adapter(arch)
    cond = adapter.encode_prompts(["a photo of a cat", "a photo of a dog"])
    embeds = cond.tensors["prompt_embeds"]
    assert embeds.dtype == torch.float32 and embeds.shape[0] == 2
    assert not torch.allclose(embeds[0], embeds[1])


@pytest.mark.parametrize("arch", tiny_architectures())
def test_decode_shapes_and_dtype(arch, tiny_adapter, pipeline_kwargs):
    adapter = tiny_adapter(arch)
    kw = pipeline_kwargs[arch]
    pixels = adapter.decode(_noise(adapter, 3))
    assert pixels.dtype == torch.uint8
    if arch in VIDEO:
        assert pixels.shape == (3, kw["num_frames"], 3, kw["height"], kw["width"])
    else:
        assert pixels.shape == (3, 3, kw["height"], kw["width"])
    assert pixels.float().std() > 0


@pytest.mark.parametrize("arch", tiny_architectures())
def test_sigmas_run_from_one_to_zero(arch, tiny_adapter):
    sigmas = tiny_adapter(arch).sigmas(6)
    assert sigmas.dtype == torch.float32 and sigmas.shape == (7,)
    assert sigmas[0] == pytest.approx(1.0, abs=1e-5) and sigmas[-1] == 0  # UniPC (Wan): 1 − 1e-6
    assert bool((sigmas[1:] < sigmas[:-1]).all())


def test_static_shift_matches_the_closed_form(tiny_adapter):
    """SD3: shifted σ = sσ/(1+(s−1)σ) of the scheduler's linear grid (shift 3, from the tiny scheduler config)."""
    adapter = tiny_adapter("StableDiffusion3Pipeline")
    t = torch.linspace(1000.0, 3.0, 10) / 1000  # t_min: the shifted σ_min (0.001) of the training grid, ×1000
    s = 3.0
    expected = torch.cat([s * t / (1 + (s - 1) * t), torch.zeros(1)])
    torch.testing.assert_close(adapter.sigmas(10), expected, rtol=1e-4, atol=1e-4)


def test_flux_dynamic_shift_grows_with_image_size(tiny_dirs):
    small = load_adapter(tiny_dirs["FluxPipeline"], keep_reference=False, height=64, width=64)
    large = load_adapter(tiny_dirs["FluxPipeline"], keep_reference=False, height=256, width=256)
    assert small.latent_shape() == (16, 16) and large.latent_shape() == (256, 16)
    assert bool((large.sigmas(8)[1:-1] > small.sigmas(8)[1:-1]).all())


def test_default_sizes_and_scales_follow_the_pipeline(tiny_dirs):
    flux = load_adapter(tiny_dirs["FluxPipeline"], keep_reference=False)
    assert (flux.config.height, flux.config.width) == (1024, 1024)  # FluxPipeline.default_sample_size 128 x VAE 8
    assert flux.config.guidance_scale == 3.5 and flux.config.max_sequence_length == 512
    qwen = load_adapter(tiny_dirs["QwenImagePipeline"], keep_reference=False, height=64, width=64)
    assert qwen.config.true_cfg_scale == 4.0 and qwen.config.guidance_scale is None
    sd3 = load_adapter(tiny_dirs["StableDiffusion3Pipeline"], keep_reference=False)
    assert (sd3.config.height, sd3.config.guidance_scale, sd3.config.num_inference_steps) == (128, 7.0, 28)
