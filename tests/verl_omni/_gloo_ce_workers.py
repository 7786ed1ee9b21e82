"""What the Ray workers of test_verl_omni_gloo_checkpoint_engine.py run: a module of its own so that Ray's pickler sends
its classes by name (the workers find it through PYTHONPATH, `WORKER_DIR`); the test module itself cannot be imported
by name in a worker (pytest's importlib mode, verl's own top-level `tests` package)."""

from __future__ import annotations

import os

import torch
from verl.checkpoint_engine.base import CheckpointEngineWorker
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl_omni.workers.engine_workers import ActorRolloutRefWorker

WORKER_DIR = os.path.dirname(os.path.abspath(__file__))


def trainer_weights(weights_file: str, step: int = 0) -> dict[str, torch.Tensor]:
    """The tiny SD3 transformer's weights, plus a bf16 tensor larger than a 1 MiB bucket (split across buckets)
    and an int64 one; `step` > 0: every float weight moved by a step-dependent amount (an optimizer step)."""
    from safetensors.torch import load_file

    weights = load_file(weights_file)
    gen = torch.Generator().manual_seed(1234)
    weights["extra.big_bf16"] = torch.randn(700_000, generator=gen).to(torch.bfloat16)
    weights["extra.counts_i64"] = torch.arange(7, dtype=torch.int64)
    if step:
        gen = torch.Generator().manual_seed(step)
        for name, w in weights.items():
            if w.is_floating_point():
                weights[name] = w + (1e-3 * torch.randn(w.shape, generator=gen)).to(w.dtype)
    return weights


class Engine:
    """Stands in for the trainer's model engine: `get_per_tensor_param` (what verl-omni's update_weights reads)."""

    def __init__(self, weights):
        self.weights, self.module = weights, torch.nn.Module()

    def get_per_tensor_param(self, **kwargs):
        return iter(self.weights.items()), None


class Trainer(ActorRolloutRefWorker):
    """verl-omni's trainer worker with its update_weights / execute_checkpoint_engine / get_lora_peft_config as they
    are; only init_model's model is replaced (the checkpoint engine is built as its step 4 builds it)."""

    def __init__(self, rollout_config, weights_file: str):
        from omegaconf import OmegaConf
        from verl.checkpoint_engine import CheckpointEngineRegistry
        from verl.utils.distributed import initialize_global_process_group_ray
        from verl.utils.import_utils import import_external_libs

        Worker.__init__(self)
        initialize_global_process_group_ray(timeout_second=None, backend="cpu:gloo")
        backend = rollout_config.checkpoint_engine.backend
        self.config = OmegaConf.create({"rollout": {"checkpoint_engine": {"backend": backend},
                                                    "rollout_adapter": None}})
        self.role, self.peft_merge, self.weights_file = "actor", False, weights_file
        self.actor = type("Actor", (), {})()
        self.actor.engine = Engine(trainer_weights(weights_file))
        ce = rollout_config.checkpoint_engine
        import_external_libs(ce.custom_backend_module or None)
        self.checkpoint_engine = CheckpointEngineRegistry.new(
            ce.backend, is_master=(torch.distributed.get_rank() == 0),
            bucket_size=ce.update_weights_bucket_megabytes << 20, **ce.engine_kwargs.get(ce.backend, {}))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self, step: int):
        self.actor.engine.weights = trainer_weights(self.weights_file, step=step)


class Recorder:
    """The rollout server adapter's part of the receive side: what verl's CheckpointEngineWorker hands it."""

    replica_rank, is_leader_rank = 0, True

    def __init__(self):
        self.weights, self.global_steps, self.updates = {}, None, 0

    async def update_weights(self, weights, global_steps=None, **kwargs):
        self.weights = {name: w.clone() async for name, w in weights}
        self.global_steps, self.updates = global_steps, self.updates + 1


class RolloutWorker(CheckpointEngineWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def recorded(self):
        return self.server_adapter.global_steps, self.server_adapter.updates, self.server_adapter.weights


class PipelineTrainer(Trainer):
    """`Trainer` holding exactly the weights of `weights_file` (names as the rollout pipeline loads them), for the
    update of a real replica (tests/verl_omni/_replica_child.py)."""

    def __init__(self, rollout_config, weights_file: str):
        from safetensors.torch import load_file

        super().__init__(rollout_config, weights_file)
        self.actor.engine = Engine(load_file(weights_file))
