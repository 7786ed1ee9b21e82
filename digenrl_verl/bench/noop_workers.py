"""No-op stand-ins for the generator and trainer workers, for `bench driver`.

They expose the methods the Ray executor calls on the real workers (`workers/roles.py`), with the same parameters
(names and kinds; a test holds them to the real signatures): the data calls' entry points (`generate_call`,
`score_call`, `update_call`, one message each, `workers.calls`) unpack into the typed methods as the real ones do,
and return minimal values of the right shape at once: `generate` three returns (trajectory, images, facts), `score` the
sample ids and one reward each, `update` loss statistics, `opt_step` the optimizer facts, `send_weights` /
`receive_weights` the version. This module imports numpy only: 64 actor processes that each imported torch and
verl would need ~28 GB of memory on their own (the bench hands them a numpy batch; `update_call` makes the
advantages numpy where the real one makes a tensor).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from digenrl_verl.workers.calls import unpack


class StepBatch:
    """The parts of a step's DataProto the executor reads: `len`, `non_tensor_batch["uid"]`, `select_idxs`."""

    def __init__(self, uids: np.ndarray, sample_ids: np.ndarray) -> None:
        self.non_tensor_batch = {"uid": uids}
        self.sample_ids = sample_ids

    @classmethod
    def of(cls, prompts: int, n: int) -> "StepBatch":
        rows = prompts * n
        return cls(np.array([f"uid{i // n}" for i in range(rows)], dtype=object), np.arange(rows, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.sample_ids)

    def select_idxs(self, idxs: np.ndarray) -> "StepBatch":
        return StepBatch(self.non_tensor_batch["uid"][idxs], self.sample_ids[idxs])


class NoopWorker:
    """One generator or trainer rank that does no work. `seed` varies the rewards between ranks."""

    def __init__(self, seed: int = 0) -> None:
        self.version = 0
        self.rng = np.random.default_rng(seed)

    def ready(self) -> bool:
        return True

    def generate_call(self, shard: StepBatch, message: bytes) -> tuple[dict, np.ndarray, dict]:
        return self.generate(shard, *unpack(message))

    def score_call(self, message: bytes, *image_parts: np.ndarray) -> dict[str, list]:
        return self.score(*unpack(message), *image_parts)

    def update_call(self, message: bytes, *traj_parts: dict) -> dict[str, float]:
        sample_ids, advantages, *rest = unpack(message)
        return self.update(sample_ids, np.asarray(advantages, dtype=np.float32), *rest, *traj_parts)

    def generate(self, shard: StepBatch, sample_ids: Sequence[int], version: int) -> tuple[dict, np.ndarray, dict]:
        ids = np.asarray(sample_ids, dtype=np.int64)
        trajectory = {"sample_id": ids, "policy_version": np.full(len(ids), version, dtype=np.int64)}
        return trajectory, np.zeros((len(ids), 3, 2, 2), dtype=np.uint8), {"samples": len(ids), "version": version}

    def score(self, sample_ids: Sequence[int], *image_parts: np.ndarray) -> dict[str, list]:
        return {"sample_ids": list(sample_ids), "scores": self.rng.random(len(sample_ids)).tolist()}

    def update(self, sample_ids: Sequence[int], advantages: Any, loss_denominator: float, tsp: bool, version: int,
               max_share: int, *traj_parts: dict) -> dict[str, float]:
        return {"loss": 0.0, "rows": float(len(sample_ids))}

    def opt_step(self, version: int, grad_scale: float = 1.0) -> dict[str, float]:
        self.version = version
        return {"grad_norm": 0.0, "skipped": 0.0, "version": float(version)}

    def send_weights(self, version: int, generators: Sequence[int]) -> int:
        return version

    def receive_weights(self, version: int) -> int:
        self.version = version
        return version
