"""Paper-like scenarios, their rows (two colocated baselines, the ablation ladder, full DigenRL), the two cost
settings, the calibration and one function that runs a config in the simulator.

Rows (``LADDER``; each disaggregated row adds one mechanism to the previous one):

===================  ==========================================================================================
colocated-verl-omni  all ranks generate the batch, score it, then update: per-timestep loop, old log-probs
                     recomputed (one more forward per trained step), verl-omni's offload mode and micro-batches
colocated-best       the same layout with TSP and old log-probs from the rollout, and the cheaper of offload and
                     resident memory modes: the best colocated plan
naive                disaggregated, batch-axis micro-batches, full-batch barrier, per-timestep loop
+GAP                 generation-axis micro-batches, updates pipelined as micro-batches are scored
+TSP                 time-step-parallel updates (cheaper per micro-batch)
+TAG static          the trainer generates k micro-batches per step, k = round(x*) of the LP bound
+TAG BTS             bubble-aware TAG search instead of a fixed k
digenrl              full DigenRL: + TCSS, staleness window 1 (at most ``TCSS_FRACTION`` of a step's samples stale)
===================  ==========================================================================================

Costs (``COSTS``): ``"ideal"`` runs every row without colocation cost terms (no engine switch, no residency, no
memory ceiling, TAG without its context switch): on identical devices a colocated run with TSP is then the limit
disaggregation can at best match. ``"calibrated"`` turns on the terms of `sim.profiles.ColocationCosts`, with the
one unknown (the engine switch's effective bandwidth, `PRIMARY_CALIBRATION`) fitted by `calibrate` on one paper
figure; the other paper figures (`PAPER_FIGURES`) are then predictions, and `predictions` reports their errors.
`ALTERNATIVE_CALIBRATION` fits a different single unknown (the colocated generator's slowdown, with the switch at an
assumed physical bandwidth) on the same figure, so the held-out figures can say which shape of colocation cost they
are consistent with. The paper's heterogeneous pair is `HETERO_PAPER_CLUSTER` (scenario ``hetero-paper-a+c``);
``hetero-8+8`` keeps the older assumed pair (0.6 speed, 80 GB each) as a sensitivity case without a paper figure.

The paper's figures are quoted from issue 13 (the section/figure numbers are not in the project's reference files);
our costs are modelled (see ``sim.profiles``), not measured on the paper's hardware.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any, Sequence

from digenrl_verl.schedule.bounds import Bound, StepCosts, colocated_lower_bound, run_lower_bound
from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig, TspConfig
from digenrl_verl.schedule.cost import CostProfiler
from digenrl_verl.schedule.driver import Driver, StepResult
from digenrl_verl.schedule.plan import planner_for, split_even
from digenrl_verl.schedule.tag import BtsTag
from digenrl_verl.schedule.trace import TraceMetrics
from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import Fault, SimExecutor
from digenrl_verl.sim.profiles import (IDEAL, USABLE_MEMORY_FRACTION, ColocationCosts, CostProfile, HybridEngine,
                                       RowCosts, colocated_row, disaggregated_row, get_footprint, get_profile,
                                       hybrid_row)
from digenrl_verl.sim.registry import NamedRegistry

TCSS_FRACTION = 0.25
# Full DigenRL as the simulator runs it by default (the ladder's last row, `digenrl-sim`'s single run).
FULL_DIGENRL_SETTINGS: dict[str, Any] = dict(tsp=TspConfig(enabled=True), tag=TagConfig(policy="bts"),
                                             tcss=TcssConfig(staleness=1, max_stale_fraction=TCSS_FRACTION))


@dataclass(frozen=True)
class Scenario:
    """A workload on a cluster.

    Args:
        name: registry key.
        profile: cost profile name (``sim.profiles``).
        cluster: disaggregated cluster spec (the colocated row uses the same ranks as one pool).
        prompts_per_step, n, num_steps: the batch and run length.
        paper_speedup: the paper's reported speedup range over naive disaggregation, if any.
        hybrid: TAG on verl-omni's hybrid engine (a rollout replica on every trainer rank, `HybridEngine`); None:
            the trainer samples in its own process (``tag_overhead``), as every paper scenario.
    """

    name: str
    profile: str
    cluster: str
    prompts_per_step: int = 32
    n: int = 8
    num_steps: int = 4
    paper_speedup: str | None = None
    hybrid: HybridEngine | None = None


SCENARIOS: NamedRegistry[Scenario] = NamedRegistry("scenario")


def register_scenario(s: Scenario) -> Scenario:
    return SCENARIOS.register(s.name, s)


for _steps in (20, 30, 40):
    for _frac in (0.4, 0.6):
        register_scenario(Scenario(f"hunyuanvideo-{_steps}-{_frac}", f"hunyuanvideo-{_steps}-{_frac}",
                                   "gen=8xH800,trn=8xH800", paper_speedup="2.49-3.34"))
register_scenario(Scenario("wan2.1", "wan2.1", "gen=8xH800,trn=8xH800", paper_speedup="2.44-2.85"))
register_scenario(Scenario("flux.1", "flux.1", "gen=8xH800,trn=8xH800"))
register_scenario(Scenario("qwen-image", "qwen-image", "gen=8xH800,trn=8xH800"))
# Sec. 5.4-like heterogeneous 8+8: generators on a slower class than the trainers (speed is assumed, both 80 GB).
register_scenario(Scenario("hetero-8+8", "hunyuanvideo-20-0.6", "gen=8xA800@0.6,trn=8xH800"))

HETERO_PAPER_SPEED = 38.7 / 126.0
"""Speed of the paper's testbed-A GPU relative to its testbed-C GPU: the ratio of their FP32 TFLOPS (38.7 and 126).
Source: a machine-generated (qwen-long) Chinese summary of arXiv 2606.24369v1 in a public daily-arXiv digest (the
paper's v2 is withdrawn; the summary's testbed table: A = 32 GPUs, 48 GB, 38.7 FP32 TFLOPS; B = 32 GPUs, 80 GB, 67;
C = 16 GPUs, 96 GB, 126; heterogeneous runs on A + C). Secondary and unchecked against the paper; FP32 TFLOPS is a
proxy for the bf16 tensor-core work of a diffusion transformer (assumption). The figures match the RTX A6000 and the
RTX PRO 6000 Blackwell (our inference, not stated by the source)."""

HETERO_PAPER_CLUSTER = f"gen=8xTestbedA@{HETERO_PAPER_SPEED:.3f}/48,trn=8xTestbedC/96"
"""The paper's heterogeneous pair (testbeds A + C, `HETERO_PAPER_SPEED`): 48 GB and 96 GB per GPU (same source).
Assumptions: 8 + 8 GPUs (the source gives no counts for the mixed runs), the weaker, smaller class generates and the
stronger, larger one trains (the trainer state needs the memory), testbed C runs at the profiles' reference speed
(1.0; only the switch's absolute seconds depend on it)."""
# The paper's heterogeneous shape: colocated ranks run at testbed A's pace and hold what 48 GB allow.
register_scenario(Scenario("hetero-paper-a+c", "hunyuanvideo-20-0.6", HETERO_PAPER_CLUSTER))

PAPER_SUITE = tuple(SCENARIOS)
COLOCATED_ROWS = ("colocated-verl-omni", "colocated-best")
DISAGGREGATED_LADDER = ("naive", "+GAP", "+TSP", "+TAG static", "+TAG BTS", "digenrl")
LADDER = COLOCATED_ROWS + DISAGGREGATED_LADDER
HEADLINE_ROWS = ("colocated-verl-omni", "colocated-best", "digenrl")
COSTS = ("ideal", "calibrated")

_PAPER = "DigenRL paper (arXiv 2606.24369) as quoted in issue 13"
PAPER_FIGURES: dict[str, dict[str, Any]] = {
    **{f"hunyuanvideo-{st}-{fr}": {
        "source": f"{_PAPER}: HunyuanVideo over colocation (range over its settings; section/figure not in the "
                  "reference files)",
        "vs_colocated": [1.13, 1.49], "vs_colocated_without_tcss": [1.04, 1.37]}
       for st in (20, 30, 40) for fr in (0.4, 0.6)},
    "wan2.1": {"source": f"{_PAPER}: Wan2.1 over colocation (section/figure not in the reference files)",
               "vs_colocated": [1.21, 1.45], "vs_colocated_without_tcss": [1.13, 1.34]},
    "flux.1": {"source": f"{_PAPER}: FLUX.1 over colocation (section/figure not in the reference files)",
               "vs_colocated": [1.06, 1.21]},
    "hetero-paper-a+c": {"source": f"{_PAPER}: heterogeneous GPUs (Sec. 5.4, testbeds A + C per a secondary "
                                   "summary, see HETERO_PAPER_CLUSTER; the baseline is not stated there)",
                         "vs_colocated": [1.46, 1.85]},
}
"""The paper's speedups of DigenRL over colocated training, per scenario they cover. ``vs_colocated`` is compared with
``digenrl_vs_colocated_best`` (DigenRL with TCSS where the paper gives a with-TCSS range),
``vs_colocated_without_tcss`` with the ``+TAG BTS`` row over ``colocated-best``."""

PAPER_VS_VERL_OMNI = {"source": f"{_PAPER}: over veRL-Omni (which workloads is not stated)", "range": [1.56, 2.21]}
"""Compared with ``digenrl_vs_colocated_verl_omni`` of every calibrated homogeneous scenario."""

CALIBRATION_FIGURE = "flux.1"
"""The scenario whose paper figure (midpoint of its range) fits the unknown term; every other figure is held out."""

IDEAL_PARITY_TARGET = 0.97
HETERO_TARGET = 1.85


def get_scenario(name: str) -> Scenario:
    return SCENARIOS.lookup(name)


def step_costs(config: ScheduleConfig, cluster: ClusterSpec, profile: CostProfile) -> StepCosts:
    """The true per-micro-batch costs of ``config`` on ``cluster`` (for the lower bound)."""
    planner = planner_for(config)
    gen_pool, trn_pool = config.pools[config.generator_pool], config.pools[config.trainer_pool]
    gen_speed, trn_speed = cluster.speed(gen_pool.worker_class), cluster.speed(trn_pool.worker_class)
    gen_workers, trn_workers = config.workers(config.generator_pool), config.workers(config.trainer_pool)
    mbs = planner.microbatches(0, config.prompts_per_step, config.n, len(gen_workers))
    lanes = planner.lanes(gen_workers, config.n)

    def works(assign) -> list[int]:
        return [max(len(s) for _, s in assign(mb)) for mb in mbs]

    lane_works = [works(lambda mb, lane=lane: planner.assign(mb, lane, config.n)) for lane in lanes]
    lane_work = [sum(w) / len(w) for w in lane_works]
    trn_works = works(lambda mb: split_even(mb.samples, trn_workers))
    trn_work = sum(trn_works) / len(trn_works)
    unit = profile.unit
    switch = profile.tag_switch_s  # a hybrid-engine TAG's switch: per task, not per sample (0: none)
    first = min(w for ws in lane_works for w in ws) * (unit(TaskKind.GEN) + unit(TaskKind.SCORE)) / gen_speed
    if config.tag.policy != "off":  # the trainer may start with a TAG instead of waiting for the generators
        first = min(first, unit(TaskKind.TAG_GEN) * min(trn_works) / trn_speed + switch)
    return StepCosts(
        microbatches=len(mbs),
        lane_gen=tuple(unit(TaskKind.GEN) * w / gen_speed for w in lane_work),
        lane_score=tuple(unit(TaskKind.SCORE) * w / gen_speed for w in lane_work),
        update=unit(TaskKind.UPDATE, config.tsp.enabled) * trn_work / trn_speed,
        tag=None if config.tag.policy == "off" else unit(TaskKind.TAG_GEN) * trn_work / trn_speed + switch,
        opt=unit(TaskKind.OPT_STEP) / trn_speed,
        sync=0.0 if config.mode == "colocated" else unit(TaskKind.SYNC) / min(gen_speed, trn_speed),
        last_update=unit(TaskKind.UPDATE, config.tsp.enabled) * min(trn_works) / trn_speed,
        first_gen=first,
        tag_ratio=None if config.tag.policy == "off" else max(
            (unit(TaskKind.GEN) / gen_speed) / sum(1.0 / w for w in lws_i)
            / (unit(TaskKind.TAG_GEN) * tw / trn_speed + switch)
            for lws_i, tw in zip(zip(*lane_works), trn_works)),
    )


def lower_bound(config: ScheduleConfig, cluster: ClusterSpec, profile: CostProfile) -> Bound:
    costs = step_costs(config, cluster, profile)
    if config.mode == "colocated":
        return colocated_lower_bound(costs, config.num_steps)
    return run_lower_bound(costs, config.num_steps, config.tcss.staleness)


@dataclass
class RunOutcome:
    """Everything one simulated run produced."""

    label: str
    config: ScheduleConfig
    cluster: ClusterSpec
    makespan: float
    samples_per_s: float
    metrics: TraceMetrics
    bound: Bound
    steps: list[StepResult]
    driver: Driver
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def efficiency(self) -> float:
        return self.bound.value / self.makespan if self.makespan > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        bts = self.driver.tag_policy
        solves = bts.solve_seconds if isinstance(bts, BtsTag) else []
        return {
            "label": self.label, "makespan_s": self.makespan, "samples_per_s": self.samples_per_s,
            "lower_bound_s": self.bound.value, "efficiency": self.efficiency,
            "utilisation": self.metrics.utilisation, "bubble_fraction": self.metrics.bubble_fraction,
            "tag_microbatches": sum(s.tag_microbatches for s in self.steps),
            "stale_samples": sum(s.stale_samples for s in self.steps),
            "driver_ms_per_decision": self.driver.stats.ms_per_decision,
            "decisions": self.driver.stats.decisions,
            "bts_solves": len(solves), "bts_max_ms": 1000 * max(solves, default=0.0),
            "bts_mean_ms": 1000 * sum(solves) / len(solves) if solves else 0.0,
            "step_s": [r.end - r.start for r in self.steps],
            "wall_s": self.wall_s, **self.extra,
        }


def run_config(config: ScheduleConfig, cluster: ClusterSpec, profile: CostProfile, *, label: str = "",
               jitter: float = 0.0, seed: int = 0, faults: tuple[Fault, ...] = (),
               record_decisions: bool = True, profiler: CostProfiler | None = None,
               switch_prior: bool = True) -> RunOutcome:
    """Run ``config`` in the simulator and measure it.

    ``profiler``: the driver's cost profiler (None: a fresh one, which for TAG on the hybrid engine with BTS and
    ``switch_prior`` starts from `hybrid_switch_prior`; without a prior BTS probes g' at its first bubble)."""
    executor = SimExecutor(cluster, profile, jitter=jitter, seed=seed, faults=faults)
    if profiler is None and switch_prior:
        profiler = hybrid_switch_prior(config, profile)
    driver = Driver(config, executor, profiler=profiler)
    driver.trace.record_decisions = record_decisions
    start = time.perf_counter()
    steps = driver.run()
    wall = time.perf_counter() - start
    bound = lower_bound(config, cluster, profile)
    workers = [w for pool in config.pools for w in config.workers(pool)]
    metrics = driver.trace.metrics(workers, bound.value)
    makespan = metrics.end  # runs start at t = 0
    samples = config.samples_per_step * config.num_steps
    return RunOutcome(label, config, cluster, makespan, samples / makespan if makespan else 0.0, metrics, bound,
                      steps, driver, wall)


def ladder_configs(s: Scenario, cluster: ClusterSpec,
                   profile: CostProfile) -> dict[str, tuple[ScheduleConfig, ClusterSpec]]:
    """The configs of every row of ``LADDER`` for a scenario (see the module docstring)."""
    base = dict(prompts_per_step=s.prompts_per_step, n=s.n, num_steps=s.num_steps)
    col = cluster.colocated()
    per_timestep, batched = TspConfig(enabled=False), TspConfig(enabled=True)

    def colocated(tsp: TspConfig) -> ScheduleConfig:
        return ScheduleConfig(mode="colocated", pools=col.pools, gap=False, pipeline=False, tsp=tsp, **base)

    out: dict[str, tuple[ScheduleConfig, ClusterSpec]] = {
        "colocated-verl-omni": (colocated(per_timestep), col),
        "colocated-best": (colocated(batched), col),
    }
    off = TagConfig(policy="off")

    def disaggregated(**settings: Any) -> ScheduleConfig:
        return ScheduleConfig(mode="disaggregated", pools=cluster.pools, **settings, **base)

    naive = disaggregated(gap=False, pipeline=False, tsp=per_timestep, tag=off)
    gap = disaggregated(tsp=per_timestep, tag=off)
    tsp = disaggregated(tsp=batched, tag=off)
    probe = disaggregated(tsp=batched)
    x_star = run_lower_bound(step_costs(probe, cluster, profile), 1, 0).tags
    k = max(1, round(x_star))
    static = disaggregated(tsp=batched, tag=TagConfig(policy="static", static_k=k))
    bts = disaggregated(tsp=batched)
    full = disaggregated(**FULL_DIGENRL_SETTINGS)
    for name, cfg in (("naive", naive), ("+GAP", gap), ("+TSP", tsp), ("+TAG static", static),
                      ("+TAG BTS", bts), ("digenrl", full)):
        out[name] = (cfg, cluster)
    return out


def row_costs(label: str, s: Scenario, cluster: ClusterSpec, costs: ColocationCosts) -> list[RowCosts]:
    """The cost profile(s) row ``label`` of scenario ``s`` runs with under ``costs``: one, except
    ``colocated-best`` with calibrated costs, which tries both memory modes (the faster one is the row)."""
    profile, fp = get_profile(s.profile), get_footprint(s.profile)
    if label in COLOCATED_ROWS:
        col = cluster.colocated()
        common = dict(ranks=col.total_ranks, memory_gb=col.pool_memory_gb("col"),
                      speed=col.speed(col.pools["col"].worker_class))
        if label == "colocated-verl-omni":  # verl-omni's recipes offload (reference §4)
            return [colocated_row(profile, fp, costs, tsp=False, recompute=True, mode="offload", **common)]
        modes = ("offload", "resident") if costs.on else ("offload",)
        return [colocated_row(profile, fp, costs, tsp=True, recompute=False, mode=m, **common) for m in modes]
    row = disaggregated_row(profile, fp, costs, trainer_ranks=cluster.pools["trn"].size,
                            trainer_memory_gb=cluster.pool_memory_gb("trn"),
                            generator_memory_gb=cluster.pool_memory_gb("gen"))
    if s.hybrid is None:
        return [row]
    hybrid = hybrid_row(row.profile, fp, s.hybrid, trainer_ranks=cluster.pools["trn"].size,
                        trainer_memory_gb=cluster.pool_memory_gb("trn"))
    return [RowCosts(hybrid.profile, {**row.info, **hybrid.info,
                                      "feasible": row.info.get("feasible", True) and hybrid.info["feasible"]})]


def run_row(label: str, s: Scenario, cfg: ScheduleConfig, cluster: ClusterSpec, costs: ColocationCosts, *,
            jitter: float = 0.0, seed: int = 0) -> RunOutcome:
    """Run one row; with several candidate cost profiles (memory modes) keep the fastest feasible one."""
    best: RunOutcome | None = None
    tried: dict[str, float | None] = {}
    for rc in row_costs(label, s, cluster, costs):
        mode = rc.info.get("memory_mode", "")
        if rc.info.get("feasible", True) is False:
            tried[mode] = None
            continue
        o = run_config(cfg, cluster, rc.profile, label=label, jitter=jitter, seed=seed)
        o.extra["cost_model"] = dict(rc.info)
        tried[mode] = o.makespan
        if best is None or o.makespan < best.makespan:
            best = o
    if best is None:
        raise ValueError(f"{s.name}: row {label} fits in no memory mode under {costs.name} costs "
                         f"({row_costs(label, s, cluster, costs)[0].info})")
    if len(tried) > 1:
        best.extra["cost_model"]["modes_makespan_s"] = tried
    return best


def run_ladder(s: Scenario, *, costs: ColocationCosts = IDEAL, jitter: float = 0.0, seed: int = 0,
               labels: Sequence[str] = LADDER) -> list[RunOutcome]:
    """Run the rows ``labels`` of ``LADDER`` for a scenario under ``costs``; each outcome's ``extra`` has
    ``speedup_vs_naive`` (when naive ran) and ``cost_model`` (what the memory model decided)."""
    cluster = ClusterSpec.parse(s.cluster)
    profile = get_profile(s.profile) if s.hybrid is None else scenario_profile(s, cluster).profile
    configs = ladder_configs(s, cluster, profile)  # (the static row's k from the TAG cost with its switch)
    outcomes = []
    for label in labels:
        cfg, cl = configs[label]
        outcome = run_row(label, s, cfg, cl, costs, jitter=jitter, seed=seed)
        if cfg.tag.policy == "static":
            outcome.extra["static_k"] = cfg.tag.static_k
        outcomes.append(outcome)
    naive = next((o for o in outcomes if o.label == "naive"), None)
    for o in outcomes:
        if naive is not None:
            o.extra["speedup_vs_naive"] = naive.makespan / o.makespan
    return outcomes


def ratios(outcomes: Sequence[RunOutcome]) -> dict[str, float]:
    """The headline ratios of a scenario's rows (speedups: baseline makespan / row makespan)."""
    by = {o.label: o.makespan for o in outcomes}
    out = {}
    if "digenrl" in by and "colocated-best" in by:
        out["digenrl_vs_colocated_best"] = by["colocated-best"] / by["digenrl"]
    if "digenrl" in by and "colocated-verl-omni" in by:
        out["digenrl_vs_colocated_verl_omni"] = by["colocated-verl-omni"] / by["digenrl"]
    if "colocated-best" in by and "colocated-verl-omni" in by:
        out["colocated_best_vs_colocated_verl_omni"] = by["colocated-verl-omni"] / by["colocated-best"]
    if "+TAG BTS" in by and "colocated-best" in by:
        out["digenrl_without_tcss_vs_colocated_best"] = by["colocated-best"] / by["+TAG BTS"]
    return out


# ================================================================================ calibration
ASSUMED_SWITCH_GB_S = 10.0
"""Engine-switch bandwidth held fixed while the alternative calibration fits the colocated generator's slowdown:
10 GB/s per rank. Assumption (no source): the order of pageable host <-> device copies over PCIe; at it the switch
costs a few percent of a step (docs/benchmarks.md)."""


@dataclass(frozen=True)
class Unknown:
    """One unknown term of `ColocationCosts` that a calibration fits on one paper figure.

    Args:
        parameter: the `ColocationCosts` field to fit.
        lo, hi: the search interval (bisection on the log of the value).
        fixed: other `ColocationCosts` fields held at a given value while fitting.
    """

    parameter: str
    lo: float
    hi: float
    fixed: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        names = {f.name for f in fields(ColocationCosts)} - {"name"}
        for key in (self.parameter, *(k for k, _ in self.fixed)):
            if key not in names:
                raise ValueError(f"Unknown: {key!r} is not a ColocationCosts term; use one of {sorted(names)}")
        if not 0 < self.lo < self.hi:
            raise ValueError(f"Unknown({self.parameter}): need 0 < lo < hi, got [{self.lo}, {self.hi}]")

    def costs(self, value: float) -> ColocationCosts:
        return ColocationCosts("calibrated", **{**dict(self.fixed), self.parameter: value})


PRIMARY_CALIBRATION = Unknown("switch_gb_s", 0.01, 1000.0)
"""The headline model: the engine switch's bandwidth is the one unknown; the colocated generator runs at the
profile's rate (`ColocationCosts.colocated_gen_factor` = 1)."""

ALTERNATIVE_CALIBRATION = Unknown("colocated_gen_factor", 1.0, 10.0, (("switch_gb_s", ASSUMED_SWITCH_GB_S),))
"""A second, equally small model, reported beside the headline: the switch at an assumed physical bandwidth
(`ASSUMED_SWITCH_GB_S`) and the colocated generator's slowdown as the one unknown (`ColocationCosts` term 8). Both
are fitted on the same figure; the paper's other figures say which shape of colocation cost they are consistent
with."""


def _colocated_best_ratio(s: Scenario, costs: ColocationCosts, digenrl_s: float) -> float:
    cluster = ClusterSpec.parse(s.cluster)
    cfg, cl = ladder_configs(s, cluster, get_profile(s.profile))["colocated-best"]
    return run_row("colocated-best", s, cfg, cl, costs).makespan / digenrl_s


@lru_cache(maxsize=8)
def calibrate(figure: str = CALIBRATION_FIGURE,
              unknown: Unknown = PRIMARY_CALIBRATION) -> tuple[ColocationCosts, dict[str, Any]]:
    """Fit ``unknown`` so that ``digenrl_vs_colocated_best`` of scenario ``figure`` under calibrated costs equals the
    midpoint of the paper's range for it.

    The DigenRL row depends on neither unknown (only colocated rows switch engines or run the colocated generator),
    and colocated-best's makespan is monotone in each (falls as the bandwidth grows, rises with the generator's
    slowdown), so a bisection on log(value) over ``[unknown.lo, unknown.hi]`` finds it; when the target lies outside
    what the interval reaches, the nearer end is returned (``at_bound``). Returns the costs and a report (figure,
    source, paper range, target, parameter, fitted value, fixed terms, the ratio it reaches).
    """
    s = get_scenario(figure)
    paper = PAPER_FIGURES[figure]
    lo_r, hi_r = paper["vs_colocated"]
    target = (lo_r + hi_r) / 2.0
    cluster = ClusterSpec.parse(s.cluster)
    cfg, cl = ladder_configs(s, cluster, get_profile(s.profile))["digenrl"]
    digenrl_s = run_row("digenrl", s, cfg, cl, unknown.costs(unknown.lo)).makespan

    def gap(log_value: float) -> float:
        return _colocated_best_ratio(s, unknown.costs(math.exp(log_value)), digenrl_s) - target

    lo, hi = math.log(unknown.lo), math.log(unknown.hi)
    g_lo, g_hi = gap(lo), gap(hi)
    if g_lo * g_hi > 0:  # the target is out of reach within the interval: the nearer end
        value, at_bound = math.exp(lo if abs(g_lo) < abs(g_hi) else hi), True
    else:
        for _ in range(60):
            mid = (lo + hi) / 2.0
            if (gap(mid) > 0) == (g_lo > 0):
                lo = mid
            else:
                hi = mid
        value, at_bound = math.exp((lo + hi) / 2.0), False
    costs = unknown.costs(value)
    return costs, {"figure": figure, "source": paper["source"], "paper_range": [lo_r, hi_r], "target": target,
                   "parameter": unknown.parameter, "value": value, "fixed": dict(unknown.fixed),
                   "at_bound": at_bound, "reached": _colocated_best_ratio(s, costs, digenrl_s)}


def costs_named(name: str) -> ColocationCosts:
    """``"ideal"`` or ``"calibrated"`` (the latter fitted by `calibrate`)."""
    if name == "ideal":
        return IDEAL
    if name == "calibrated":
        return calibrate()[0]
    raise ValueError(f"unknown costs {name!r}: use one of {list(COSTS)}")


def paper_check(value: float, paper_range: Sequence[float]) -> dict[str, Any]:
    """How a simulated speedup compares with a paper range: inside, above or below, and by how much."""
    lo, hi = paper_range
    mid = (lo + hi) / 2.0
    where = "inside" if lo <= value <= hi else ("above" if value > hi else "below")
    return {"simulated": value, "paper": [lo, hi], "where": where, "inside_or_above": value >= lo,
            "error_vs_midpoint": value / mid - 1.0,
            "distance_to_range": 0.0 if where == "inside" else (value - hi if where == "above" else value - lo)}


def predictions(reports: Sequence[dict[str, Any]], calibration: dict[str, Any]) -> list[dict[str, Any]]:
    """Per paper figure: the simulated values of the calibrated scenarios it covers, their range, and the error of
    the prediction (the calibration figure is marked ``held_out: false``).

    ``error_vs_midpoint`` = mean simulated / paper midpoint - 1; ``range_overlap`` says whether the simulated range
    meets the paper's; ``distance_to_range`` is 0 when the mean lies inside it, else mean - hi (above) or
    mean - lo (below)."""
    cal = [r for r in reports if r["costs"] == "calibrated"]
    figures: list[tuple[str, str, str, list[float], list[dict[str, Any]]]] = []
    by_source: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in cal:
        for key in ("vs_colocated", "vs_colocated_without_tcss"):
            if r.get("paper") and key in r["paper"]:
                by_source.setdefault((r["paper"]["source"], key), []).append(r)
    for (source, key), rs in by_source.items():
        metric = "digenrl_vs_colocated_best" if key == "vs_colocated" else "digenrl_without_tcss_vs_colocated_best"
        figures.append((source, key, metric, rs[0]["paper"][key], rs))
    homogeneous = [r for r in cal if r.get("paper_vs_verl_omni")]
    if homogeneous:
        figures.append((PAPER_VS_VERL_OMNI["source"], "vs_colocated_verl_omni", "digenrl_vs_colocated_verl_omni",
                        PAPER_VS_VERL_OMNI["range"], homogeneous))
    out = []
    for source, key, metric, paper_range, rs in figures:
        values = [r[metric] for r in rs]
        mean = sum(values) / len(values)
        check = paper_check(mean, paper_range)
        held_out = not (key == "vs_colocated" and [r["scenario"] for r in rs] == [calibration["figure"]])
        out.append({"figure": source, "paper_key": key, "metric": metric, "scenarios": [r["scenario"] for r in rs],
                    "paper": list(paper_range), "simulated_range": [min(values), max(values)], "simulated_mean": mean,
                    "range_overlap": min(values) <= paper_range[1] and max(values) >= paper_range[0],
                    "error_vs_midpoint": check["error_vs_midpoint"], "distance_to_range": check["distance_to_range"],
                    "where": check["where"], "held_out": held_out})
    return out



# ================================================================================ TAG on verl-omni's hybrid engine
HYBRID_FAST_GB_S = ASSUMED_SWITCH_GB_S
"""Bandwidth of the hybrid scenarios' small switch: 10 GB/s per rank, the physical order the alternative calibration
assumes (`ASSUMED_SWITCH_GB_S`; assumption, no source). Per TAG task (`sim.profiles.HybridEngine`): FLUX.1 9.2 s
(1.1 x one sample's generation), HunyuanVideo 13B 11.2 s (0.22 x)."""

HYBRID_SLOW_GB_S = 0.5
"""Bandwidth of the hybrid scenarios' large switch: 0.5 GB/s per rank, the order of the engine-switch bandwidth the
primary calibration fits for colocated verl-omni (`calibrate`: 0.56 GB/s). Assumption: that the hybrid replica's
switch is as slow as that fitted one. Per TAG task: FLUX.1 184 s (22 x one sample's generation), HunyuanVideo 224 s."""

HYBRID_BASES = ("flux.1", "hunyuanvideo-20-0.6")
"""Scenarios with hybrid-engine twins: ``<base>-hybrid`` (`HYBRID_FAST_GB_S`) and ``<base>-hybrid-slow``
(`HYBRID_SLOW_GB_S`). Registered after `PAPER_SUITE`, so the paper suite is unchanged."""

for _base in HYBRID_BASES:
    for _suffix, _gb_s in (("hybrid", HYBRID_FAST_GB_S), ("hybrid-slow", HYBRID_SLOW_GB_S)):
        register_scenario(replace(SCENARIOS[_base], name=f"{_base}-{_suffix}", paper_speedup=None,
                                  hybrid=HybridEngine(_gb_s)))


def scenario_profile(s: Scenario, cluster: ClusterSpec) -> RowCosts:
    """The cost profile a run of ``s`` on ``cluster`` uses (the profile's own costs): with TAG on the hybrid engine
    when ``s.hybrid`` is set and the cluster is disaggregated. Refused when an awake replica does not fit next to the
    trainer state (`sim.profiles.hybrid_row`)."""
    profile = get_profile(s.profile)
    if s.hybrid is None or cluster.mode != "disaggregated":
        return RowCosts(profile, {})
    memory = cluster.pool_memory_gb("trn")
    row = hybrid_row(profile, get_footprint(s.profile), s.hybrid, trainer_ranks=cluster.pools["trn"].size,
                     trainer_memory_gb=memory)
    if not row.info["feasible"]:
        raise ValueError(f"{s.name}: an awake hybrid replica and the trainer state need {row.info['awake_gb']:.1f} GB "
                         f"per trainer rank, more than {USABLE_MEMORY_FRACTION:g} x {memory:g} GB: use more trainer "
                         "ranks or GPUs with more memory, or TAG in the trainer's process (a scenario without hybrid)")
    return row


def hybrid_switch_prior(config: ScheduleConfig, profile: CostProfile) -> CostProfiler | None:
    """The profiler a BTS run with TAG on the hybrid engine starts with: g' (TAG_GEN) seeded with the switch alone.

    The switch can be timed before any TAG: verl-omni already syncs the actor's weights into the colocated replicas
    once at start-up (`on_init_end`, trainer_separate_async.py:166-174), and a wake + sync + sleep there measures
    it. BTS then knows g' >= switch from its first bubble instead of running a probe TAG (`CostProfiler.seed_floor`:
    the first TAG's measurement replaces it). The floor makes a TAG look cheaper, never dearer, than it is, and BTS
    decides ties for skip on it (`schedule.tag.BtsTag`), so a switch the bubbles cannot repay costs no TAG at all
    (unless a longer TAG shortened the model's schedule, a list-scheduling anomaly BTS's model does not exclude).
    None for every other run (the profiler starts empty, as today)."""
    if profile.tag_switch is None or config.tag.policy != "bts" or config.mode != "disaggregated":
        return None
    trainers = config.workers(config.trainer_pool)
    mbs = planner_for(config).microbatches(config.start_step, config.prompts_per_step, config.n,
                                           config.pools[config.generator_pool].size)
    work = -(-len(mbs[-1].samples) // len(trainers))  # the driver estimates g' for this work (`Driver._bubble_context`)
    profiler = CostProfiler()
    profiler.seed_floor(TaskKind.TAG_GEN, config.pools[config.trainer_pool].worker_class, profile.tag_switch_s / work)
    return profiler


HYBRID_ROWS = ("tag off", "BTS in-process", "BTS hybrid fast", "BTS hybrid slow", "BTS hybrid slow, probe")
"""The hybrid suite's rows per base scenario: the ladder's ``+TSP`` (no TAG: every ratio's baseline) and ``+TAG BTS``
configs; TAG in the trainer's process (``tag_overhead``), on the hybrid engine with the small and the large switch
(both starting from `hybrid_switch_prior`), and the large switch without that prior (BTS probes g' with one TAG)."""


def hybrid_suite_row(base: str, row: str, *, jitter: float = 0.0, seed: int = 0) -> RunOutcome:
    """Run one row of `HYBRID_ROWS` for base scenario ``base`` (one of `HYBRID_BASES`)."""
    if row not in HYBRID_ROWS:
        raise ValueError(f"unknown hybrid suite row {row!r}; use one of {list(HYBRID_ROWS)}")
    name = {"BTS hybrid fast": f"{base}-hybrid", "BTS hybrid slow": f"{base}-hybrid-slow",
            "BTS hybrid slow, probe": f"{base}-hybrid-slow"}.get(row, base)
    s = get_scenario(name)
    cluster = ClusterSpec.parse(s.cluster)
    rc = scenario_profile(s, cluster)
    cfg, _ = ladder_configs(s, cluster, rc.profile)["+TSP" if row == "tag off" else "+TAG BTS"]
    o = run_config(cfg, cluster, rc.profile, label=row, jitter=jitter, seed=seed,
                   switch_prior=not row.endswith("probe"))
    o.extra["cost_model"] = dict(rc.info)
    return o


def run_hybrid_suite(*, jitter: float = 0.0, seeds: Sequence[int] = (0,),
                     bases: Sequence[str] = HYBRID_BASES) -> dict[str, Any]:
    """Every row of `HYBRID_ROWS` for every base, once per seed: median makespans, TAG micro-batches and speedups
    (``speedup_vs_tag_off`` = median makespan of ``tag off`` / median makespan of the row)."""
    out: dict[str, Any] = {"suite": "hybrid", "jitter": jitter, "seeds": list(seeds), "bases": {}}
    for base in bases:
        rows: dict[str, Any] = {}
        for row in HYBRID_ROWS:
            runs = [hybrid_suite_row(base, row, jitter=jitter, seed=sd) for sd in seeds]
            rows[row] = {"median_makespan_s": _median([o.makespan for o in runs]),
                         "makespans_s": [o.makespan for o in runs],
                         "median_tag_microbatches": _median([float(o.summary()["tag_microbatches"]) for o in runs]),
                         "cost_model": runs[0].extra["cost_model"]}
        off = rows["tag off"]["median_makespan_s"]
        for r in rows.values():
            r["speedup_vs_tag_off"] = off / r["median_makespan_s"]
        out["bases"][base] = rows
    return out


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


GLOBAL_STD_MODES = ("per-group std", "global std: barrier", "global std: deferred")
"""verl-omni's ``algorithm.global_std`` as a step runs it (``global_std_configs``): ``per-group std``
(``global_std=false``, GAP pipelining), ``barrier`` (the step's updates wait for its last reward: ``pipeline=False``)
and ``deferred`` (updates as groups are scored, the optimizer steps wait for the last reward:
``opt_waits_for_step``). The simulator does not model the deferred path's late UPDATEs of the samples the clamp may
touch (they re-run their micro-batch before the optimizer step): its row is the bound with none of them."""


def global_std_configs(cfg: ScheduleConfig) -> dict[str, ScheduleConfig]:
    """The three ways of ``GLOBAL_STD_MODES`` to run the disaggregated config ``cfg``."""
    return {"per-group std": cfg, "global std: barrier": replace(cfg, pipeline=False),
            "global std: deferred": replace(cfg, opt_waits_for_step=True)}


def run_global_std_suite(*, costs: Sequence[str] = COSTS, mini_batches: Sequence[int] = (1, 2),
                         scenarios: Sequence[str] = PAPER_SUITE, row: str = "digenrl") -> list[dict[str, Any]]:
    """For every scenario, cost setting and optimizer steps per global step (verl-omni's recipes: 1 or, mostly,
    2: ``ppo_mini_batch_size`` = half of ``data.train_batch_size``), the makespan of ladder row ``row`` under each
    of ``GLOBAL_STD_MODES``, and what the barrier costs / the deferred scaling recovers (ratios over the per-group
    row)."""
    out = []
    for name in scenarios:
        s = SCENARIOS[name]
        cluster = ClusterSpec.parse(s.cluster)
        profile = get_profile(s.profile) if s.hybrid is None else scenario_profile(s, cluster).profile
        base, cl = ladder_configs(s, cluster, profile)[row]
        for cost in costs:
            for k in mini_batches:
                spans = {mode: run_row(row, s, cfg, cl, costs_named(cost)).makespan
                         for mode, cfg in global_std_configs(replace(base, mini_batches_per_step=k)).items()}
                piped, barrier, deferred = (spans[m] for m in GLOBAL_STD_MODES)
                out.append({"scenario": name, "costs": cost, "mini_batches_per_step": k, "row": row,
                            "makespan_s": spans, "barrier_over_per_group": barrier / piped,
                            "deferred_over_per_group": deferred / piped, "barrier_over_deferred": barrier / deferred})
    return out
