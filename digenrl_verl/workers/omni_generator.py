"""The generator rank of `actor_rollout_ref.rollout.name=vllm_omni`: a vLLM-Omni engine instead of an in-process
policy.

`OmniGeneratorWorker` has the generator's interface (`generate`, `score`, `receive_weights`, `join`, `checksum`,
`load_weights`), so the schedule and the Ray executor do not know which backend runs; the runner picks the class
from the config. Where `GeneratorWorker` samples with its own `DiffusionAdapter`, this one sends one request per
prompt to its engine (`integrations.vllm_omni.VllmOmniGenerator`), whose pipeline runs DigenRL's rollout code,
and it maps the outputs back to the shard's rows with `workers.roles.generation_batches`, so the trainer receives
the same DataProto keys from either backend. The policy weights live in the engine's worker process: that
process, not this actor, joins the trainer → generator process group (through the worker extension) and receives
the weights after each optimizer step; a trajectory carries the version its request ran with, which must be the
version the schedule asked for.

Nothing here imports vLLM; the engine does, when it is built (GPU machines).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from verl import DataProto
from verl.single_controller.base.decorator import Dispatch, register

from digenrl_verl.rewards.compose import RewardConfig
from digenrl_verl.workers.roles import (ScoringMixin, _Base, _rss_mb, check_generation_version,
                                        generation_batches)
from digenrl_verl.workers.specs import PolicySpec
from digenrl_verl.workers.weight_sync import CollectiveSpec, state_checksum


class OmniGeneratorWorker(_Base, ScoringMixin):
    """Generator pool rank driving a vLLM-Omni engine; it scores its samples itself (reward with the generator).

    Args:
        policy: the run's policy spec (`policy.engine` holds the engine settings).
        reward: the reward functions.
        engine: `vllm_omni` (AsyncOmni, GPU) or `inprocess` (`integrations.vllm_omni.InProcessOmniEngine`, the
            vLLM-free reference engine that the CPU tests use; not reachable from the config).
    """

    role = "generator"

    def __init__(self, policy: PolicySpec, reward: RewardConfig, torch_threads: int = 1,
                 engine: str = "vllm_omni") -> None:
        super().__init__()
        from digenrl_verl.integrations.vllm_omni import VllmOmniGenerator

        torch.set_num_threads(torch_threads)
        self.policy_spec = policy
        self.version = policy.start_version
        self.busy_s = 0.0
        spec = policy.engine
        self.generator = VllmOmniGenerator(policy.model_path, policy.pipeline, policy.rollout, spec.engine_kwargs,
                                           dtype=spec.dtype if engine == "vllm_omni" else policy.dtype,
                                           start_version=policy.start_version, lora=policy.lora, engine=engine,
                                           device=policy.device)
        self.reward_spec = reward
        self._build_scorer(reward)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join(self, spec: CollectiveSpec) -> int:
        """The engine's worker process joins the process group as this generator rank (collective)."""
        return int(self.generator.join(spec, self.rank))

    def generate(self, shard: DataProto, sample_ids: list[int], version: int) -> tuple[DataProto, DataProto]:
        """One request per prompt of the shard to the engine, which must hold `version`."""
        check_generation_version(self, version)
        t0 = time.perf_counter()
        nt = shard.non_tensor_batch
        tensors, images = self.generator.generate_sync(
            list(nt["raw_prompt"]), [str(u) for u in nt["uid"]], [int(i) for i in nt["sample_index"]],
            list(sample_ids), step=int(shard.meta_info["global_step"]), version=version)
        got = sorted(set(tensors["policy_version"].tolist()))
        if got != [version]:
            raise RuntimeError(f"vLLM-Omni engine of generator rank {self.rank} sampled with versions {got}, the "
                               f"schedule asked for {version}")
        rollout = self.policy_spec.rollout
        out = generation_batches(tensors, images, shard, sample_ids, rollout.sde_type, rollout.noise_level)
        self.busy_s += time.perf_counter() - t0
        return out

    def receive_weights(self, version: int) -> int:
        t0 = time.perf_counter()
        self.generator.receive_weights(version)
        self.version = version
        self.busy_s += time.perf_counter() - t0
        return version

    def load_weights(self, path: str, version: int) -> int:
        self.generator.rpc("digenrl_load_weights", path, version)
        self.version = version
        return version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def current_version(self) -> int:
        return self.version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The engine's weights (those its next request uses)."""
        return self.generator.rpc("digenrl_trainable_state")["state"]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def checksum(self) -> dict[str, Any]:
        answer = self.generator.rpc("digenrl_trainable_state")
        if answer["version"] != self.version:
            raise RuntimeError(f"generator rank {self.rank} expects version {self.version}, its engine holds "
                               f"{answer['version']}")
        return {"version": self.version, "checksum": state_checksum(answer["state"]), "rss_mb": _rss_mb(),
                "busy_s": self.busy_s, "pid": os.getpid()}
