"""Entry point: `python -m digenrl_verl.main <overrides>` or `digenrl-train <overrides>`.

The config ships in the package (`digenrl_verl/config/digenrl_trainer.yaml`, found through Hydra's
`pkg://` search path, so it works outside a checkout). Keys follow verl-omni's where they overlap; the
plugin's own knobs sit under `trainer.digenrl.*`. Everything is validated before any worker starts;
`trainer.digenrl.dry_run=true` stops right after, printing the resolved plan and pools.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import sys
from pathlib import Path
from typing import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from ray.exceptions import RayError

from digenrl_verl.config.runtime import RESUME_MODES
from digenrl_verl.schedule.types import ScheduleError
from digenrl_verl.trainer.checkpoint import is_host_checkpoint, latest_checkpoint, read_meta
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.ray_runtime import connect_ray
from digenrl_verl.trainer.runner import DigenRLTrainer, NonFiniteError
from digenrl_verl.workers.specs import HostConfig

CONFIG_MODULE = "digenrl_verl.config"
CONFIG_NAME = "digenrl_trainer"
#: the CPU demo's preset (config/preset/tiny_cpu.yaml): its tiny values passed explicitly (the defaults: verl-omni's)
TINY_CPU = "+preset=tiny_cpu"

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2  # interrupted: 128 + signal number (130 SIGINT, 143 SIGTERM)


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The composed config for `overrides` (Hydra syntax: key=value, +new_key=value)."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))


def resume_point(cfg: DictConfig):
    """(checkpoint directory, step) to resume from per `trainer.resume_mode`, or (None, 0)."""
    mode = cfg.trainer.resume_mode
    if mode == "disable":
        return None, 0
    if mode == "auto":
        path = latest_checkpoint(cfg.trainer.default_local_dir)
    elif mode == "resume_path":
        path = cfg.trainer.resume_from_path
        if not path or not ((Path(path) / "meta.json").is_file() or is_host_checkpoint(path)):
            raise ValueError(f"trainer.resume_from_path={path!r} is not a checkpoint directory (no meta.json, no "
                             "verl-omni actor/); point it at a global_step_<k> directory")
        path = Path(path)
    else:
        raise ValueError(f"unknown trainer.resume_mode={mode!r}; valid choices: {list(RESUME_MODES)}")
    if path is None:
        return None, 0
    return path, int(read_meta(path)["global_step"])


def check_resumable(path, spec) -> None:
    """The checkpoint must match the run's batch shape (the data cursor and groups depend on it)."""
    meta = read_meta(path)
    if meta.get("host_checkpoint"):  # verl-omni's: its actor worker must load it; it records no batch shape
        if spec.train.engine != "verl_omni":
            raise ValueError(f"checkpoint {path} is verl-omni's (actor/ only): resume it with verl-omni's actor "
                             "worker (trainer.digenrl.trainer_engine=verl_omni, from verl-omni's entry point), or "
                             "trainer.resume_mode=disable")
        return
    for key, name in (("prompts_per_step", "data.train_batch_size"), ("n", "actor_rollout_ref.rollout.n")):
        if meta.get(key) != getattr(spec, key):
            raise ValueError(f"checkpoint {path} was written with {name}={meta.get(key)}, this run sets "
                             f"{getattr(spec, key)}; use the same value, or trainer.resume_mode=disable")


class _Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: list[int] = []


def _raise_interrupt(signum, _frame):
    if _received:  # already shutting down (checkpoint, flush): a second Ctrl-C must not break that
        return
    _received.append(signum)  # Ray may re-raise our exception as a plain KeyboardInterrupt: remember the signal
    raise _Interrupted(signum)


def keep_drawn_seeds(cfg: DictConfig, path) -> None:
    """A resumed run whose seeds are null (drawn at start, as verl-omni leaves them unseeded) takes the seeds the
    checkpoint's run drew, so the prompt order and the noise go on as they would have."""
    for key, value in read_meta(path).get("seeds", {}).items():
        if OmegaConf.select(cfg, key, default=0) is None:
            OmegaConf.update(cfg, key, value, merge=False)


