"""Checkpoints: atomic directories of safetensors + JSON; never pickle.

A checkpoint of global step k (the state after k optimizer steps, policy version k) is a directory
`<root>/global_step_<k>/`:

| file | content |
|---|---|
| `model.safetensors` | the trainable weights (LoRA adapters, or the whole transformer) |
| `optimizer.safetensors` | AdamW moments per parameter (`<i>.exp_avg`, `<i>.exp_avg_sq`, `<i>.step`) |
| `optimizer.json` | param groups (lr, betas, ...) and parameter names in optimizer order |
| `rng.safetensors` | torch CPU RNG state of the trainer |
| `meta.json` | global step, policy version, data cursor, TCSS state, cost-profile snapshot, config |
| `actor/` | with `trainer.digenrl.trainer_engine=verl_omni`, in place of the optimizer and RNG files: verl-omni's own
  actor checkpoint, written by its engine's `save_checkpoint` (verl-omni's layout, `<root>/global_step_<k>/actor`) |

and `<root>/latest_checkpointed_iteration.txt` holds the newest step, as verl writes it. A checkpoint verl-omni's own
trainer wrote (`global_step_<k>/actor/` only) resumes a run whose trainer is verl-omni's actor worker: `read_meta`
gives its step, the trainers load `actor/`, and the generators get the weights from trainer rank 0 (the runner).

The first four are written and read by the workers (`weights.state.save_trainer_state` / `load_trainer_state`,
re-exported here); this module owns the directory, `meta.json` and the atomic commit.

Atomicity: everything is written into `global_step_<k>.tmp-<id>/` and renamed into place once complete
(rename is atomic on one file system), so a crash mid-write leaves only a `.tmp-` directory that
`latest_checkpoint` ignores. Keep-last-N removes older complete checkpoints after the new one is in place.

The runner checkpoints at a drained step boundary: the schedule issues a CHECKPOINT task at each checkpoint
step and starts nothing of the next step before it ends, so no micro-batch of step k+1 is in flight or queued
(the TCSS queue is empty) when step k is saved.
`meta.json` records that state explicitly (`tcss.queued_microbatches = []`); resuming rebuilds the
driver at step k with version k, which replays exactly what an uninterrupted run does after its own
checkpoint at step k.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

from digenrl_verl.weights.state import load_trainer_state, save_trainer_state

__all__ = ["CheckpointWriter", "checkpoint_dir", "is_host_checkpoint", "latest_checkpoint", "read_meta",
           "load_trainer_state", "save_trainer_state"]

STEP_DIR = re.compile(r"^global_step_(\d+)$")
LATEST_ITERATION_FILE = "latest_checkpointed_iteration.txt"  # verl's name
HOST_ACTOR_DIR = "actor"  # verl-omni's actor checkpoint inside global_step_<k>


def checkpoint_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def latest_checkpoint(root: str | Path | None) -> Path | None:
    """The complete checkpoint with the highest step under `root` (temporary directories are ignored): ours (its
    meta.json written last), or verl-omni's (`is_host_checkpoint`: its `actor/`, at most the step verl's
    `latest_checkpointed_iteration.txt` names, which verl-omni's trainer writes once the step is saved)."""
    if root is None or not Path(root).is_dir():
        return None
    pointer = Path(root) / LATEST_ITERATION_FILE
    newest = int(pointer.read_text().strip()) if pointer.is_file() else -1
    found = [(int(m.group(1)), p) for p in Path(root).iterdir() if (m := STEP_DIR.match(p.name))
             and ((p / "meta.json").is_file() or (is_host_checkpoint(p) and int(m.group(1)) <= newest))]
    return max(found)[1] if found else None


def is_host_checkpoint(path: str | Path) -> bool:
    """A checkpoint verl-omni's trainer wrote (`global_step_<k>/actor/`, no meta.json of ours)."""
    return (Path(path) / HOST_ACTOR_DIR).is_dir() and not (Path(path) / "meta.json").is_file()


def read_meta(path: str | Path) -> dict[str, Any]:
    """meta.json; for verl-omni's checkpoint (`is_host_checkpoint`) what its directory tells: the step (= the policy
    version) and ``host_checkpoint: true``."""
    path = Path(path)
    if is_host_checkpoint(path) and (m := STEP_DIR.match(path.name)):
        step = int(m.group(1))
        return {"global_step": step, "policy_version": step, "host_checkpoint": True}
    return json.loads((path / "meta.json").read_text())


class CheckpointWriter:
    """Writes checkpoints atomically under `root` and keeps the last `keep` of them."""

    def __init__(self, root: str | Path, keep: int | None = None) -> None:
        self.root = Path(root)
        self.keep = keep

    def begin(self, step: int) -> Path:
        """A fresh temporary directory to fill for `step`."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"global_step_{step}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def commit(self, tmp: Path, step: int, meta: Mapping[str, Any]) -> Path:
        """Write meta.json last, fsync, rename into place, prune old checkpoints."""
        meta_path = tmp / "meta.json"
        with open(meta_path, "w") as f:
            json.dump(dict(meta), f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):  # a host's checkpoint may be a folder (actor/)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        final = checkpoint_dir(self.root, step)
        old = None
        if final.exists():  # re-saving a step: move the old one aside first, so a complete one always exists
            old = final.with_name(f"{final.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._prune(keep_path=final)
        write_latest_iteration(self.root, step)
        return final

    def _prune(self, keep_path: Path) -> None:
        """Keep the last `keep` checkpoints by step (never the one just written); drop leftovers of failed saves."""
        for p in self.root.iterdir():
            if (".tmp-" in p.name or ".old-" in p.name) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        if not self.keep or self.keep < 1:
            return
        done = sorted((int(m.group(1)), p) for p in self.root.iterdir() if (m := STEP_DIR.match(p.name)))
        for _, p in done[: max(0, len(done) - self.keep)]:
            if p != keep_path:
                shutil.rmtree(p, ignore_errors=True)


def write_latest_iteration(root: Path, step: int) -> None:
    """verl's pointer to the newest checkpoint, `<root>/latest_checkpointed_iteration.txt` (the step, as verl and
    verl-omni's trainers write and read it), replaced atomically."""
    tmp = root / f"{LATEST_ITERATION_FILE}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text(str(int(step)))
    os.replace(tmp, root / LATEST_ITERATION_FILE)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
