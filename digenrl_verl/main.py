"""Entry point: `python -m digenrl_verl.main <overrides>` or `digenrl-train <overrides>`.

The config ships in the package (`digenrl_verl/config/digenrl_trainer.yaml`, found through Hydra's
`pkg://` search path, so it works outside a checkout). Keys follow verl-omni's where they overlap; the
plugin's own knobs sit under `trainer.digenrl.*`. Everything is validated before any worker starts;
`trainer.digenrl.dry_run=true` stops right after, printing the resolved plan and pools.
"""

from __future__ import annotations

import sys
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

CONFIG_MODULE = "digenrl_verl.config"
CONFIG_NAME = "digenrl_trainer"

EXIT_OK, EXIT_BAD_CONFIG, EXIT_INTERRUPTED = 0, 2, 130


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The composed config for `overrides` (Hydra syntax: key=value, +new_key=value)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))


def run(cfg: DictConfig) -> int:
    from digenrl_verl.trainer.config import build_run
    from digenrl_verl.trainer.runner import DigenRLTrainer

    try:
        spec = build_run(cfg)
    except ValueError as e:
        print(f"digenrl: invalid config: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(spec.describe())
    if spec.digenrl.dry_run:
        print("dry run: config valid, no worker started")
        return EXIT_OK
    trainer = DigenRLTrainer(spec)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose(args)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"digenrl: cannot compose the config from {args}: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
