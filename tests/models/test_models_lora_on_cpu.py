"""LoRA (peft) and full fine-tuning: what is trainable, the reference policy, and the trainable state."""

from __future__ import annotations

import pytest
import torch

from digenrl_verl.models import LoraConfig, get_model_spec, load_adapter, state_checksum, tiny_architectures

SIGMA = torch.tensor([0.9, 0.4])


def _inputs(adapter, prompts):
    x = adapter.initial_noise([torch.Generator().manual_seed(i) for i in range(2)])
    return x, SIGMA, adapter.encode_prompts(prompts[:2])


def _sgd_step(adapter, x, sigma, cond, lr: float = 0.5) -> None:
    params = adapter.trainable_parameters()
    loss = adapter.velocity(x, sigma, cond).square().mean()
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.add_(g, alpha=-lr / (float(g.norm()) + 1e-12))


@pytest.mark.parametrize("arch", tiny_architectures())
def test_lora_trains_only_the_adapter_and_reference_is_the_base(arch, tiny_dirs, pipeline_kwargs, prompts):
    adapter = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=4, alpha=8), **pipeline_kwargs[arch])
    assert adapter.lora.enabled
    named = [(n, p) for n, p in adapter.transformer.named_parameters() if p.requires_grad]
    assert named and all("lora_" in n for n, _ in named)
    assert adapter.trainable_parameters() == [p for _, p in named]
    # only LoRA-wrapped modules among the architecture's default targets
    wrapped = {n.split(".lora_")[0] for n, _ in named}
    assert all(any(w.endswith(t) for t in get_model_spec(arch).lora_targets) for w in wrapped)
    for module in (adapter.pipeline.vae, adapter.pipeline.text_encoder):
        assert not any(p.requires_grad for p in module.parameters())

    x, sigma, cond = _inputs(adapter, prompts)
    with torch.no_grad():
        with adapter.reference():
            base = adapter.velocity(x, sigma, cond)
        at_init = adapter.velocity(x, sigma, cond)
    assert torch.equal(at_init, base)  # gaussian init: B = 0, the adapter adds exactly nothing

    _sgd_step(adapter, x, sigma, cond)
    with torch.no_grad():
        after = adapter.velocity(x, sigma, cond)
        with adapter.reference():
            reference = adapter.velocity(x, sigma, cond)
    assert not torch.allclose(after, base)
    assert torch.equal(reference, base)


def test_full_finetune_reference_is_a_frozen_copy(tiny_dirs, pipeline_kwargs, prompts):
    arch = "StableDiffusion3Pipeline"
    adapter = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=0), **pipeline_kwargs[arch])
    params = adapter.trainable_parameters()
    assert len(params) == len(list(adapter.denoiser.parameters()))
    x, sigma, cond = _inputs(adapter, prompts)
    with torch.no_grad():
        before = adapter.velocity(x, sigma, cond)
    _sgd_step(adapter, x, sigma, cond)
    with torch.no_grad():
        after = adapter.velocity(x, sigma, cond)
        with adapter.reference():
            assert adapter.trainable_parameters() == []
            reference = adapter.velocity(x, sigma, cond)
    assert not torch.allclose(after, before)
    assert torch.equal(reference, before)
    assert adapter.trainable_parameters() == params  # the policy is back after the context


def test_full_finetune_without_reference_refuses_reference(tiny_dirs, pipeline_kwargs):
    adapter = load_adapter(tiny_dirs["FluxPipeline"], keep_reference=False, **pipeline_kwargs["FluxPipeline"])
    with pytest.raises(ValueError, match="keep_reference=True"):
        with adapter.reference():
            pass


