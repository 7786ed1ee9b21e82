"""A generator samples in `actor_rollout_ref.rollout.dtype` (verl-omni's rollout does; its default is bf16) while the
trainer trains in `actor.fsdp_config.model_dtype`: the generator's diffusers policy is loaded in the rollout's dtype
and the trainer's weights, sent in the trained dtype, are cast on arrival. Real processes, a real gloo pair group."""

from __future__ import annotations

import io
import multiprocessing as mp
import sys
import warnings
from pathlib import Path

import pytest
import torch

from digenrl_verl.engines.diffusers import DiffusersEngine
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.models.tiny import build_tiny_model_dir
from digenrl_verl.trainer.config import build_run
from digenrl_verl.weights.sync import CollectiveSpec, free_port

if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
import _dtype_sync_ranks as ranks  # noqa: E402


def _policy(model_dir: str, rollout_dtype: str, lora_rank: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        spec = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model_dir}",
                                  f"actor_rollout_ref.model.lora_rank={lora_rank}",
                                  f"actor_rollout_ref.rollout.dtype={rollout_dtype}"]))
    return spec.policy


LORA_RANKS = (0, 4)


@pytest.fixture(scope="module")
def exchanged(tmp_path_factory) -> dict[int, tuple[object, dict, dict]]:
    """lora rank -> (policy, what the trainer sent, what the generator holds), every case through one trainer and one
    generator process (spawned: the pytest process holds threads, a forked child could hang), each its own gloo
    rendezvous."""
    model_dir = str(build_tiny_model_dir("FluxPipeline", tmp_path_factory.mktemp("dtype") / "model", seed=0))
    policies = {r: _policy(model_dir, "bfloat16", r) for r in LORA_RANKS}
    cases = [(CollectiveSpec("127.0.0.1", free_port(), 1, 1, timeout_s=60.0), policies[r]) for r in LORA_RANKS]
    ctx = mp.get_context("spawn")
    out_t, out_g = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=ranks.trainer, args=(cases, out_t)),
             ctx.Process(target=ranks.generator, args=(cases, out_g))]
    for p in procs:
        p.start()
    try:
        got = {r: tuple(torch.load(io.BytesIO(q.get(timeout=240))) for q in (out_t, out_g)) for r in LORA_RANKS}
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return {r: (policies[r], *got[r]) for r in LORA_RANKS}


@pytest.mark.slow  # two processes
@pytest.mark.parametrize("lora_rank", LORA_RANKS)
def test_a_bf16_generator_receives_the_fp32_trainers_weights_cast(exchanged, lora_rank):
    """Full fine-tune: every trainable weight is bf16 on the generator, received through an fp32 buffer and cast.
    LoRA: the frozen base is bf16, the adapters stay fp32 (PEFT keeps adapter weights in fp32), received as sent."""
    policy, sent, got = exchanged[lora_rank]
    assert policy.dtype == "float32" and policy.engine.dtype == "bfloat16"
    params = list(DiffusersEngine.from_policy(policy).adapter.transformer.parameters())
    assert {p.dtype for p in params if not p.requires_grad} <= {torch.bfloat16}
    trained = {p.dtype for p in params if p.requires_grad}
    assert trained == ({torch.bfloat16} if lora_rank == 0 else {torch.float32})
    assert sorted(sent) == sorted(got) and sent
    for k in sent:
        assert got[k].dtype in trained
        assert torch.equal(got[k], sent[k].to(got[k].dtype)), k  # cast on arrival, nothing else


def test_the_tiny_preset_samples_in_the_trained_dtype(tmp_path):
    """The CPU demo passes rollout.dtype=float32 with its fp32 model: no cast, the generator's policy is the
    trainer's bit for bit (the on-policy equivalence tests rely on it)."""
    model_dir = str(build_tiny_model_dir("FluxPipeline", tmp_path / "model", seed=0))
    policy = build_run(compose([TINY_CPU, f"actor_rollout_ref.model.path={model_dir}"])).policy
    assert policy.engine.dtype == policy.dtype == "float32"
    params = DiffusersEngine.from_policy(policy).adapter.transformer.parameters()
    assert {p.dtype for p in params} == {torch.float32}
