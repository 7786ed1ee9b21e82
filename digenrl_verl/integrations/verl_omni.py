"""DigenRL as a verl-omni trainer mode (`trainer.use_v1=true trainer.v1.trainer_mode=digenrl`).

Written against verl-project/verl-omni at commit **a1139baf** (a1139bafffb5b9711f0a6b6edff8ecaa60bfff30,
2026-08-22, version 0.2.0rc1; its source was read, and its v1 task runner checked line by line), whose v1 entry
point (`verl_omni.trainer.main_diffusion_v1`) runs a Ray `DiffusionTaskRunnerV1` that does, in order:
`get_diffusion_trainer_cls(trainer.v1.trainer_mode)(config=config)`, `.init()`, builds an agent-loop manager
(`rollout.agent.agent_loop_manager_class`, an FQN, or its default) from `.get_llm_client()` and
`.get_reward_handles()`, then `.fit(agent_loop_manager)`.

Status, honestly: **verl-omni is not installable here** (not on PyPI; it pins a git verl and vLLM-Omni and
needs CUDA for its engines), so nothing in this module has run against verl-omni. What is tested on CPU
(tests/integrations): the config translation (`translate_config`, `pools_from_layout`), the trainer-mode class
(`DigenRLDiffusionTrainer`: constructed from a verl-omni-style config, `init()` and `fit()` run a real step
on a tiny model), the install message when verl-omni is missing, and that importing `digenrl_verl` never
imports `verl_omni`. What is not: `register()` and `main()` against a real verl-omni, in particular the
registration inside verl-omni's Ray task-runner process.

How DigenRL plugs in, and what it reuses of verl-omni (and what not):

* **Config**: verl-omni's keys are ours where they overlap (digenrl_verl/config/digenrl_trainer.yaml), so the
  verl-omni config is translated key by key; `trainer.v1.trainer_mode=digenrl` selects the disaggregated
  mode, and verl-omni's resource layout gives the pools (`pools_from_layout`).
* **Trainer mode**: `DigenRLDiffusionTrainer` has the v1 trainer lifecycle (init / get_llm_client /
  get_reward_handles / fit); `register()` puts it in verl-omni's `register_diffusion_trainer` registry. It
  runs DigenRL's own generator and trainer pools, so it points `rollout.agent.agent_loop_manager_class` at
  `NoopAgentLoopManager`: verl-omni's agent loop and vLLM-Omni replicas are not started.
* **Not reused (yet)**: verl-omni's model adapters (`DiffusionModelBase` registry) and its checkpoint
  engine. Generation uses our adapters (diffusers, or our vLLM-Omni pipeline with
  `actor_rollout_ref.rollout.name=vllm_omni`, see `integrations.vllm_omni`), weights sync through our
  trainer → generator process group. Reusing them is the next step once this can run next to verl-omni.

Launch (needs verl-omni installed): `python -m digenrl_verl.integrations.verl_omni <verl-omni overrides>`
composes verl-omni's own config, registers the mode in the task-runner process and runs it. Launching
through verl-omni's own entry point instead needs the mode resolvable inside its task runner: that is what
patches/verl-omni-a1139baf/ proposes upstream (external trainer modes resolved by name on first use).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Mapping, Sequence

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

# verl-omni defaults that we do not follow (our YAML holds the value that applies here): a translated config
# carries these keys only when the user set them to something else, so that an explicit request still fails
# clearly (trainer/config.py UNSUPPORTED) while verl-omni's defaults do not.
_THEIR_DEFAULTS_NOT_OURS: dict[str, Any] = {
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.pipeline.video_flow_shift": 12,
    "trainer.val_before_train": True,
    "trainer.use_v1": None,  # always ours (false): the mode is trainer.digenrl.mode after translation
    "trainer.digenrl": None,  # our section: carried whole when present (see translate_config)
    "reward.reward_functions": None,  # handled in translate_config (verl-omni's default reward)
}
VERL_OMNI_DEFAULT_REWARD = "jpeg_compressibility"  # verl-omni's default_compute_score_image


class VerlOmniNotInstalled(ImportError):
    """verl-omni is needed for this call and cannot be imported."""


def verl_omni_available() -> bool:
    """True when `verl_omni` is importable (checked without importing it)."""
    return importlib.util.find_spec("verl_omni") is not None


def require_verl_omni() -> None:
    if not verl_omni_available():
        raise VerlOmniNotInstalled(f"verl_omni is not installed. {INSTALL_HINT}")


# ------------------------------------------------------------------------------------------ config
def pools_from_layout(cfg: Any, mode: str) -> dict[str, dict[str, Any]]:
    """`trainer.digenrl.pools` from verl-omni's resource layout.

    verl-omni sizes the actor (trainer) GPUs with `trainer.nnodes × trainer.n_gpus_per_node` and standalone
    rollout GPUs with `actor_rollout_ref.rollout.nnodes × rollout.n_gpus_per_node` (0 nodes = colocated).
    Disaggregated: the generator pool is the standalone rollout GPUs when there are any, else half of the
    trainer GPUs (rounded down, at least 1) move to the generator pool. Colocated: one pool of every GPU.
    `use_gpu` follows `trainer.device` (anything but cpu).
    """
    from omegaconf import OmegaConf

    def sel(key: str, default: Any) -> Any:
        v = OmegaConf.select(cfg, key, default=default) if not isinstance(cfg, Mapping) else _dig(cfg, key, default)
        return default if v is None else v

    use_gpu = str(sel("trainer.device", "cuda")) != "cpu"
    t_nodes, t_per = int(sel("trainer.nnodes", 1)), int(sel("trainer.n_gpus_per_node", 8))
    r_nodes = int(sel("actor_rollout_ref.rollout.nnodes", 0))
    r_per = int(sel("actor_rollout_ref.rollout.n_gpus_per_node", t_per) or t_per)

    def pool(nodes: int, per: int) -> dict[str, Any]:
        return {"nnodes": nodes, "workers_per_node": per, "use_gpu": use_gpu, "accelerator_type": None,
                "custom_resource": None}

    if mode == "colocated":
        if r_nodes > 0 and r_per != t_per:
            raise ValueError(f"colocated: trainer.n_gpus_per_node={t_per} and actor_rollout_ref.rollout."
                             f"n_gpus_per_node={r_per} differ; one pool needs equal nodes")
        return {"colocated": pool(t_nodes + r_nodes, t_per)}
    if r_nodes > 0:
        return {"generator": pool(r_nodes, r_per), "trainer": pool(t_nodes, t_per)}
    total = t_nodes * t_per
    if total < 2:
        raise ValueError(f"{KEY_MODE}={TRAINER_MODE} needs at least 2 GPUs (trainer.nnodes × trainer.n_gpus_per_node"
                         f" = {total}) or standalone rollout GPUs (actor_rollout_ref.rollout.nnodes > 0)")
    if t_nodes > 1:  # whole nodes: half of them generate
        gen_nodes = t_nodes // 2
        return {"generator": pool(gen_nodes, t_per), "trainer": pool(t_nodes - gen_nodes, t_per)}
    gen = max(1, t_per // 2)
    return {"generator": pool(1, gen), "trainer": pool(1, t_per - gen)}


def _dig(d: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return default
        cur = cur[part]
    return cur


def translate_config(source: Any, *, base_overrides: Sequence[str] = ()):
    """Our run config (a DictConfig of digenrl_verl.main) from a verl-omni config.

    Every key our config has is taken from `source` when `source` has it (verl-omni's value wins), except
    the verl-omni defaults listed in `_THEIR_DEFAULTS_NOT_OURS`. Then: `trainer.digenrl.mode` from
    `trainer.v1.trainer_mode` (digenrl → disaggregated, sync → colocated), `trainer.use_v1=false`, and the
    pools from `trainer.digenrl.pools` when `source` has them, else from verl-omni's layout. Without a
    reward function or a custom reward file the reward is verl-omni's default (jpeg compressibility).

    Raises ValueError naming the key for a trainer mode we cannot run.
    """
    from omegaconf import DictConfig, OmegaConf, open_dict

    from digenrl_verl.main import compose

    src = OmegaConf.to_container(source, resolve=True, throw_on_missing=False) if isinstance(source, DictConfig) \
        else dict(source)
    their_mode = _dig(src, KEY_MODE, "sync") or "sync"
    if their_mode not in MODES:
        raise ValueError(f"{KEY_MODE}={their_mode!r} has no DigenRL equivalent; valid here: {sorted(MODES)} "
                         f"({TRAINER_MODE} = disaggregated, sync = colocated)")
    mode = MODES[their_mode]
    ours = compose(list(base_overrides) + [f"actor_rollout_ref.model.path={_dig(src, 'actor_rollout_ref.model.path')}"])
    with open_dict(ours):
        _copy_shared(ours, src, prefix="")
        ours.trainer.use_v1 = False
        mine = _dig(src, "trainer.digenrl")
        if isinstance(mine, Mapping):
            ours.trainer.digenrl = OmegaConf.merge(ours.trainer.digenrl, mine)
        else:
            ours.trainer.digenrl.pools = OmegaConf.merge(ours.trainer.digenrl.pools, pools_from_layout(src, mode))
        ours.trainer.digenrl.mode = mode
        functions = _dig(src, "reward.reward_functions")
        custom = _dig(src, "reward.custom_reward_function.path")
        if functions:
            ours.reward.reward_functions = dict(functions)
        elif custom:
            ours.reward.reward_functions = {}
        else:
            ours.reward.reward_functions = {VERL_OMNI_DEFAULT_REWARD: 1.0}
    return ours


def _copy_shared(ours: Any, src: Mapping[str, Any], prefix: str) -> None:
    """Copy `src`'s values into `ours` for every key `ours` has (recursing into non-empty sections)."""
    from omegaconf import DictConfig, OmegaConf

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
            _copy_shared(node, theirs, prefix=f"{dotted}.")
        elif theirs != "???":
            OmegaConf.update(ours, str(key), theirs, merge=False)


# ------------------------------------------------------------------------------------------ trainer mode
class NoopAgentLoopManager:
    """Stands in for verl-omni's agent-loop manager: DigenRL's generator pool generates by itself."""

    @classmethod
    def create(cls, config: Any = None, llm_client: Any = None, reward_loop_worker_handles: Any = None,
               **_: Any) -> "NoopAgentLoopManager":
        return cls()


NOOP_AGENT_LOOP_MANAGER = f"{__name__}.NoopAgentLoopManager"


class DigenRLDiffusionTrainer:
    """The `digenrl` v1 trainer mode: verl-omni's trainer lifecycle around `DigenRLTrainer`.

    Args:
        config: the verl-omni config the task runner passes (`trainer_cls(config=config)`).
        base_overrides: extra overrides of our config applied before the translation (tests).
    """

    def __init__(self, config: Any, base_overrides: Sequence[str] = ()) -> None:
        from omegaconf import DictConfig, OmegaConf, open_dict

        self.config = config
        self.run_config = translate_config(config, base_overrides=base_overrides)
        self.trainer = None
        if isinstance(config, DictConfig) and OmegaConf.select(config, "actor_rollout_ref.rollout") is not None:
            with open_dict(config):  # the task runner builds its agent-loop manager from this key after init()
                config.actor_rollout_ref.rollout.setdefault("agent", {})
                config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = NOOP_AGENT_LOOP_MANAGER

    def init(self) -> None:
        """Validate (build_run) and prepare the run; workers start in `fit`."""
        from digenrl_verl.trainer.config import build_run
        from digenrl_verl.trainer.runner import DigenRLTrainer

        self.trainer = DigenRLTrainer(build_run(self.run_config))

    def get_llm_client(self) -> None:
        return None  # no verl-omni rollout replicas: the generator pool serves generation

    def get_reward_handles(self) -> None:
        return None  # rewards are scored on the generator pool

    def fit(self, agent_loop_manager: Any = None) -> dict[str, Any]:
        if self.trainer is None:
            self.init()
        try:
            return self.trainer.fit()
        finally:
            self.trainer.shutdown()


def register() -> type:
    """Register `DigenRLDiffusionTrainer` as verl-omni's v1 trainer mode `digenrl` (idempotent). UNTESTED
    against verl-omni (see the module docstring). Raises VerlOmniNotInstalled with the install command."""
    require_verl_omni()
    from verl_omni.trainer.diffusion.v1 import DIFFUSION_TRAINER_REGISTRY, register_diffusion_trainer

    current = DIFFUSION_TRAINER_REGISTRY.get(TRAINER_MODE)
    if current is not None and current is not DigenRLDiffusionTrainer:
        raise ValueError(f"verl-omni trainer mode {TRAINER_MODE!r} is already registered by {current!r}")
    register_diffusion_trainer(TRAINER_MODE)(DigenRLDiffusionTrainer)
    return DigenRLDiffusionTrainer


def make_task_runner():
    """A Ray task runner that registers the mode in its own process, then runs it. UNTESTED."""
    import ray

    @ray.remote(num_cpus=1)
    class DigenRLTaskRunner:
        def run(self, config: Any) -> dict[str, Any]:
            register()
            trainer = DigenRLDiffusionTrainer(config=config)
            trainer.init()
            return trainer.fit(NoopAgentLoopManager.create(config))

    return DigenRLTaskRunner


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m digenrl_verl.integrations.verl_omni <verl-omni overrides>` (needs verl-omni)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not verl_omni_available():
        print(f"digenrl: verl_omni is not installed. {INSTALL_HINT}", file=sys.stderr)
        return 2
    import os

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
