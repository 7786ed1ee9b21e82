"""The diffusers rollout engine (`actor_rollout_ref.rollout.name=diffusers`, the default): the policy in this
process, sampled with `diffusion.rollout.rollout`.

Generators hold one over their own copy of the policy; trainers (TAG) and colocated workers hold one over the
policy they train, so a TAG micro-batch goes through the same code as a generator's (`workers.roles`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from digenrl_verl.diffusion.noise import SampleKey
from digenrl_verl.diffusion.rollout import RolloutConfig, Trajectory, rollout
from digenrl_verl.engines.base import ENGINES, InPlaceWeights, Rollout, RolloutRows
from digenrl_verl.engines.spec import PolicySpec
from digenrl_verl.models.base import DiffusionAdapter
from digenrl_verl.models.registry import load_adapter


def load_policy(spec: PolicySpec, *, keep_reference: bool = False) -> DiffusionAdapter:
    """The policy's adapter on `spec.device`. `keep_reference`: full fine-tune keeps a frozen copy for the KL
    term (LoRA needs none: its reference is the adapter disabled); only trainers with a KL term ask for it."""
    return load_adapter(spec.model_path, lora=spec.lora, pipeline=spec.pipeline, device=torch.device(spec.device),
                        dtype=getattr(torch, spec.dtype), keep_reference=keep_reference)


@ENGINES.register("diffusers")
class DiffusersEngine(InPlaceWeights):
    """Samples with a `DiffusionAdapter` held in this process.

    Args:
        adapter: the policy (its trainable parameters are the weights synced and checkpointed).
        rollout: SDE kind, noise level, timestep selection, seeds.
        version: the policy version of the adapter's weights.
    """

    def __init__(self, adapter: DiffusionAdapter, rollout: RolloutConfig, version: int = 0) -> None:
        self.adapter = adapter
        self.rollout = rollout
        self.version = int(version)

    @classmethod
    def from_policy(cls, spec: PolicySpec) -> "DiffusersEngine":
        """A generator's engine: its own copy of the policy, at `spec.start_version`, in the rollout's dtype
        (`actor_rollout_ref.rollout.dtype`, as verl-omni's rollout samples); the trainer's weights arrive in the
        trainer's dtypes and are cast on arrival (`weights.sync`)."""
        return cls(load_policy(replace(spec, dtype=spec.engine.dtype)), spec.rollout, spec.start_version)

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        """The trainable parameters, live (weights are received and loaded into them in place)."""
        return {n: p for n, p in self.adapter.transformer.named_parameters() if p.requires_grad}

    def generate(self, rows: RolloutRows, min_rows: int = 0) -> Rollout:
        """One trajectory per row. With `rollout.rows_alone` each row is drawn in a batch of its own, and `min_rows`
        (sharded trainer ranks, whose forwards are collectives) pads this call with dummy rows, drawn and dropped, up
        to the largest share of the micro-batch, so every rank runs the same forwards."""
        keys = [SampleKey(rows.step, str(u), int(i)) for u, i in zip(rows.uids, rows.sample_indices)]
        if self.rollout.rows_alone:
            drawn = [self._draw([p], [k]) for p, k in zip(rows.prompts, keys)]
            for _ in range(len(keys), min_rows):
                self._draw([""], [SampleKey(-1, "pad", 0)])
            traj, images = Trajectory.cat([t for t, _ in drawn]), torch.cat([i for _, i in drawn])
        else:
            traj, images = self._draw(list(rows.prompts), keys)
        traj = traj.to("cpu")  # results travel through Ray's object store
        tensors = traj.tensors()
        tensors.update(rollout_log_probs=traj.log_probs,
                       policy_version=torch.full((traj.batch_size,), self.version, dtype=torch.int64))
        return Rollout(tensors, images.cpu())

    def _draw(self, prompts: list[str], keys: list[SampleKey]) -> tuple[Trajectory, torch.Tensor]:
        traj = rollout(self.adapter, self.adapter.encode_prompts(prompts), keys, self.rollout)
        return traj, self.adapter.decode(traj.final_latents)
