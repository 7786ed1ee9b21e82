"""A trainer's state on disk: trainable weights, AdamW moments and RNG as safetensors + JSON (never pickle).

The files of one checkpoint directory (see `trainer.checkpoint` for the directory layout and atomicity):

| file | content |
|---|---|
| `model.safetensors` | the trainable weights (LoRA adapters, or the whole transformer), whole tensors |
| `optimizer.safetensors` | AdamW moments per parameter (`<i>.exp_avg`, `<i>.exp_avg_sq`, `<i>.step`) |
| `optimizer.json` | param groups (lr, betas, ...) and parameter names in optimizer order |
| `rng.safetensors` | torch CPU RNG state of the trainer |

Workers write and read these (trainers save and resume, generators and rollout engines load the weights on
resume); the runner-facing checkpoint API in `trainer.checkpoint` re-exports the two functions.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch
from safetensors.torch import load_file, save_file

WEIGHTS_FILE = "model.safetensors"


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _copy_to(like: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return value.to(device=like.device, dtype=like.dtype, copy=True)


def save_trainer_state(path: str | Path, named_params: Mapping[str, torch.nn.Parameter],
                       optimizer: torch.optim.Optimizer, *, full: Callable[[torch.Tensor], torch.Tensor] = _identity,
                       write: bool = True) -> None:
    """Weights, optimizer moments and RNG of a trainer into `path` (an existing directory).

    Args:
        full: the whole value of a parameter or moment (`GradientSync.full`: a collective under FSDP2, so every
            trainer rank calls this function; only the one with `write=True` writes). The files always hold
            whole tensors, whatever the strategy that wrote them.
        write: write the files (trainer rank 0) or only take part in the gathers.
    """
    path = Path(path)
    names = list(named_params)
    weights = {k: full(v.detach()).cpu().contiguous() for k, v in named_params.items()}
    index = {id(p): i for i, p in enumerate(named_params.values())}
    tensors: dict[str, torch.Tensor] = {}
    for p in named_params.values():  # parameter order: the same gathers on every rank
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            t = full(value) if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{index[id(p)]}.{key}"] = t.detach().cpu().contiguous()
    if not write:
        return
    save_file(weights, str(path / WEIGHTS_FILE))
    save_file(tensors, str(path / "optimizer.safetensors"))
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    (path / "optimizer.json").write_text(json.dumps({"param_names": names, "param_groups": groups}, default=list))
    save_file({"torch_cpu": torch.get_rng_state()}, str(path / "rng.safetensors"))


def load_trainer_state(path: str | Path, named_params: Mapping[str, torch.nn.Parameter],
                       optimizer: torch.optim.Optimizer | None, *,
                       place: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _copy_to) -> None:
    """Inverse of `save_trainer_state` (weights always; optimizer and RNG when an optimizer is given).

    `place(like, whole)` lays a whole tensor out like `like` (`GradientSync.place`: its shard under FSDP2)."""
    path = Path(path)
    weights = load_file(str(path / WEIGHTS_FILE))
    if set(weights) != set(named_params):
        missing, extra = sorted(set(named_params) - set(weights)), sorted(set(weights) - set(named_params))
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {extra[:5]} "
                         "(was it written for another model or LoRA config?)")
    with torch.no_grad():
        for k, p in named_params.items():
            p.copy_(place(p, weights[k]))
    if optimizer is None:
        return
    meta = json.loads((path / "optimizer.json").read_text())
    if meta["param_names"] != list(named_params):
        raise ValueError(f"checkpoint {path}: optimizer parameter order differs from the model's")
    moments = load_file(str(path / "optimizer.safetensors"))
    params = list(named_params.values())
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in moments.items():
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = t
    optimizer.state.clear()
    for i, s in state.items():
        p = params[i]  # moments live with their parameter (GPU, and sharded like it); AdamW keeps `step` on the CPU
        optimizer.state[p] = {k: v.clone() if k == "step" else place(p, v) for k, v in s.items()}
    for group, saved in zip(optimizer.param_groups, meta["param_groups"]):
        group.update({k: tuple(v) if k == "betas" else v for k, v in saved.items()})
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch_cpu"])


def load_weights_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The trainable weights of a checkpoint directory, whole tensors on the CPU."""
    return load_file(str(Path(path) / WEIGHTS_FILE))


@contextlib.contextmanager
def swapped_in(params: Mapping[str, torch.Tensor], values: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """`values` copied into `params` (same names, in place, no grad) for the block, the previous values back after;
    nothing when `values` is empty. A trainer's step-start weights for the old-log-prob recomputes of a global step's
    later mini-batches."""
    if not values:
        yield
        return
    with torch.no_grad():
        current = {name: p.detach().clone() for name, p in params.items()}
        for name, p in params.items():
            p.copy_(values[name])
    try:
        yield
    finally:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(current[name])
