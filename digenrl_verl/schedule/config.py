"""`ScheduleConfig`: every scheduling knob, validated when built.

Users write these under ``trainer.digenrl`` (e.g. ``trainer.digenrl.tag=bts``); a bad value raises a
``ValueError`` that names the key as written there, the bad value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

KEY_PREFIX = "trainer.digenrl"

MODES = ("colocated", "disaggregated")
TAG_MODES = ("off", "static", "bts")
POOL_NAMES = {"colocated": ("col",), "disaggregated": ("gen", "trn")}


def _key(name: str) -> str:
    return f"{KEY_PREFIX}.{name}"


def _bad(name: str, value: Any, fix: str) -> ValueError:
    return ValueError(f"{_key(name)}={value!r} is invalid: {fix}")


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
class ScheduleConfig:
    """How one training run is scheduled.

    Args:
        mode: ``"disaggregated"`` (generator pool ``gen`` + trainer pool ``trn``) or ``"colocated"``
            (one pool ``col``: generate the whole batch, score it, then update, per step).
        gap: generation-axis pipeline: a micro-batch is one prompt group whose n samples are spread
            over a lane of generator ranks. False: the batch-axis split (each rank owns whole groups).
        pipeline: update micro-batches as soon as they are scored. False: full-batch barrier (updates
            of a step wait until every micro-batch of it is scored), i.e. naive disaggregation.
        tsp: run updates with time-step parallelism. The scheduler only passes the ``"tsp"`` flag on
            UPDATE tasks; the executor decides how to run it (and the cost model sees its cost).
        tag: trainer-assisted generation: ``"off"``, ``"static"`` (``static_k`` TAG micro-batches per
            step, at the first bubbles) or ``"bts"`` (bubble-aware search at every trainer bubble).
        static_k: TAG micro-batches per step for ``tag="static"``.
        staleness: TCSS window W: 0 = synchronous (on-policy), 1 = generation of step s+1 may start
            with version s while step s is still updating.
        max_stale_fraction: at most this fraction of a step's samples may be generated stale.
        max_gen_futures: at most this many GEN/TAG tasks in flight at once (None: no limit).
        tcss_guard: start a stale GEN only when its estimated end is before the weight SYNC it runs ahead
            of would start, so TCSS never delays a SYNC (the schedule then depends on measured costs).
            False: start stale GENs whenever the TCSS limits allow (deterministic given the limits).
        num_steps: global steps to run.
        start_step: first global step (resume); the run starts with policy version ``start_step``.
        prompts_per_step: prompts per global step.
        n: samples per prompt (group size).
        pools: pool name -> ``PoolSpec`` (``gen`` and ``trn``, or ``col``). Plain dicts are accepted.
        task_timeout_s: a task running longer than this fails the run (None: no timeout).
        probe_tag: with ``tag="bts"``, run one TAG micro-batch at the first bubble to measure the
            trainer-side generation cost (the paper's profiling run).
        bts_max_states: search budget per BTS solve (states expanded); when exceeded, BTS decides by a
            one-step lookahead over rollouts instead (the decision is marked ``budget_hit`` in the trace).
    """

    mode: str = "disaggregated"
    gap: bool = True
    pipeline: bool = True
    tsp: bool = True
    tag: str = "bts"
    static_k: int = 0
    staleness: int = 0
    max_stale_fraction: float = 0.0
    max_gen_futures: int | None = None
    tcss_guard: bool = True
    num_steps: int = 1
    start_step: int = 0
    prompts_per_step: int = 8
    n: int = 8
    pools: Mapping[str, PoolSpec] = field(
        default_factory=lambda: {"gen": PoolSpec(4, "gen"), "trn": PoolSpec(4, "trn")}
    )
    task_timeout_s: float | None = None
    probe_tag: bool = True
    bts_max_states: int = 2_000

    def __post_init__(self) -> None:
        self._check_choices()
        self._check_numbers()
        object.__setattr__(self, "pools", self._normalised_pools())
        self._check_mode_combinations()

    # -- validation -------------------------------------------------------------------------------
    def _check_choices(self) -> None:
        if self.mode not in MODES:
            raise _bad("mode", self.mode, f"use one of {list(MODES)}")
        if self.tag not in TAG_MODES:
            raise _bad("tag", self.tag, f"use one of {list(TAG_MODES)}")
        for name in ("gap", "pipeline", "tsp", "probe_tag", "tcss_guard"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "use true or false")
        if self.staleness not in (0, 1) or isinstance(self.staleness, bool):
            raise _bad("staleness", self.staleness, "use 0 (synchronous) or 1 (one-step TCSS)")

    def _check_numbers(self) -> None:
        for name, low in (("num_steps", 1), ("prompts_per_step", 1), ("n", 1), ("start_step", 0),
                          ("static_k", 0), ("bts_max_states", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise _bad(name, value, f"use an integer >= {low}")
        frac = self.max_stale_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 <= frac <= 1.0:
            raise _bad("max_stale_fraction", frac, "use a number in [0, 1]")
        futures = self.max_gen_futures
        if futures is not None and (isinstance(futures, bool) or not isinstance(futures, int) or futures < 1):
            raise _bad("max_gen_futures", futures, "use an integer >= 1, or null for no limit")
        timeout = self.task_timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or timeout <= 0):
            raise _bad("task_timeout_s", timeout, "use a positive number of seconds, or null")

    def _normalised_pools(self) -> dict[str, PoolSpec]:
        want = POOL_NAMES[self.mode]
        if not isinstance(self.pools, Mapping) or sorted(self.pools) != sorted(want):
            got = sorted(self.pools) if isinstance(self.pools, Mapping) else self.pools
            raise _bad("pools", got, f"mode={self.mode!r} needs exactly the pools {list(want)}")
        out: dict[str, PoolSpec] = {}
        for name in want:
            spec = self.pools[name]
            if isinstance(spec, Mapping):
                unknown = set(spec) - {"size", "worker_class"}
                if unknown:
                    raise _bad(f"pools.{name}", dict(spec), f"unknown keys {sorted(unknown)}; "
                               "valid keys are ['size', 'worker_class']")
                spec = PoolSpec(**spec)
            if not isinstance(spec, PoolSpec):
                raise _bad(f"pools.{name}", spec, "use {size: <int>, worker_class: <str>}")
            if isinstance(spec.size, bool) or not isinstance(spec.size, int) or spec.size < 1:
                raise _bad(f"pools.{name}.size", spec.size, "use an integer >= 1")
            out[name] = PoolSpec(spec.size, spec.worker_class or name)
        return out

    def _check_mode_combinations(self) -> None:
        if self.mode == "colocated":
            if self.tag != "off":
                raise _bad("tag", self.tag, "colocated mode has no separate trainer to assist; use 'off'")
            if self.staleness != 0:
                raise _bad("staleness", self.staleness, "colocated mode is synchronous; use 0")
        if self.tag == "static" and self.static_k == 0:
            raise _bad("static_k", self.static_k, "tag='static' needs static_k >= 1 (or use tag='off')")
        if self.staleness == 0 and self.max_stale_fraction > 0:
            raise _bad("max_stale_fraction", self.max_stale_fraction,
                       "staleness=0 generates nothing stale; set it to 0 or set staleness=1")

    # -- derived ----------------------------------------------------------------------------------
    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.n

    @property
    def end_step(self) -> int:
        """One past the last global step of the run."""
        return self.start_step + self.num_steps

    def workers(self, pool: str) -> tuple[str, ...]:
        """Worker ids of a pool, in rank order."""
        return tuple(f"{pool}:{i}" for i in range(self.pools[pool].size))

    def worker_class(self, worker_id: str) -> str:
        return self.pools[worker_id.partition(":")[0]].worker_class

    @property
    def generator_pool(self) -> str:
        return "col" if self.mode == "colocated" else "gen"

    @property
    def trainer_pool(self) -> str:
        return "col" if self.mode == "colocated" else "trn"

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "ScheduleConfig":
        """Build from a plain mapping (e.g. the ``trainer.digenrl`` node of an OmegaConf config)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ValueError(f"unknown keys {[_key(k) for k in unknown]}; valid keys are "
                             f"{sorted(_key(k) for k in names)}")
        return cls(**dict(raw))