@pytest.mark.parametrize("lora", [LoraConfig(rank=4, alpha=8), LoraConfig(rank=0)], ids=["lora", "full"])
def test_trainable_state_syncs_a_second_worker(lora, tiny_dirs, pipeline_kwargs, prompts):
    arch = "FluxPipeline"
    trainer = load_adapter(tiny_dirs[arch], lora=lora, **pipeline_kwargs[arch])
    generator = load_adapter(tiny_dirs[arch], lora=lora, keep_reference=False, **pipeline_kwargs[arch])
    assert state_checksum(trainer.trainable_state()) == state_checksum(generator.trainable_state())

    x, sigma, cond = _inputs(trainer, prompts)
    _sgd_step(trainer, x, sigma, cond)
    state = trainer.trainable_state()
    assert all(t.device.type == "cpu" and not t.requires_grad for t in state.values())
    assert state_checksum(state) != state_checksum(generator.trainable_state())

    generator.load_trainable_state(state)
    assert state_checksum(generator.trainable_state()) == state_checksum(state)
    with torch.no_grad():
        assert torch.equal(generator.velocity(x, sigma, cond), trainer.velocity(x, sigma, cond))


def test_trainable_state_rejects_a_mismatched_state(tiny_dirs, pipeline_kwargs):
    arch = "FluxPipeline"
    lora = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=4), **pipeline_kwargs[arch])
    state = lora.trainable_state()
    with pytest.raises(ValueError, match="missing"):
        lora.load_trainable_state(dict(list(state.items())[1:]))
    name = next(iter(state))
    with pytest.raises(ValueError, match="shape"):
        lora.load_trainable_state({**state, name: torch.zeros(3)})
    full = load_adapter(tiny_dirs[arch], keep_reference=False, **pipeline_kwargs[arch])
    with pytest.raises(ValueError, match="unexpected"):
        full.load_trainable_state(state)


def test_lora_init_is_seeded_and_leaves_global_rng_alone(tiny_dirs, pipeline_kwargs):
    arch = "StableDiffusion3Pipeline"
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=4, seed=7), **pipeline_kwargs[arch])
    assert torch.equal(torch.rand(1), expected_next)
    b = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=4, seed=7), **pipeline_kwargs[arch])
    c = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=4, seed=8), **pipeline_kwargs[arch])
    assert state_checksum(a.trainable_state()) == state_checksum(b.trainable_state())
    assert state_checksum(a.trainable_state()) != state_checksum(c.trainable_state())


def test_lora_target_modules_override_and_errors(tiny_dirs, pipeline_kwargs):
    arch = "StableDiffusion3Pipeline"
    only_q = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=2, target_modules=("to_q",)), **pipeline_kwargs[arch])
    wrapped = {n.split(".lora_")[0] for n, p in only_q.transformer.named_parameters() if p.requires_grad}
    assert wrapped and all(n.endswith("to_q") for n in wrapped)
    all_linear = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=2, target_modules="all-linear"),
                              **pipeline_kwargs[arch])
    assert len(all_linear.trainable_parameters()) > len(only_q.trainable_parameters())
    with pytest.raises(ValueError, match="target_modules"):
        load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=2, target_modules=("no_such_layer",)),
                     **pipeline_kwargs[arch])


def test_gradient_checkpointing_gives_the_same_gradients(tiny_dirs, pipeline_kwargs, prompts):
    arch = "FluxPipeline"
    grads = []
    for checkpointing in (False, True):
        adapter = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=4), gradient_checkpointing=checkpointing,
                               **pipeline_kwargs[arch])
        assert adapter.denoiser.is_gradient_checkpointing == checkpointing
        x, sigma, cond = _inputs(adapter, prompts)
        loss = adapter.velocity(x, sigma, cond).square().mean()
        grads.append(torch.autograd.grad(loss, adapter.trainable_parameters()))
    for plain, checkpointed in zip(*grads):
        torch.testing.assert_close(checkpointed, plain, rtol=1e-5, atol=1e-7)


def test_default_lora_init_also_starts_at_the_base_model(tiny_dirs, pipeline_kwargs, prompts):
    arch = "WanPipeline"
    adapter = load_adapter(tiny_dirs[arch], lora=LoraConfig(rank=4, init_weights="default"), **pipeline_kwargs[arch])
    x, sigma, cond = _inputs(adapter, prompts)
    a_weights = [p for n, p in adapter.transformer.named_parameters() if "lora_A" in n]
    assert a_weights and all(float(p.detach().abs().sum()) > 0 for p in a_weights)
    with torch.no_grad():
        with adapter.reference():
            base = adapter.velocity(x, sigma, cond)
        assert torch.equal(adapter.velocity(x, sigma, cond), base)
