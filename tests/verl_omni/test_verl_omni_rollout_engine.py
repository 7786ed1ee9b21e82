"""The rollout engine `verl_omni` (`integrations.verl_omni_rollout`): generators that sample with verl-omni's own
registered rollout pipeline, built by vLLM-Omni's loader in the generator's process (CPU).

What it must deliver is what the package's trainer trains on: for each row, the window's x / x' / σ / σ' / step
indices, and log-probs that the package's policy (the same weights) assigns to those very steps. So every sample is
replayed through the package's adapter (`compute_log_probs`, the old-log-prob pass): <= 1e-5 relative. After a
weight update through the pipeline's `load_weights` (what verl-omni's worker extension calls), the next samples'
log-probs are those of the updated policy (<= 1e-5) and not of the old one (> 1e-2), and the engine's checksum is the
trainer's. Tiny twins of Qwen-Image and SD3 (flow_grpo, CFG on) and Wan2.2 (dance_grpo, CFG on), each full fine-tune
and LoRA (rank 4 on the architecture's default targets, merged into the pipeline's weights on every update).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

import torch  # noqa: E402

from digenrl_verl.diffusion.rollout import RolloutConfig, Trajectory  # noqa: E402
from digenrl_verl.diffusion.tsp import compute_log_probs  # noqa: E402
from digenrl_verl.engines.base import ENGINES, RolloutRows  # noqa: E402
from digenrl_verl.engines.diffusers import load_policy  # noqa: E402
from digenrl_verl.engines.spec import PolicySpec, RolloutEngineSpec  # noqa: E402
from digenrl_verl.models import build_tiny_model_dir  # noqa: E402
from digenrl_verl.models.config import LoraConfig, PipelineConfig  # noqa: E402
from digenrl_verl.weights.state import save_trainer_state  # noqa: E402
from digenrl_verl.weights.sync import state_checksum  # noqa: E402

torch.set_num_threads(1)

CASES = {  # architecture: (package sde_type, noise level, guidance settings)
    "QwenImagePipeline": ("sde", 0.7, {"true_cfg_scale": 4.0, "negative_prompt": " "}),
    "StableDiffusion3Pipeline": ("sde", 0.7, {"guidance_scale": 4.5}),
    "WanPipeline": ("dance", 1.2, {"guidance_scale": 4.5, "num_frames": 5}),
}
ROWS = RolloutRows(["a red cube on a table", "a blue ball", "a green cone in the snow"], ["u0", "u0", "u1"],
                   [0, 1, 0], [0, 1, 2], step=2)


def _spec(arch: str, path: str, lora_rank: int = 0) -> PolicySpec:
    sde, noise, guidance = CASES[arch]
    pipeline = PipelineConfig(height=32, width=32, max_sequence_length=16, **guidance)
    rollout = RolloutConfig(num_inference_steps=4, sde_type=sde, noise_level=noise, timestep_selection="window",
                            sde_window_size=2, sde_window_range=(0, 3), seed=5)
    return PolicySpec(path, LoraConfig(rank=lora_rank), pipeline, rollout, dtype="float32",
                      engine=RolloutEngineSpec(name="verl_omni", dtype="float32"))


@pytest.fixture(scope="module", params=[(a, r) for a in CASES for r in (0, 4)], ids=lambda p: f"{p[0]}-lora{p[1]}")
def case(request, tmp_path_factory):
    arch, rank = request.param
    spec = _spec(arch, str(build_tiny_model_dir(arch, tmp_path_factory.mktemp(arch))), rank)
    engine = ENGINES.engine_class("verl_omni").from_policy(spec)  # what a generator worker builds
    return arch, spec, engine


def _replay_error(spec: PolicySpec, adapter, out) -> float:
    """max |log p(x' | x) under `adapter` - the engine's log-probs| / max |engine's|, over every recorded step."""
    tensors = dict(out.tensors)
    tensors["log_probs"] = tensors.pop("rollout_log_probs")
    tensors["final_latents"] = tensors["latents"][:, 0]  # not read by the replay
    traj = Trajectory.from_tensors(tensors, spec.rollout.sde_type, spec.rollout.noise_level)
    with torch.no_grad():
        got = compute_log_probs(adapter, adapter.encode_prompts(list(ROWS.prompts)), traj)
    return float((got - traj.log_probs).abs().max() / traj.log_probs.abs().max())


def test_samples_are_what_the_package_policy_trains_on(case):
    arch, spec, engine = case
    out = engine.generate(ROWS)
    t = out.tensors
    assert type(engine.handle.pipe).__module__.startswith("verl_omni.pipelines.")  # verl-omni's own pipeline ran
    assert t["latents"].shape == t["next_latents"].shape and t["latents"].shape[:2] == (3, 2)
    assert t["rollout_log_probs"].shape == t["sigmas"].shape == t["step_index"].shape == (3, 2)
    assert t["policy_version"].tolist() == [0, 0, 0]
    assert bool((t["step_index"].diff(dim=1) == 1).all()) and int(t["step_index"].max()) <= 3
    schedule = torch.as_tensor(engine.handle.pipe.scheduler.sigmas).float()
    torch.testing.assert_close(t["sigmas"], schedule[t["step_index"]])
    torch.testing.assert_close(t["next_sigmas"], schedule[t["step_index"] + 1])
    assert out.images.dtype == torch.uint8 and out.images.shape[0] == 3
    assert bool(torch.isfinite(t["rollout_log_probs"]).all())
    assert _replay_error(spec, load_policy(spec), out) <= 1e-5


@pytest.mark.parametrize("route", ["checkpoint", "hand_over"])
def test_a_weight_update_changes_the_next_sample_as_the_trainer_weights_say(case, tmp_path, route):
    """`route`: a resumed checkpoint (`load_weights`), or a colocated trainer's weights (`hand_over`, the hybrid
    engine's sync before a TAG micro-batch); the generator's broadcast (`receive_weights`) lands in the same shadow
    parameters and runs the same `load_pipeline_weights`."""
    arch, spec, engine = case
    trainer = load_policy(spec)
    params = {n: p for n, p in trainer.transformer.named_parameters() if p.requires_grad}
    assert state_checksum({k: v.detach() for k, v in params.items()}) == engine.checksum()
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir(), after.mkdir()
    save_trainer_state(before, params, torch.optim.SGD(list(params.values()), lr=0.0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in params.values():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    save_trainer_state(after, params, torch.optim.SGD(list(params.values()), lr=0.0))
    try:
        if route == "checkpoint":
            engine.load_weights(str(after), 1)  # -> the pipeline's load_weights, as verl-omni's update does
        else:
            engine.hand_over({k: v.detach() for k, v in params.items()}, 1)
        assert engine.checksum() == state_checksum({k: v.detach() for k, v in params.items()})
        out = engine.generate(replace(ROWS, step=3))
        assert out.tensors["policy_version"].tolist() == [1, 1, 1]
        assert _replay_error(spec, trainer, out) <= 1e-5
        assert _replay_error(spec, load_policy(spec), out) > 1e-2  # the old weights do not explain it
    finally:  # the module's engine goes back to the model's weights
        engine.load_weights(str(before), 0)


def _named_dir(tmp_path, architecture: str = "StableDiffusion3Pipeline") -> str:
    (tmp_path / "model_index.json").write_text(f'{{"_class_name": "{architecture}"}}')
    return str(tmp_path)


@pytest.mark.parametrize("change, key", [
    ({"rollout": RolloutConfig(num_inference_steps=4, timestep_selection="flow_grpo")},
     "actor_rollout_ref.rollout.algo.timestep_selection"),
])
def test_what_the_engine_cannot_do_is_refused_by_name(change, key, tmp_path):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):  # PolicySpec checks on construction
        replace(_spec("StableDiffusion3Pipeline", _named_dir(tmp_path)), **change)


def test_gpu_placement_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name=verl_omni runs"):
        replace(_spec("StableDiffusion3Pipeline", _named_dir(tmp_path)), device="cuda")


def test_an_architecture_the_engine_does_not_map_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.architecture='FluxPipeline' with"):
        _spec("StableDiffusion3Pipeline", _named_dir(tmp_path, "FluxPipeline"))


# ----------------------------------------------------------------------------- verl-omni's server code as the contract
def test_each_row_is_seeded_as_verl_omnis_trainer_and_agent_loop_seed_it():
    """A row's request carries the seed verl-omni's v0 trainer and agent loop give the same row (the step's base
    ``rollout.seed + global_steps - 1``, the row's global index in the interleaved step batch, then
    `maybe_per_rollout_seeds`) and verl-omni's ``global_steps`` (from 1), whatever part of the step batch a worker
    samples (here rows 5, 0 and 3 of it, as a TAG share): the replica and this engine draw the same sample."""
    from types import SimpleNamespace

    import numpy as np
    from verl_omni.agent_loop.utils import maybe_per_rollout_seeds

    from digenrl_verl.integrations.verl_omni_rollout import VerlOmniRolloutEngine

    rows = RolloutRows(list(ROWS.prompts), list(ROWS.uids), list(ROWS.sample_indices), [5, 0, 3], step=ROWS.step)
    tokens = (torch.tensor([[7, 8]]), torch.tensor([[1, 1]]))
    engine = object.__new__(VerlOmniRolloutEngine)  # no pipeline: only the requests are built
    engine.handle = type("Handle", (), {"pipe": type("Pipe", (), {"_tokenize_text_prompt": lambda s, t: tokens})()})()
    engine.spec = SimpleNamespace(pipeline=SimpleNamespace(negative_prompt=" ", max_sequence_length=16),
                                  rollout=SimpleNamespace(seed=5))
    engine.architecture = "QwenImagePipeline"
    engine.sampling = {"true_cfg_scale": 4.0}
    global_steps = rows.step + 1
    meta = {"rollout_seed": engine.spec.rollout.seed + global_steps - 1}  # RayFlowGRPOTrainer.fit
    theirs = maybe_per_rollout_seeds(meta, len(rows), np.asarray(rows.sample_ids, dtype=np.int64))
    requests = engine.server_requests(rows)
    assert [r["sampling_params"]["seed"] for r in requests] == theirs
    assert [r["sampling_params"]["global_steps"] for r in requests] == [global_steps] * len(rows)


@pytest.fixture(scope="module")
def server_module():
    """verl-omni's `vllm_omni_async_server` module, imported on CPU: it imports torchvision (stubbed by the harness,
    as for Wan) and, through vLLM-Omni's CLI, torchaudio, whose PyPI wheels are CUDA builds (three empty stand-in
    modules, removed again once the module is imported; nothing here calls them)."""
    import importlib.machinery
    import sys
    import types

    from digenrl_verl.integrations.vllm_omni_cpu import stub_torchvision

    stub_torchvision()
    added = []
    for name in ("torchaudio", "torchaudio.functional", "torchaudio.transforms"):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            mod.__path__ = []
            sys.modules[name] = mod
            added.append(name)
    if "torchaudio.functional" in added:
        sys.modules["torchaudio.functional"].melscale_fbanks = None
    try:
        import verl_omni.workers.rollout.vllm_rollout.vllm_omni_async_server as server
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return server


def _server(server_module, engine):
    """verl-omni's `vLLMOmniHttpServer` with only what its diffusion `_preprocess_input` / `_process_output` read
    (no AsyncOmni, no HTTP server): `_to_tensor` is torchvision's `PILToTensor`, here as numpy (uint8 CHW)."""
    import numpy as np
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    srv = object.__new__(server_module.vLLMOmniHttpServer)
    srv._ar_mode, srv.global_steps = False, ROWS.step + 1  # verl-omni counts steps from 1
    srv.engine = type("Engine", (), {"default_sampling_params_list": [OmniDiffusionSamplingParams()]})()
    srv._to_tensor = lambda image: torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
    return srv


def test_requests_and_outputs_are_what_verl_omnis_server_makes_of_them(case, server_module):
    """The engine builds each request as verl-omni's server would from the same ids and sampling dict
    (`_preprocess_input`), and reads each output as the server does after vLLM-Omni's own post-processing
    (`DiffusionEngine.postprocess_output`, then `_process_output`): the same latents, timesteps, log-probs and
    uint8 sample, bit for bit."""
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine

    arch, spec, engine = case
    srv = _server(server_module, engine)
    requests = engine.requests(ROWS)
    for req in requests:
        fields, params = dict(req.prompt), req.sampling_params
        sampling = {**engine.sampling, "seed": params.seed, "global_steps": ROWS.step + 1,
                    "num_outputs_per_prompt": 1}
        prompt, server_params = srv._preprocess_input(  # SD3: ids per text encoder too, as verl-omni's agent loop
            fields["prompt_token_ids"], dict(sampling), {}, None, fields.get("negative_prompt_ids"),
            extra_prompt_ids=fields.get("extra_prompt_ids"),
            negative_extra_prompt_ids=fields.get("negative_extra_prompt_ids"))
        assert prompt == fields
        theirs = server_params[-1]
        for name in (*engine.sampling, "seed", "num_outputs_per_prompt"):
            mine = getattr(params, name, None) if hasattr(type(params), name) else params.extra_args.get(name)
            got = getattr(theirs, name, None) if hasattr(type(theirs), name) else theirs.extra_args.get(name)
            assert mine == got, (name, mine, got)
        assert params.extra_args == theirs.extra_args
    out = engine.generate(ROWS)
    outputs = engine._forward(engine.requests(ROWS))
    post = object.__new__(DiffusionEngine)
    post.od_config = engine.handle.od_config
    post._init_process_hooks(engine.handle.od_config)
    for r, (req, output) in enumerate(zip(requests, outputs)):
        result = post.postprocess_output(req, output)[0]
        theirs = srv._process_output(result, None, dict(engine.sampling))
        lat = theirs.extra_fields["all_latents"].float()
        assert torch.equal(lat[:-1], out.tensors["latents"][r]) and torch.equal(lat[1:], out.tensors["next_latents"][r])
        assert torch.equal(theirs.log_probs.float(), out.tensors["rollout_log_probs"][r])
        assert torch.equal(theirs.extra_fields["all_timesteps"].float() / 1000, out.tensors["sigmas"][r])
        sample = theirs.diffusion_output
        assert sample.dtype == torch.uint8
        if sample.dim() == 5:  # a video comes out [1, T, H, W, C]; the package's scorers take [T, C, H, W]
            sample = sample[0].permute(0, 3, 1, 2)
        assert torch.equal(sample, out.images[r]), (arch, theirs.diffusion_output.shape)
