"""DigenRL inside verl-omni: an external trainer for its entry points, and the v1 trainer mode `digenrl`.

Written against verl-project/verl-omni at commit **a1139baf** (a1139bafffb5b9711f0a6b6edff8ecaa60bfff30,
2026-08-22, 0.2.0rc1), installed with the verl it pins (8a69493) in `.venv-verl-omni` (scripts/verl_omni_venv.sh).
Two ways in:

* **verl-omni's own entry points**, with the upstream series `patches/verl-omni-a1139baf/` applied (a generic
  external-trainer hook: `trainer.trainer_class`, entry-point group `verl_omni.trainers`). This package's entry
  point `digenrl` (ENTRY_POINT) names `DigenRLDiffusionTrainer`; its `config_section()` is `trainer.digenrl`
  (the same typed section as on our entry point, so `trainer.digenrl.*` composes without Hydra's `+`). Then
  `python -m verl_omni.trainer.main_diffusion` (v0) or `main_diffusion_v1` with `trainer.trainer_class=digenrl`
  hands the run over before Ray starts: the command-line overrides the user gave go, unchanged but for the
  handover keys (`handover_overrides`), to `digenrl_verl.main`, exactly as on our entry point (validation,
  the printed plan and its decisions, pools from verl-omni's `trainer.nnodes` x `trainer.n_gpus_per_node` unless
  `trainer.digenrl.pools.*` is given, `trainer.digenrl.dry_run`, messages naming a key, exit status 2 on a bad
  config). Tested in tests/verl_omni/ (CPU).
* **An unpatched verl-omni's v1 task runner**: `register()` puts `DigenRLDiffusionTrainer` in its
  `DIFFUSION_TRAINER_REGISTRY` as `trainer.v1.trainer_mode=digenrl`; `python -m digenrl_verl.integrations.verl_omni
  <overrides>` composes verl-omni's config, registers and runs it. That path translates the composed config key by
  key (`translate_config`) and sets `rollout.agent.agent_loop_manager_class` to a no-op manager (DigenRL's
  generator pool generates; verl-omni's agent loop and vLLM-Omni replicas are not started). The class lifecycle
  (init / fit on a translated config) is tested on CPU; `register()` / `main()` against a real verl-omni are not.

Not reused from verl-omni: its model adapters (`DiffusionModelBase` registry), its checkpoint engine and its
agent loop; generation uses our adapters (diffusers, or our vLLM-Omni pipeline with
`actor_rollout_ref.rollout.name=vllm_omni`), weights sync through our trainer -> generator process group.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from typing import Any, Mapping, Sequence

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from digenrl_verl import main as entry
from digenrl_verl.config.digenrl import SECTION, schema_node
from digenrl_verl.config.verl_omni import NOT_VERL_OMNI_DEFAULTS
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.runner import DigenRLTrainer

VERL_OMNI_REPO = "https://github.com/verl-project/verl-omni"
VERL_OMNI_COMMIT = "a1139bafffb5b9711f0a6b6edff8ecaa60bfff30"  # 2026-08-22, version 0.2.0rc1
VERL_OMNI_VERSION = "0.2.0rc1"
TRAINER_MODE = "digenrl"
INSTALL_HINT = (f"verl-omni is not on PyPI: pip install 'verl-omni @ git+{VERL_OMNI_REPO}@{VERL_OMNI_COMMIT}' "
                "(on a CUDA machine, with the verl and vLLM-Omni versions that commit pins; this integration was "
                f"written against that commit). Without verl-omni, run the same overrides through "
                "`python -m digenrl_verl.main <overrides> trainer.digenrl.mode=disaggregated`.")
KEY_MODE = "trainer.v1.trainer_mode"
#: trainer.v1.trainer_mode → our trainer.digenrl.mode
MODES = {TRAINER_MODE: "disaggregated", "sync": "colocated"}

# ---- the external-trainer hook of patched verl-omni (patches/verl-omni-a1139baf/)
#: the hook's entry-point group, the name this package registers there, and the key that selects it
ENTRY_POINT_GROUP = "verl_omni.trainers"
ENTRY_POINT_NAME = TRAINER_MODE
KEY_TRAINER_CLASS = "trainer.trainer_class"
#: the `entry_points` argument of setup.py (the lead applies it; tests write it as entry_points.txt)
ENTRY_POINTS = {ENTRY_POINT_GROUP: [f"{ENTRY_POINT_NAME} = {__name__}:DigenRLDiffusionTrainer"]}
#: the mode of `trainer.digenrl` when verl-omni's entry point selects DigenRL (choosing it means disaggregated;
#: `trainer.digenrl.mode=colocated` gives verl-omni's layout on our machinery)
HANDOVER_MODE = "disaggregated"
#: overrides that select the trainer in verl-omni and mean nothing past the handover (dropped, each said)
_HANDOVER_KEYS = {
    KEY_TRAINER_CLASS: "selected DigenRL",
    "trainer.use_v1": "chooses between verl-omni's own v0 and v1 trainers; trainer.trainer_class replaces both",
}

# verl-omni defaults that we do not follow (our YAML holds the value that applies here): a translated config
# carries these keys only when the user set them to something else, so that an explicit request still fails
# clearly (config/verl_omni.py UNSUPPORTED) while verl-omni's defaults do not.
_THEIR_DEFAULTS_NOT_OURS: dict[str, Any] = {
    **{key: theirs for key, (theirs, _why) in NOT_VERL_OMNI_DEFAULTS.items()},
    "trainer.use_v1": None,  # always ours (false): the mode is trainer.digenrl.mode after translation
    "trainer.digenrl": None,  # our section: carried whole when present (see translate_config)
    "reward.reward_functions": None,  # carried when set (translate_config); else the reward builder's default
}


class VerlOmniNotInstalled(ImportError):
    """verl-omni is needed for this call and cannot be imported."""


def verl_omni_available() -> bool:
    """True when `verl_omni` is importable (checked without importing it)."""
    return importlib.util.find_spec("verl_omni") is not None


def require_verl_omni() -> None:
    if not verl_omni_available():
        raise VerlOmniNotInstalled(f"verl_omni is not installed. {INSTALL_HINT}")


def entry_points_txt() -> str:
    """ENTRY_POINTS as a dist-info entry_points.txt (what `pip install` writes from setup.py's entry_points)."""
    return "".join(f"[{group}]\n" + "".join(f"{line}\n" for line in lines) + "\n"
                   for group, lines in ENTRY_POINTS.items())


# ------------------------------------------------------------------------------------------ config
def _dig(d: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return default
        cur = cur[part]
    return cur


def _override_key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def handover_overrides(config: Any, overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """Our entry point's overrides for a run that verl-omni's entry point hands over (`trainer.trainer_class`).

    `overrides` are the ones the user gave verl-omni (Hydra's `overrides.task`); they pass unchanged, except the
    keys that selected DigenRL in verl-omni (`_HANDOVER_KEYS`, dropped), so that the run is the one our entry point
    makes of them: the same validation, plan, pools (from verl-omni's `trainer.nnodes` x `trainer.n_gpus_per_node`
    unless `trainer.digenrl.pools.*` is given; `config.verl_omni.build_layout`) and dry run. `trainer.digenrl.mode`
    is `config`'s (HANDOVER_MODE unless the user set it). Returns (overrides, notes): a note for every dropped or
    added override, printed before the plan.
    """
    out, notes = [], []
    for o in overrides:
        key = _override_key(o)
        if key in _HANDOVER_KEYS:
            notes.append(f"{o}: {_HANDOVER_KEYS[key]} (not passed on)")
        else:
            out.append(o)
    if f"{SECTION}.mode" not in {_override_key(o) for o in out}:
        mode = OmegaConf.select(config, f"{SECTION}.mode", default=None) or HANDOVER_MODE
        out.append(f"{SECTION}.mode={mode}")
        notes.append(f"{SECTION}.mode={mode}: the mode when verl-omni's entry point selects DigenRL")
    return out, notes


def translate_config(source: Any, *, base_overrides: Sequence[str] = ()):
    """Our run config (a DictConfig of digenrl_verl.main) from a verl-omni config (the v1 trainer-mode path).

    Every key our config has is taken from `source` when `source` has it (verl-omni's value wins), except
    the verl-omni defaults listed in `_THEIR_DEFAULTS_NOT_OURS`. Then: `trainer.digenrl.mode` from
    `trainer.v1.trainer_mode` (digenrl → disaggregated, sync → colocated), `trainer.use_v1=false`, and
    `trainer.digenrl` merged from `source` when it has the section (else the pools derive from verl-omni's layout
    keys, copied like the others: `config.verl_omni.build_layout`). Without a
    reward function or a custom reward file the reward is verl-omni's default (jpeg compressibility).

    Raises ValueError naming the key for a trainer mode we cannot run.
    """
    src = OmegaConf.to_container(source, resolve=True, throw_on_missing=False) if isinstance(source, DictConfig) \
        else dict(source)
    their_mode = _dig(src, KEY_MODE, "sync") or "sync"
    if their_mode not in MODES:
        raise ValueError(f"{KEY_MODE}={their_mode!r} has no DigenRL equivalent; valid here: {sorted(MODES)} "
                         f"({TRAINER_MODE} = disaggregated, sync = colocated)")
    mode = MODES[their_mode]
    ours = entry.compose(list(base_overrides)
                         + [f"actor_rollout_ref.model.path={_dig(src, 'actor_rollout_ref.model.path')}"])
    with open_dict(ours):
        for key in _copy_shared(ours, src, prefix=""):
            warnings.warn(f"{key}={_dig(src, key)!r} has no effect: digenrl_verl has no such key (neither does "
                          "verl-omni's shipped config: added with '+'?), so it is not carried over; check its spelling",
                          UserWarning, stacklevel=2)
        ours.trainer.use_v1 = False
        mine = _dig(src, "trainer.digenrl")
        if isinstance(mine, Mapping):
            ours.trainer.digenrl = OmegaConf.merge(ours.trainer.digenrl, mine)
        ours.trainer.digenrl.mode = mode
        functions = _dig(src, "reward.reward_functions")
        if functions:  # verl-omni's {} stays our null: verl-omni's default reward unless a custom file is set
            ours.reward.reward_functions = dict(functions)
    return ours


def _copy_shared(ours: Any, src: Mapping[str, Any], prefix: str) -> list[str]:
    """Copy `src`'s values into `ours` for every key `ours` has (recursing into non-empty sections); returns the keys
    of `src` that `ours` lacks (not copied; verl-omni's own keys all exist in ours, so these were added with `+`)."""
    if not isinstance(src, Mapping):
        return []
    dropped = [f"{prefix}{key}" for key in src if key not in ours and key != "_target_"]
    for key in list(ours.keys()):
        dotted = f"{prefix}{key}"
        if not isinstance(src, Mapping) or key not in src:
            continue
        theirs = src[key]
        if dotted in _THEIR_DEFAULTS_NOT_OURS and (_THEIR_DEFAULTS_NOT_OURS[dotted] is None
                                                   or theirs == _THEIR_DEFAULTS_NOT_OURS[dotted]):
            continue
        node = ours._get_node(key)
        if isinstance(node, DictConfig) and len(node) and isinstance(theirs, Mapping):
            dropped += _copy_shared(node, theirs, prefix=f"{dotted}.")
        elif theirs != "???":
            OmegaConf.update(ours, str(key), theirs, merge=False)
    return dropped


# ------------------------------------------------------------------------------------------ trainer
class NoopAgentLoopManager:
    """Stands in for verl-omni's agent-loop manager: DigenRL's generator pool generates by itself."""

    @classmethod
    def create(cls, config: Any = None, llm_client: Any = None, reward_loop_worker_handles: Any = None,
               **_: Any) -> "NoopAgentLoopManager":
        return cls()


NOOP_AGENT_LOOP_MANAGER = f"{__name__}.NoopAgentLoopManager"


class DigenRLDiffusionTrainer:
    """DigenRL behind verl-omni's entry points: an external trainer (`trainer.trainer_class=digenrl`, patched
    verl-omni) or the v1 trainer mode `digenrl` (`register()`).

    Args:
        config: the verl-omni config its entry point or task runner passes (`trainer_cls(config=config)`).
        overrides: the command-line overrides the user gave verl-omni. None: Hydra's, when a Hydra app is running
            (verl-omni's entry point: the external-trainer path, `fit()` runs `digenrl_verl.main` on them);
            otherwise the config is translated key by key (`translate_config`, the v1 trainer-mode path).
        base_overrides: extra overrides of our config applied before the translation (tests of the v1 path).
    """

    def __init__(self, config: Any, overrides: Sequence[str] | None = None, base_overrides: Sequence[str] = ()) \
            -> None:
        self.config = config
        if overrides is None and HydraConfig.initialized():
            overrides = list(HydraConfig.get().overrides.task)
        self.overrides = None if overrides is None else list(overrides)
        self.run_config = None
        self.trainer = None
        if self.overrides is not None:
            return  # the external-trainer path: translated in fit()
        self.run_config = translate_config(config, base_overrides=base_overrides)
        if isinstance(config, DictConfig) and OmegaConf.select(config, "actor_rollout_ref.rollout") is not None:
            with open_dict(config):  # the task runner builds its agent-loop manager from this key after init()
                config.actor_rollout_ref.rollout.setdefault("agent", {})
                config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = NOOP_AGENT_LOOP_MANAGER

    @classmethod
    def config_section(cls) -> DictConfig:
        """`trainer.digenrl` for verl-omni's config (the external-trainer hook composes it under trainer.<name>):
        our typed section, mode HANDOVER_MODE."""
        node = schema_node()
        node.mode = HANDOVER_MODE
        return node

    def init(self) -> None:
        """Validate (build_run) and prepare the run; workers start in `fit` (the v1 trainer-mode path)."""
        if self.run_config is not None:
            self.trainer = DigenRLTrainer(build_run(self.run_config))

    def get_llm_client(self) -> None:
        return None  # no verl-omni rollout replicas: the generator pool serves generation

    def get_reward_handles(self) -> None:
        return None  # rewards are scored on the generator pool

    def fit(self, agent_loop_manager: Any = None) -> dict[str, Any] | None:
        """Run it. External-trainer path: `digenrl_verl.main` on the handed-over overrides; a status other than 0
        (a bad config: 2, a failed run: 1) leaves the process with that status, after our message."""
        if self.overrides is not None:
            overrides, notes = handover_overrides(self.config, self.overrides)
            for note in notes:
                print(f"digenrl (from verl-omni's entry point): {note}")
            status = entry.main(overrides)
            if status != entry.EXIT_OK:
                raise SystemExit(status)
            return None
        if self.trainer is None:
            self.init()
        try:
            return self.trainer.fit()
        finally:
            self.trainer.shutdown()


def register() -> type:
    """Register `DigenRLDiffusionTrainer` as verl-omni's v1 trainer mode `digenrl` (idempotent; an unpatched
    verl-omni). Raises VerlOmniNotInstalled with the install command."""
    require_verl_omni()
    from verl_omni.trainer.diffusion.v1 import DIFFUSION_TRAINER_REGISTRY, register_diffusion_trainer

    current = DIFFUSION_TRAINER_REGISTRY.get(TRAINER_MODE)
    if current is not None and current is not DigenRLDiffusionTrainer:
        raise ValueError(f"verl-omni trainer mode {TRAINER_MODE!r} is already registered by {current!r}")
    register_diffusion_trainer(TRAINER_MODE)(DigenRLDiffusionTrainer)
    return DigenRLDiffusionTrainer


def make_task_runner():
    """A Ray task runner that registers the mode in its own process, then runs it. Not run against verl-omni."""
    import ray

    @ray.remote(num_cpus=1)
    class DigenRLTaskRunner:
        def run(self, config: Any) -> dict[str, Any]:
            register()
            trainer = DigenRLDiffusionTrainer(config=config, overrides=None)
            trainer.init()
            return trainer.fit(NoopAgentLoopManager.create(config))

    return DigenRLTaskRunner


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m digenrl_verl.integrations.verl_omni <verl-omni overrides>` (an unpatched verl-omni's v1 mode)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not verl_omni_available():
        print(f"digenrl: verl_omni is not installed. {INSTALL_HINT}", file=sys.stderr)
        return 2
    import verl_omni
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl_omni.trainer.main_diffusion_v1 import run_diffusion_v1

    config_dir = os.path.join(os.path.dirname(verl_omni.__file__), "trainer", "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="diffusion_trainer", overrides=args)
    register()
    run_diffusion_v1(cfg, task_runner_class=make_task_runner())
    return 0


if __name__ == "__main__":
    sys.exit(main())
