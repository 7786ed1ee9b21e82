"""The DataProtos the workers exchange: step-batch columns, the two `generate` outputs, reward extras.

Keys of the step batch (`trainer.data.make_step_batch`): non-tensor `raw_prompt`, `uid`, `sample_index`,
`data_source`, and `EXTRA_COLUMNS` when the prompt file has them; `meta_info["global_step"]`. The keys of
`generation_batches` are listed in `workers.roles`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from verl import DataProto

#: verl-style prompt-file columns carried per row to the reward functions (`reward_model.ground_truth`, ...)
EXTRA_COLUMNS = ("reward_model", "extra_info")
TRAJECTORY_KEYS = ("latents", "next_latents", "sigmas", "next_sigmas", "step_index")


def reward_extras(nt: dict, sample_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Per-sample `extra` dicts for the reward functions, after verl-omni's
    compute_score(data_source, solution_image, ground_truth, extra_info) contract: `reward_model` (with its
    `ground_truth`) from the prompt file, and `extra_info` = the file's extra_info plus uid, sample id, prompt."""
    out = []
    for row, sid in enumerate(sample_ids):
        info = dict(nt["extra_info"][row]) if "extra_info" in nt else {}
        info.update(uid=nt["uid"][row], sample_id=int(sid), prompt=nt["raw_prompt"][row])
        extra = {"data_source": nt["data_source"][row], "extra_info": info}
        if "reward_model" in nt:
            extra["reward_model"] = dict(nt["reward_model"][row])
        out.append(extra)
    return out


def concat_rows(parts: Sequence[DataProto], sample_ids: Sequence[int]) -> DataProto:
    """The rows of `parts` whose `sample_id` is listed, in the order of `sample_ids`."""
    merged = DataProto.concat(list(parts)) if len(parts) > 1 else parts[0]
    pos = {int(s): i for i, s in enumerate(merged.batch["sample_id"].tolist())}
    missing = [s for s in sample_ids if int(s) not in pos]
    if missing:
        raise KeyError(f"samples {missing} are not in the data this worker received")
    return merged.select_idxs(np.asarray([pos[int(s)] for s in sample_ids], dtype=np.int64))


def generation_batches(tensors: Mapping[str, torch.Tensor], images: torch.Tensor, shard: DataProto,
                       sample_ids: Sequence[int], sde_type: str, noise_level: float) -> tuple[DataProto, DataProto]:
    """The two DataProtos a `generate` call returns (keys in `workers.roles`), from the trajectory tensors
    of the shard's rows (`TRAJECTORY_KEYS`, `rollout_log_probs`, `policy_version`) and their decoded images.
    Shared by every rollout engine, so the trainer cannot tell them apart."""
    nt = shard.non_tensor_batch
    step = int(shard.meta_info["global_step"])
    ids = torch.as_tensor(list(sample_ids), dtype=torch.int64)
    batch = {k: tensors[k] for k in (*TRAJECTORY_KEYS, "rollout_log_probs", "policy_version")}
    batch["sample_id"] = ids
    meta = {"sde_type": sde_type, "noise_level": noise_level, "global_step": step}
    out = DataProto.from_dict(tensors=batch, non_tensors=dict(nt), meta_info=meta)
    img = DataProto.from_dict(
        tensors={"responses": images, "sample_id": ids.clone()},
        non_tensors={k: nt[k] for k in ("raw_prompt", "data_source", "uid", *EXTRA_COLUMNS) if k in nt},
        meta_info={"global_step": step})
    return out, img
