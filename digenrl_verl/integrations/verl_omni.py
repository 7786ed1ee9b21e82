"""DigenRL inside verl-omni: its v1 trainer mode `digenrl`, and an external trainer for its v0 entry point.

Written against verl-project/verl-omni at commit **a1139baf** (a1139bafffb5b9711f0a6b6edff8ecaa60bfff30,
2026-08-22, 0.2.0rc1), installed with the verl it pins (8a69493) in `.venv-verl-omni` (scripts/verl_omni_venv.sh).
Every way in hands `DigenRLDiffusionTrainer` the config **verl-omni composed** (its Hydra config, a
`--config-name`, its `auto_set_device`, every default), translated key by key (`translate_config`) and run as our
entry point runs a config (`digenrl_verl.main.run`: validation, the plan and plan.json, dry run, resume):

* **v1, no verl-omni file patched**: `python -m verl_omni.trainer.main_diffusion_v1 <overrides> trainer.use_v1=true
  trainer.v1.trainer_mode=digenrl` (our section's keys with Hydra's `+`: `+trainer.digenrl.dry_run=true`). verl
  loads this package's `verl.plugins` entry point in every process (`verl_plugin`), which registers the trainer
  in verl-omni's registry (`register_diffusion_trainer`) when verl-omni's task runner imports it. A config we
  cannot run is reported from inside that task runner (our message, then Ray's error).
  `python -m digenrl_verl.integrations.verl_omni <the same overrides>` runs the same composition through verl-omni's
  `run_diffusion_v1(config, task_runner_class=...)` with our task runner, and checks the config before Ray starts
  (exit status 2 and the key named; a dry run starts no Ray).
* **v0 `main_diffusion`**, which has no hook for another trainer: the upstream series `patches/verl-omni-a1139baf/`
  adds one (`trainer.trainer_class`, entry-point group `verl_omni.trainers`; our section `trainer.digenrl`
  composes without `+`), called with the composed config before Ray starts.

DigenRL's pools generate: `actor_rollout_ref.rollout.agent.agent_loop_manager_class` is set to a no-op manager,
so verl-omni's agent loop and vLLM-Omni replicas are not started. Not reused from verl-omni yet: its model
adapters, its checkpoint engine and its rollout (issues 22 and 23).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from typing import Any, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from digenrl_verl import main as entry
from digenrl_verl.config.digenrl import SECTION, schema_node
from digenrl_verl.config.verl_omni import NOT_VERL_OMNI_DEFAULTS
from digenrl_verl.trainer.config import build_run
from digenrl_verl.workers.specs import HostConfig

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
#: and verl's plugin group, loaded by `import verl` in every process: registers the v1 trainer mode (verl_plugin)
VERL_PLUGIN_GROUP = "verl.plugins"
ENTRY_POINTS = {ENTRY_POINT_GROUP: [f"{ENTRY_POINT_NAME} = {__name__}:DigenRLDiffusionTrainer"],
                VERL_PLUGIN_GROUP: [f"{TRAINER_MODE} = digenrl_verl.integrations.verl_plugin"]}
#: the mode of `trainer.digenrl` when verl-omni's entry point selects DigenRL (choosing it means disaggregated;
#: `trainer.digenrl.mode=colocated` gives verl-omni's layout on our machinery)
HANDOVER_MODE = "disaggregated"
#: printed when a config from verl-omni's entry point reaches DigenRL
HANDED = "digenrl_verl runs the config verl-omni composed"
#: overrides that select the trainer in verl-omni and mean nothing past the handover (dropped, each said)
_HANDOVER_KEYS = {
    KEY_TRAINER_CLASS: "selected DigenRL",
    "trainer.use_v1": "verl-omni's switch between its v0 and v1 task runners; DigenRL's trainer runs either way",
}

# verl-omni defaults that we do not follow (our YAML holds the value that applies here): a translated config
# carries these keys only when the user set them to something else, so that an explicit request still fails
# clearly (config/verl_omni.py UNSUPPORTED) while verl-omni's defaults do not.
_THEIR_DEFAULTS_NOT_OURS: dict[str, Any] = {
    **{key: theirs for key, (theirs, _why) in NOT_VERL_OMNI_DEFAULTS.items()},
    "trainer.use_v1": None,  # always ours (false): the mode is trainer.digenrl.mode after translation
    KEY_TRAINER_CLASS: None,  # selected DigenRL (handover_notes)
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


def handover_notes(source: Any) -> list[str]:
    """What the handover does with the keys that selected DigenRL in verl-omni (printed before the plan)."""
    notes = []
    for key, why in _HANDOVER_KEYS.items():
        value = _dig(source, key)
        if value not in (None, False):
            notes.append(f"{key}={_show(value)}: {why} (not passed on)")
    mode = _dig(source, KEY_MODE)
    if mode in MODES and _dig(source, KEY_TRAINER_CLASS) is None and _dig(source, f"{SECTION}.mode") is None:
        notes.append(f"{KEY_MODE}={mode}: {SECTION}.mode={MODES[mode]}")
    return notes


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _their_mode(src: Mapping[str, Any]) -> str:
    """Our `trainer.digenrl.mode` for verl-omni's config `src`: the section's own `mode` when it has one (the
    external-trainer hook composes it, HANDOVER_MODE unless the user set it), else from `trainer.v1.trainer_mode`
    (MODES). Raises ValueError naming the key for a trainer mode we cannot run."""
    section = _dig(src, SECTION)
    if isinstance(section, Mapping) and section.get("mode") is not None:
        return section["mode"]
    if _dig(src, KEY_TRAINER_CLASS) is not None:
        return HANDOVER_MODE
    their_mode = _dig(src, KEY_MODE, "sync") or "sync"
    if their_mode not in MODES:
        raise ValueError(f"{KEY_MODE}={their_mode!r} has no DigenRL equivalent; valid here: {sorted(MODES)} "
                         f"({TRAINER_MODE} = disaggregated, sync = colocated)")
    return MODES[their_mode]


def translate_config(source: Any, *, base_overrides: Sequence[str] = ()):
    """Our run config (a DictConfig of digenrl_verl.main) from the config verl-omni composed (both ways in: the
    external-trainer hook and the v1 trainer mode), so a `--config-name`, verl-omni's `auto_set_device` and every
    verl-omni default reach the run as verl-omni resolved them.

    Every key our config has is taken from `source` when `source` has it (verl-omni's value wins), except
    the verl-omni defaults listed in `_THEIR_DEFAULTS_NOT_OURS`. Then: `trainer.digenrl.mode` (`_their_mode`: the
    section's, else from `trainer.v1.trainer_mode`: digenrl → disaggregated, sync → colocated), `trainer.use_v1=false`,
    and
    `trainer.digenrl` merged from `source` when it has the section (else the pools derive from verl-omni's layout
    keys, copied like the others: `config.verl_omni.build_layout`). Without a
    reward function or a custom reward file the reward is verl-omni's default (jpeg compressibility).

    Raises ValueError naming the key for a trainer mode we cannot run.
    """
    src = OmegaConf.to_container(source, resolve=True, throw_on_missing=False) if isinstance(source, DictConfig) \
        else dict(source)
    mode = _their_mode(src)
    ours = entry.compose(list(base_overrides)
                         + [f"actor_rollout_ref.model.path={_dig(src, 'actor_rollout_ref.model.path')}"])
    with open_dict(ours):
        for key in _copy_shared(ours, src, prefix=""):
            warnings.warn(f"{key}={_dig(src, key)!r} has no effect: digenrl_verl has no such key (neither does "
                          "verl-omni's shipped config: added with '+'?), so it is not carried over; check its spelling",
                          UserWarning, stacklevel=2)
        ours.trainer.use_v1 = False
        mine = _dig(src, SECTION)
        if isinstance(mine, Mapping):
            ours.trainer.digenrl = _merge_section(ours.trainer.digenrl, mine)
        ours.trainer.digenrl.mode = mode
        functions = _dig(src, "reward.reward_functions")
        if functions:  # verl-omni's {} stays our null: verl-omni's default reward unless a custom file is set
            ours.reward.reward_functions = dict(functions)
    return ours


def host_config(source: Any) -> HostConfig | None:
    """What the run takes from verl-omni's composed config besides the translation (`workers.specs.HostConfig`):
    its ``actor_rollout_ref`` resolved (its actor worker is built from it) and the σ schedules of its training
    adapter for the rollout's and validation's step counts (`host_sigma_schedules`); None without the section."""
    node = OmegaConf.select(source, "actor_rollout_ref") if isinstance(source, DictConfig) else \
        _dig(dict(source), "actor_rollout_ref")
    if node is None:
        return None
    section = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    return HostConfig(actor_rollout_ref=section, sigma_schedules=host_sigma_schedules(section))


def host_sigma_schedules(section: Mapping[str, Any]) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """(N, σ_0..σ_N) as verl-omni's training adapter builds its scheduler (`DiffusionModelBase.get_class(model_config)
    .build_scheduler`) for the rollout's and the validation's step counts: the generators then sample the schedule
    verl-omni's engine trains on (its Wan2.2 adapter shifts linspace(1, 0, N + 1) by `pipeline.shift`, not by the
    model's scheduler config). Empty when verl-omni cannot build it here (no verl-omni, a model it has no adapter
    for): the package's own schedule, which the trainer's σ check then holds to verl-omni's."""
    import copy

    try:
        from verl.utils.config import omega_conf_to_dataclass
        from verl_omni.pipelines.model_base import DiffusionModelBase
    except ImportError:
        return ()
    rollout = section.get("rollout", {})
    steps = {rollout.get("pipeline", {}).get("num_inference_steps"),
             (rollout.get("val_kwargs", {}).get("pipeline", {}) or {}).get("num_inference_steps")}
    out = []
    for n in sorted(s for s in steps if isinstance(s, int) and s > 0):
        model = copy.deepcopy(dict(section["model"]))
        model["pipeline"] = {**dict(model.get("pipeline", {})), "num_inference_steps": n}
        try:
            model_config = omega_conf_to_dataclass(OmegaConf.create(model))
            scheduler = DiffusionModelBase.get_class(model_config).build_scheduler(model_config)
        except Exception as e:  # noqa: BLE001  (verl-omni's config / adapter code: any failure means "no schedule")
            warnings.warn(f"verl-omni's training adapter builds no scheduler for this model here ({e!r}): the "
                          "generators sample the model's own schedule, which the trainer holds to verl-omni's "
                          "(actor_rollout_ref.model.pipeline named if they differ)", UserWarning, stacklevel=2)
            return ()
        out.append((n, tuple(float(x) for x in scheduler.sigmas)))
    return tuple(out)


def _merge_section(section: DictConfig, mine: Mapping[str, Any]) -> DictConfig:
    """Our typed section with the user's `trainer.digenrl` keys (a whole section from the hook, or the `+` keys of
    the v1 entry point); a key or value the section does not take is a ValueError naming it."""
    try:
        return OmegaConf.merge(section, mine)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        key = key if key.startswith(SECTION) else f"{SECTION}.{key}".rstrip(".")
        reason = str(e).splitlines()[0]
        raise ValueError(f"{key}: {reason}; valid keys under {SECTION}: {sorted(section.keys())}") from None


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
    """DigenRL behind verl-omni's entry points. Either way in, it receives the config verl-omni composed and runs it
    as our own entry point runs a config (`digenrl_verl.main.run`: validation, the plan and plan.json, dry run,
    resume), after `translate_config`:

    * the v1 trainer mode `digenrl` (no verl-omni file patched): `python -m verl_omni.trainer.main_diffusion_v1
      ... trainer.use_v1=true trainer.v1.trainer_mode=digenrl`, where verl-omni's task runner finds it in its
      registry (`verl_plugin`, loaded by verl's `verl.plugins` entry points), or `python -m
      digenrl_verl.integrations.verl_omni` (the same config, checked before Ray starts);
    * the external-trainer hook of v0 `main_diffusion` (`trainer.trainer_class=digenrl`,
      patches/verl-omni-a1139baf/), which calls `trainer_cls(config=config).fit()` before Ray starts.

    Args:
        config: verl-omni's composed config (after its `auto_set_device`), as its entry point or task runner
            passes it.
        base_overrides: overrides of our config applied before the translation (tests).
    """

    def __init__(self, config: Any, base_overrides: Sequence[str] = ()) -> None:
        self.config = config
        self.base_overrides = list(base_overrides)
        self.run_config = None
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
        """Translate verl-omni's config (workers start in `fit`). A config we cannot run: our message naming the
        key on stderr, then SystemExit(2) (digenrl_verl.main's status for a bad config)."""
        if self.run_config is not None:
            return
        print(f"{HANDED}: {type(self.config).__name__} from verl-omni's Hydra, translated key by key")
        for note in handover_notes(self.config):
            print(f"digenrl (from verl-omni): {note}")
        try:
            self.run_config = translate_config(self.config, base_overrides=self.base_overrides)
        except ValueError as e:
            print(f"digenrl: invalid config: {e}", file=sys.stderr)
            raise SystemExit(entry.EXIT_BAD_CONFIG) from None

    def get_llm_client(self) -> None:
        return None  # no verl-omni rollout replicas: the generator pool serves generation

    def get_reward_handles(self) -> None:
        return None  # rewards are scored on the generator pool

    def fit(self, agent_loop_manager: Any = None) -> None:
        """Run it through `digenrl_verl.main.run`; a status other than 0 (a bad config: 2, a failed run: 1) leaves
        with that status (SystemExit), after our message."""
        self.init()
        status = entry.run(self.run_config, host=host_config(self.config))
        if status != entry.EXIT_OK:
            raise SystemExit(status)


def register() -> type:
    """Register `DigenRLDiffusionTrainer` as verl-omni's v1 trainer mode `digenrl` (idempotent; an unpatched
    verl-omni). Raises VerlOmniNotInstalled with the install command."""
    require_verl_omni()
    from verl_omni.trainer.diffusion.v1 import trainer_base

    register_in(trainer_base)
    return DigenRLDiffusionTrainer


def register_in(trainer_base) -> None:
    """Register DigenRL's trainer in `trainer_base`'s registry (the module object, complete or just executed);
    idempotent. Another class under the name: ValueError naming it. The one v1 registration: `register` calls it,
    and so does the `verl.plugins` hook (`verl_plugin`) when a process imports verl-omni's trainer registry."""
    current = trainer_base.DIFFUSION_TRAINER_REGISTRY.get(TRAINER_MODE)
    if current is not None and current is not DigenRLDiffusionTrainer:
        raise ValueError(f"verl-omni trainer mode {TRAINER_MODE!r} is already registered by {current!r}")
    trainer_base.register_diffusion_trainer(TRAINER_MODE)(DigenRLDiffusionTrainer)


class RunFailed(RuntimeError):
    """Our trainer's exit status from inside a Ray task runner (our message is already printed)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"digenrl_verl exited with status {status}")
        self.status = status


def make_task_runner():
    """verl-omni's `run_diffusion_v1(config, task_runner_class=...)` takes this Ray task runner: it runs our trainer on
    the config verl-omni composed (no TransferQueue, no agent loop: DigenRL's pools generate); a status other than
    0 comes back as RunFailed."""
    import ray

    @ray.remote(num_cpus=1)
    class DigenRLTaskRunner:
        def run(self, config: Any) -> None:
            try:
                DigenRLDiffusionTrainer(config=config).fit()
            except SystemExit as e:
                if e.code:
                    raise RunFailed(int(e.code)) from None

    return DigenRLTaskRunner


def run_v1(config: DictConfig) -> int:
    """What verl-omni's `main_diffusion_v1.main` does with its composed config (`auto_set_device`, resolve; with
    `trainer.device=cpu`, verl's CPU platform selected first, as ``VERL_PLATFORM=cpu`` would), then ours: the
    translated config is checked here, before Ray starts (a bad one: exit status 2 and the key named); a dry run
    prints the plan in this process; a run goes through verl-omni's `run_diffusion_v1` with our task runner.
    Returns the exit status."""
    import ray
    from verl.utils.device import auto_set_device
    from verl_omni.trainer.main_diffusion_v1 import run_diffusion_v1

    from digenrl_verl.platform import select_cpu_platform

    if OmegaConf.select(config, "trainer.device") == "cpu":  # asked for: not verl's fallback to cuda on a CPU host
        select_cpu_platform()
    auto_set_device(config)
    OmegaConf.resolve(config)
    trainer = DigenRLDiffusionTrainer(config=config)
    host = host_config(config)  # as the task runner's fit() passes it: one script, one answer on either entry point
    try:
        trainer.init()
        dry_run = build_run(trainer.run_config, host=host).digenrl.dry_run
    except SystemExit as e:
        return int(e.code or 0)
    except ValueError as e:
        print(f"digenrl: invalid config: {e}", file=sys.stderr)
        return entry.EXIT_BAD_CONFIG
    if dry_run:
        return entry.run(trainer.run_config, host=host)
    register()  # the mode's name in this process too, for anything that looks it up
    try:
        run_diffusion_v1(config, task_runner_class=make_task_runner())
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, RunFailed):
            return e.cause.status
        raise
    return entry.EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m digenrl_verl.integrations.verl_omni <verl-omni overrides>`: verl-omni's v1 command line (its own
    Hydra config, `--config-name` included) run by DigenRL through `run_v1`."""
    if not verl_omni_available():
        print(f"digenrl: verl_omni is not installed. {INSTALL_HINT}", file=sys.stderr)
        return entry.EXIT_BAD_CONFIG
    import hydra
    import verl_omni

    config_dir = os.path.join(os.path.dirname(verl_omni.__file__), "trainer", "config")
    status: list[int] = []

    @hydra.main(config_path=config_dir, config_name="diffusion_trainer", version_base=None)
    def _main(config: DictConfig) -> None:
        status.append(run_v1(config))

    saved = sys.argv
    given = saved[1:] if argv is None else list(argv)
    # our section is not in verl-omni's v1 composition: its keys take Hydra's `+` (added here, as a user would)
    sys.argv = [saved[0], *(f"+{o}" if o.startswith(f"{SECTION}.") else o for o in given)]
    try:
        _main()
    finally:
        sys.argv = saved
    return status[0] if status else entry.EXIT_BAD_CONFIG


if __name__ == "__main__":
    sys.exit(main())