def run(cfg: DictConfig, host: HostConfig | None = None) -> int:
    """Validate, plan, and train `cfg` (0: done or dry run, 2: a bad config, 1: the run failed). `host`: what
    verl-omni composed (`workers.specs.HostConfig`) when the run comes from verl-omni's entry point (`build_run`)."""
    try:
        ckpt, start = resume_point(cfg)
        if ckpt is not None:
            keep_drawn_seeds(cfg, ckpt)
        spec = build_run(cfg, start_step=start, host=host)
        if ckpt is not None:
            check_resumable(ckpt, spec)
    except ValueError as e:
        print(f"digenrl: invalid config: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(spec.describe())
    print(f"plan: {spec.write_plan()}")
    if ckpt is not None:
        print(f"resuming from {ckpt} (step {start})")
    if spec.digenrl.dry_run:
        print("dry run: config valid, no worker started")
        return EXIT_OK
    address = os.environ.get("RAY_ADDRESS")
    if address:  # an existing cluster (`ray start` on each node); without it the trainer starts a local one
        print(f"connecting to the Ray cluster at RAY_ADDRESS={address}")
        connect_ray(address, torch_threads=spec.digenrl.torch_threads)
    trainer = DigenRLTrainer(spec)
    _received.clear()
    in_main_thread = threading.current_thread() is threading.main_thread()  # not so in a Ray task runner's call
    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGINT)} if in_main_thread \
        else {}
    try:
        trainer.fit(resume_from=ckpt)
        return EXIT_OK
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", _received[0] if _received else signal.SIGINT)
        where = f"; checkpoint: {trainer.last_checkpoint}" if trainer.last_checkpoint else ""
        print(f"digenrl: interrupted by {signal.Signals(signum).name}: trace and metrics flushed to "
              f"{spec.output_dir}{where}; rerun the same command to resume", file=sys.stderr)
        return 128 + int(signum)
    except ScheduleError as e:
        where = (f"the last checkpoint is {trainer.last_checkpoint}" if trainer.last_checkpoint
                 else "no checkpoint was written yet (set trainer.save_freq)")
        print(f"digenrl: the run failed: {e}\n{where}; rerun the same command to resume "
              "(trainer.resume_mode=auto)", file=sys.stderr)
        return EXIT_FAILED
    except NonFiniteError as e:
        print(f"digenrl: stopped: {e}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as e:  # e.g. a pool the Ray cluster cannot place, found when the pools are built
        if isinstance(e, RayError):  # a worker's ValueError (Ray's error subclasses the worker's): the run failed
            print(f"digenrl: the run failed in a worker: {e}", file=sys.stderr)
            return EXIT_FAILED
        print(f"digenrl: invalid config: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        trainer.shutdown()


def explain_compose_error(error: Exception) -> str:
    """Hydra's composition error as a message that names the key and the fix (never Hydra's `+key` advice, which
    would add a key that nothing reads)."""
    text = str(error)
    unknown = re.search(r"Could not override '([^']+)'", text)
    merging = re.search(r"Error merging override ([^=\s]+)=", text)
    key = (unknown or merging).group(1) if (unknown or merging) else None
    if key is None:
        return text.splitlines()[0]
    parent, _, leaf = key.lstrip("+").rpartition(".")
    valid = _valid_keys(parent)
    if unknown:
        return f"unknown key {key}; valid keys under {parent or 'the root'}: {valid}"
    cause = str(error.__cause__ or "").splitlines()[0] if error.__cause__ else ""
    section = _valid_keys(key.lstrip("+"))
    if section:
        return f"{key} is a section, not a value: set one of its keys ({', '.join(f'{key}.{k}' for k in section)})"
    return f"bad value for {key}: {cause or text.splitlines()[0]}"


def _valid_keys(dotted: str) -> list[str]:
    node = OmegaConf.select(compose(), dotted, default=None) if dotted else compose()
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose(args)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"digenrl: invalid config: {explain_compose_error(e)}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
