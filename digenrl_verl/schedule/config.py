"""The scheduling settings, one definition each: `ScheduleSettings` (what a user sets, under `trainer.digenrl` in
the trainer's config and as flags of `digenrl-sim`) and `ScheduleConfig` (those settings plus the run's shape:
pools, steps, batch; what the `Driver` runs).

The settings form a small tree: `tag` (trainer-assisted generation, BTS), `tcss` (staleness), `tsp` (time-step
parallel updates). Every default lives here and nowhere else; every check sits next to its fields and raises a
`ConfigError` naming the field's path inside this tree (the config layer prefixes the user's key).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Optional

from digenrl_verl.errors import ConfigError
from digenrl_verl.schedule.types import worker_pool

MODES = ("colocated", "disaggregated")
TAG_MODES = ("off", "static", "bts")
TCSS_OBJECTIVES = ("decoupled", "clip")
#: `TcssConfig` fields that shape the trainer's loss of stale rows, not the schedule (the simulator ignores them)
TCSS_LOSS_FIELDS = ("objective", "is_cap")
POOL_NAMES = {"colocated": ("col",), "disaggregated": ("gen", "trn")}


def _int_at_least(path: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(path, value, f"use an integer >= {low}")


def minibatch_groups(prompts: int, minibatches: int, dp_ranks: int = 1) -> list[tuple[int, ...]]:
    """verl's mini-batches of one step's prompt groups (``ppo_epochs=1``, ``shuffle=false``), as prompt indices.

    verl splits the batch over its ``dp_ranks`` data-parallel ranks first (the dispatch's ``chunk``: contiguous,
    equal shares), then each rank cuts its share into ``minibatches`` contiguous blocks (``make_iterator`` /
    ``data.split``), one per optimizer step: mini-batch ``j`` is every rank's ``j``-th block. With one rank that is
    the ``j``-th contiguous block of the batch. Every block must hold whole prompt groups:
    ``prompts % (minibatches * dp_ranks) == 0``.

        >>> minibatch_groups(8, 2), minibatch_groups(8, 2, dp_ranks=2)
        ([(0, 1, 2, 3), (4, 5, 6, 7)], [(0, 1, 4, 5), (2, 3, 6, 7)])
    """
    if minibatches < 1 or dp_ranks < 1 or prompts % (minibatches * dp_ranks):
        raise ValueError(f"{minibatches} mini-batches over {dp_ranks} data-parallel rank(s) do not cut {prompts} "
                         "prompt groups into whole groups")
    share = prompts // dp_ranks
    block = share // minibatches
    return [tuple(r * share + j * block + i for r in range(dp_ranks) for i in range(block))
            for j in range(minibatches)]


def verl_cut_keeps_groups(prompts: int, minibatches: int, dp_ranks: int) -> bool:
    """Whether verl's cut of ``prompts`` prompt groups into ``minibatches`` mini-batches over ``dp_ranks``
    data-parallel ranks (`minibatch_groups`) keeps every group whole: one mini-batch (the whole batch), one rank, or
    ``prompts`` a multiple of ``minibatches * dp_ranks``. When it does not, the mini-batches are the contiguous blocks
    of whole groups (the cut with one rank: `ScheduleConfig.minibatch_dp_ranks`; the config layer warns).

        >>> verl_cut_keeps_groups(8, 2, 2), verl_cut_keeps_groups(6, 2, 2), verl_cut_keeps_groups(6, 1, 4)
        (True, False, True)
    """
    return minibatches == 1 or dp_ranks == 1 or prompts % (minibatches * dp_ranks) == 0


def _boolean(path: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(path, value, "use true or false")


@dataclass(frozen=True)
class TagConfig:
    """Trainer-assisted generation: idle trainer ranks generate a micro-batch when the policy says so.

    Args:
        policy: ``"off"``, ``"static"`` (``static_k`` TAG micro-batches per step, at the first bubbles) or
            ``"bts"`` (bubble-aware tree search at every trainer bubble).
        static_k: TAG micro-batches per step for ``policy="static"``.
        probe: with ``policy="bts"``, run one TAG micro-batch at the first bubble to measure the trainer-side
            generation cost (the paper's profiling run).
        bts_max_states: search budget per BTS solve (states expanded); when exceeded, BTS decides by a one-step
            lookahead over rollouts instead (the decision is marked ``budget_hit`` in the trace).
    """

    policy: str = "bts"
    static_k: int = 0
    probe: bool = True
    bts_max_states: int = 2_000

    def __post_init__(self) -> None:
        if self.policy not in TAG_MODES:
            raise ConfigError("tag.policy", self.policy, f"use one of {list(TAG_MODES)}")
        _int_at_least("tag.static_k", self.static_k, 0)
        _int_at_least("tag.bts_max_states", self.bts_max_states, 1)
        _boolean("tag.probe", self.probe)
        if self.policy == "static" and self.static_k == 0:
            raise ConfigError("tag.static_k", self.static_k, "tag.policy=static needs static_k >= 1 (or use off)")


@dataclass(frozen=True)
class TcssConfig:
    """Staleness-bounded generation across steps (TCSS).

    Args:
        staleness: the window W: 0 = synchronous (on-policy), 1 = generation of step s+1 may start with version s
            while step s is still updating.
        max_stale_fraction: at most this fraction of a step's samples may be generated stale (staleness=1 only).
        guard: start a stale GEN only when its estimated end is before the weight SYNC it runs ahead of would start,
            so TCSS never delays a SYNC (the schedule then depends on measured costs). False: start stale GENs
            whenever the limits allow (deterministic given the limits).
        max_gen_futures: at most this many GEN/TAG tasks in flight at once (None: no limit).
        guard_slack: with the guard, a stale GEN may still start when its estimated end is at most this fraction
            of its own estimated duration after the trainer's estimated end of the step: the SYNC then waits at
            most that long, and the generators do not idle through the step's drain for a near miss.
        objective: the loss of stale rows. ``"decoupled"`` (decoupled PPO, as AReaL): the trust region is taken
            around the trainer's current weights and the stale sample is reweighted by the detached importance
            weight w = π_current/π_behaviour, so a stale row adds w·A·∇log π whatever the clip ratio.
            ``"clip"``: the clipped ratio against the behaviour policy like an on-policy row; at the recipes' clip
            (1e-4) nearly every stale row is outside the clip and about half of them add no gradient.
        is_cap: with ``objective="decoupled"``, stale rows whose importance weight exceeds this cap (> 1) add no
            policy gradient (AReaL's ``behav_imp_weight_cap``; 5 as in its example configs).
    """

    staleness: int = 0
    max_stale_fraction: float = 0.5
    guard: bool = True
    max_gen_futures: Optional[int] = None
    guard_slack: float = 0.1
    objective: str = "decoupled"
    is_cap: float = 5.0

    def __post_init__(self) -> None:
        if self.staleness not in (0, 1) or isinstance(self.staleness, bool):
            raise ConfigError("tcss.staleness", self.staleness, "use 0 (synchronous) or 1 (one-step TCSS)")
        frac = self.max_stale_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 <= frac <= 1.0:
            raise ConfigError("tcss.max_stale_fraction", frac, "use a number in [0, 1]")
        _boolean("tcss.guard", self.guard)
        slack = self.guard_slack
        if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not 0.0 <= slack <= 1.0:
            raise ConfigError("tcss.guard_slack", slack, "use a fraction in [0, 1] of the stale GEN's duration")
        if self.max_gen_futures is not None:
            _int_at_least("tcss.max_gen_futures", self.max_gen_futures, 1)
        if self.objective not in TCSS_OBJECTIVES:
            raise ConfigError("tcss.objective", self.objective, f"use one of {list(TCSS_OBJECTIVES)}")
        cap = self.is_cap
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 1.0:
            raise ConfigError("tcss.is_cap", cap, "use a number > 1 (stale rows whose importance weight exceeds it "
                              "add no gradient)")
        if self.objective == "clip" and cap != TcssConfig.is_cap:
            warnings.warn(f"tcss.is_cap={cap} has no effect with tcss.objective=clip (the cap "
                          "applies to the decoupled objective only)", UserWarning, stacklevel=3)

    @property
    def stale_is_cap(self) -> Optional[float]:
        """The loss's cap for stale rows (`LossConfig.stale_is_cap`): `is_cap` with the decoupled objective, None
        (stale rows clipped like the others) with ``objective="clip"``."""
        return self.is_cap if self.objective == "decoupled" else None


@dataclass(frozen=True)
class TspConfig:
    """Time-step parallel updates: all selected timesteps of a micro-batch in one batched forward/backward.

    Args:
        enabled: True / False; None = auto: on when disaggregated, off when colocated (verl-omni's loop).
        chunk_size: rows per forward/backward chunk; 0 = all rows at once.
    """

    enabled: Optional[bool] = None
    chunk_size: int = 0

    def __post_init__(self) -> None:
        if self.enabled is not None:
            _boolean("tsp.enabled", self.enabled)
        _int_at_least("tsp.chunk_size", self.chunk_size, 0)


@dataclass(frozen=True)
class ScheduleSettings:
    """How a run is scheduled: the user's settings.

    Args:
        mode: ``"colocated"`` (verl-omni's layout: one pool generates the whole batch, scores it, then updates,
            per step) or ``"disaggregated"`` (DigenRL: a generator pool and a trainer pool).
        gap: generation-axis pipeline: a micro-batch is one prompt group whose n samples are spread over a lane of
            generator ranks. False: the batch-axis split (each rank owns whole groups).
        pipeline: update micro-batches as soon as they are scored. False: full-batch barrier (updates of a step wait
            until every micro-batch of it is scored), i.e. naive disaggregation.
        tsp / tag / tcss: see `TspConfig`, `TagConfig`, `TcssConfig`.
        task_timeout_s: a task running longer than this fails the run (None: no timeout).
    """

    mode: str = "colocated"
    gap: bool = True
    pipeline: bool = True
    tsp: TspConfig = field(default_factory=TspConfig)
    tag: TagConfig = field(default_factory=TagConfig)
    tcss: TcssConfig = field(default_factory=TcssConfig)
    task_timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError("mode", self.mode, f"use one of {list(MODES)}")
        _boolean("gap", self.gap)
        _boolean("pipeline", self.pipeline)
        timeout = self.task_timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or timeout <= 0):
            raise ConfigError("task_timeout_s", timeout, "use a positive number of seconds, or null")
        for name, cls in (("tsp", TspConfig), ("tag", TagConfig), ("tcss", TcssConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(name, getattr(self, name), f"use a {cls.__name__} (a section, e.g. "
                                  f"{name}.{fields(cls)[0].name}=...)")

    @property
    def inert_in_colocated(self) -> list[str]:
        """The settings that differ from their defaults but have no effect in colocated mode (GAP, pipelining, TAG and
        TCSS need a separate trainer pool); empty for disaggregated runs."""
        if self.mode != "colocated":
            return []
        out = [f.name for f in fields(ScheduleSettings) if f.name in ("gap", "pipeline")
               and getattr(self, f.name) != f.default]
        for name, default in (("tag", TagConfig()), ("tcss", TcssConfig())):
            out += [f"{name}.{f.name}" for f in fields(default)
                    if getattr(getattr(self, name), f.name) != getattr(default, f.name)]
        return out

    def for_mode(self) -> "ScheduleSettings":
        """The settings as they apply to the mode: auto TSP resolved; colocated runs have no TAG and no TCSS; without
        a staleness window nothing is stale (the stale fraction reads 0)."""
        return replace(self, **self._sections_for_mode())

    def _sections_for_mode(self) -> dict[str, Any]:
        tsp = replace(self.tsp, enabled=self.mode == "disaggregated") if self.tsp.enabled is None else self.tsp
        if self.mode == "colocated":
            return {"tsp": tsp, "tag": TagConfig(policy="off"), "tcss": TcssConfig(max_stale_fraction=0.0)}
        tcss = replace(self.tcss, max_stale_fraction=0.0) if self.tcss.staleness == 0 else self.tcss
        return {"tsp": tsp, "tag": self.tag, "tcss": tcss}


@dataclass(frozen=True)
class PoolSpec:
    """One pool of identical ranks.

    Args:
        size: number of ranks (worker ids ``<pool>:0 .. <pool>:size-1``).
        worker_class: accelerator type; keys the cost model (pools of one class share estimates).
            Defaults to the pool name.
    """

    size: int
    worker_class: str = ""


@dataclass(frozen=True)
class ScheduleConfig(ScheduleSettings):
    """What the driver runs: the settings (resolved for the mode, see `ScheduleSettings.for_mode`) plus the run's
    shape.

    Args:
        pools: pool name -> ``PoolSpec`` (``gen`` and ``trn``, or ``col``); plain dicts are accepted; None = 4
            ranks per pool of the mode.
        num_steps: global steps to run.
        start_step: first global step (resume); the run starts with policy version ``start_step``.
        prompts_per_step: prompts per global step.
        n: samples per prompt (group size).
        checkpoint_every: a checkpoint barrier after every global step s with (s + 1) % k == 0 (the driver drains:
            nothing of step s + 1 starts before the checkpoint ends); 0 = no barrier.
        validate_every: a barrier after every global step s with (s + 1) % k == 0 and after the last step, at which the
            runner validates (verl-omni's ``trainer.test_freq``: validation after its global step s + 1, and at
            the last step); the CHECKPOINT task of such a barrier saves only at `is_save_step` steps. 0 = none.
        micro_batch_size: the colocated plan's micro-batch: samples per rank (verl-omni's
            ``ppo_micro_batch_size_per_gpu``); None = a rank's whole share of the step, one micro-batch. See
            `plan.ColocatedPlanner`. The disaggregated plans ignore it (a GAP micro-batch is one prompt group).
        mini_batches_per_step: optimizer steps per global step (verl's ``train_batch_size / ppo_mini_batch_size``
            with ``ppo_epochs=1``): the step's prompt groups are cut into this many mini-batches as verl cuts them
            over the trainer pool's ranks (`minibatch_groups`, `minibatch_dp_ranks`; `plan.step_microbatches`);
            the UPDATEs of mini-batch j accumulate until its OPT_STEP, mini-batch j+1's UPDATEs wait for it, and
            the weights reach the generators (SYNC, one version bump) after the last one. Must divide
            ``prompts_per_step``.
        opt_waits_for_step: a step's optimizer steps wait until every micro-batch of the step is scored, while its
            UPDATEs still start as micro-batches are scored (verl-omni's global std by deferred scaling: the
            step's std scales the gradient at the optimizer step, `diffusion.advantages`).
    """

    pools: Optional[Mapping[str, PoolSpec]] = None
    num_steps: int = 1
    start_step: int = 0
    prompts_per_step: int = 8
    n: int = 8
    checkpoint_every: int = 0
    micro_batch_size: Optional[int] = None
    validate_every: int = 0
    mini_batches_per_step: int = 1
    opt_waits_for_step: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, section in self._sections_for_mode().items():
            object.__setattr__(self, name, section)
        for name, low in (("num_steps", 1), ("prompts_per_step", 1), ("n", 1), ("start_step", 0),
                          ("checkpoint_every", 0), ("validate_every", 0)):
            _int_at_least(name, getattr(self, name), low)
        if self.micro_batch_size is not None:
            _int_at_least("micro_batch_size", self.micro_batch_size, 1)
        _int_at_least("mini_batches_per_step", self.mini_batches_per_step, 1)
        if self.prompts_per_step % self.mini_batches_per_step:
            raise ConfigError("mini_batches_per_step", self.mini_batches_per_step,
                              f"use a divisor of prompts_per_step={self.prompts_per_step} (each mini-batch holds "
                              "whole prompt groups, the same number in each)")
        object.__setattr__(self, "pools", self._normalised_pools())

    @classmethod
    def of(cls, settings: ScheduleSettings, **shape: Any) -> "ScheduleConfig":
        """The schedule of `settings` with the run's shape (`pools`, `num_steps`, ...)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(ScheduleSettings)}, **shape)

    def _normalised_pools(self) -> dict[str, PoolSpec]:
        want = POOL_NAMES[self.mode]
        pools = self.pools if self.pools is not None else {name: PoolSpec(4) for name in want}
        if not isinstance(pools, Mapping) or sorted(pools) != sorted(want):
            got = sorted(pools) if isinstance(pools, Mapping) else pools
            raise ConfigError("pools", got, f"mode={self.mode!r} needs exactly the pools {list(want)}")
        out: dict[str, PoolSpec] = {}
        for name in want:
            spec = pools[name]
            if isinstance(spec, Mapping):
                unknown = set(spec) - {"size", "worker_class"}
                if unknown:
                    raise ConfigError(f"pools.{name}", dict(spec), f"unknown keys {sorted(unknown)}; valid keys are "
                                      "['size', 'worker_class']")
                spec = PoolSpec(**spec)
            if not isinstance(spec, PoolSpec):
                raise ConfigError(f"pools.{name}", spec, "use {size: <int>, worker_class: <str>}")
            _int_at_least(f"pools.{name}.size", spec.size, 1)
            out[name] = PoolSpec(spec.size, spec.worker_class or name)
        return out

    # -- derived ----------------------------------------------------------------------------------
    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.n

    @property
    def minibatch_dp_ranks(self) -> int:
        """The data-parallel ranks the mini-batches are cut over (`minibatch_groups`): the trainer pool's ranks, as
        verl cuts them over its actor ranks, when each rank's block holds whole prompt groups
        (`verl_cut_keeps_groups`); else 1 (contiguous blocks of whole groups: verl's blocks would split groups, which
        a micro-batch of this schedule cannot; the config layer warns on the same rule)."""
        ranks, k = self.pools[self.trainer_pool].size, self.mini_batches_per_step
        # one mini-batch is the whole batch however it is cut: 1 needs no divisibility of the batch by the ranks
        return ranks if k > 1 and verl_cut_keeps_groups(self.prompts_per_step, k, ranks) else 1

    def minibatch_of(self, sample: int) -> int:
        """The mini-batch (optimizer step within the global step, ``0 .. mini_batches_per_step - 1``) of a sample:
        the ``j`` whose `minibatch_groups` block holds its prompt group."""
        share = self.prompts_per_step // self.minibatch_dp_ranks
        return (sample // self.n) % share // (share // self.mini_batches_per_step)

    @property
    def end_step(self) -> int:
        """One past the last global step of the run."""
        return self.start_step + self.num_steps

    def is_checkpoint_step(self, step: int) -> bool:
        """True if a barrier (a CHECKPOINT task: save and/or validate) follows global step `step`."""
        return self.is_save_step(step) or self.is_validate_step(step)

    def is_save_step(self, step: int) -> bool:
        """True if the trainer state is saved at the barrier after `step` ((step + 1) % checkpoint_every == 0)."""
        return self.checkpoint_every > 0 and (step + 1) % self.checkpoint_every == 0

    def is_validate_step(self, step: int) -> bool:
        """True if the runner validates at the barrier after `step` ((step + 1) % validate_every == 0, or the
        last step of the run when validating at all)."""
        return self.validate_every > 0 and ((step + 1) % self.validate_every == 0 or step == self.end_step - 1)

    def next_barrier_step(self, first: int) -> int:
        """The first barrier step >= `first` (no barrier left: the last step): the last step that may be planned
        before that barrier's CHECKPOINT ended."""
        return next((s for s in range(first, self.end_step) if self.is_checkpoint_step(s)), self.end_step - 1)

    def workers(self, pool: str) -> tuple[str, ...]:
        """Worker ids of a pool, in rank order."""
        return tuple(f"{pool}:{i}" for i in range(self.pools[pool].size))

    def worker_class(self, worker_id: str) -> str:
        return self.pools[worker_pool(worker_id)].worker_class

    @property
    def generator_pool(self) -> str:
        return "col" if self.mode == "colocated" else "gen"

    @property
    def trainer_pool(self) -> str:
        return "col" if self.mode == "colocated" else "trn"
