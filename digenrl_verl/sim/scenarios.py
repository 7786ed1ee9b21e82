"""Paper-like scenarios, the ablation ladder, and one function that runs a config in the simulator.

The ladder (each row adds one mechanism to the previous one; colocated is the reference row):

=================  ==========================================================================
colocated          all ranks generate the batch, score it, then update (per-timestep loop)
naive              disaggregated, batch-axis micro-batches, full-batch barrier, per-timestep loop
+GAP               generation-axis micro-batches, updates pipelined as micro-batches are scored
+TSP               time-step-parallel updates (cheaper per micro-batch)
+TAG static        the trainer generates k micro-batches per step, k = round(x*) of the LP bound
+TAG BTS           bubble-aware TAG search instead of a fixed k
+TCSS              staleness window 1 (at most ``TCSS_FRACTION`` of a step's samples stale)
=================  ==========================================================================

The paper's reported speedups over naive disaggregation are quoted next to ours for reference only:
our costs are modelled (see ``sim.profiles``), not measured on the paper's hardware.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from digenrl_verl.schedule.bounds import Bound, StepCosts, colocated_lower_bound, run_lower_bound
from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig, TspConfig
from digenrl_verl.schedule.driver import Driver, StepResult
from digenrl_verl.schedule.plan import make_planner, split_even
from digenrl_verl.schedule.tag import BtsTag
from digenrl_verl.schedule.trace import TraceMetrics
from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import Fault, SimExecutor
from digenrl_verl.sim.profiles import CostProfile, get_profile
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
    """

    name: str
    profile: str
    cluster: str
    prompts_per_step: int = 32
    n: int = 8
    num_steps: int = 4
    paper_speedup: str | None = None


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
# Sec. 5.4-like heterogeneous 8+8: generators on a slower class than the trainers (speed is assumed).
register_scenario(Scenario("hetero-8+8", "hunyuanvideo-20-0.6", "gen=8xA800@0.6,trn=8xH800"))

PAPER_SUITE = tuple(SCENARIOS)
LADDER = ("colocated", "naive", "+GAP", "+TSP", "+TAG static", "+TAG BTS", "+TCSS")


def get_scenario(name: str) -> Scenario:
    return SCENARIOS.lookup(name)


def step_costs(config: ScheduleConfig, cluster: ClusterSpec, profile: CostProfile) -> StepCosts:
    """The true per-micro-batch costs of ``config`` on ``cluster`` (for the lower bound)."""
    planner = make_planner(config.gap)
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
    first = min(w for ws in lane_works for w in ws) * (unit(TaskKind.GEN) + unit(TaskKind.SCORE)) / gen_speed
    if config.tag.policy != "off":  # the trainer may start with a TAG instead of waiting for the generators
        first = min(first, unit(TaskKind.TAG_GEN) * min(trn_works) / trn_speed)
    return StepCosts(
        microbatches=len(mbs),
        lane_gen=tuple(unit(TaskKind.GEN) * w / gen_speed for w in lane_work),
        lane_score=tuple(unit(TaskKind.SCORE) * w / gen_speed for w in lane_work),
        update=unit(TaskKind.UPDATE, config.tsp.enabled) * trn_work / trn_speed,
        tag=None if config.tag.policy == "off" else unit(TaskKind.TAG_GEN) * trn_work / trn_speed,
        opt=unit(TaskKind.OPT_STEP) / trn_speed,
        sync=0.0 if config.mode == "colocated" else unit(TaskKind.SYNC) / min(gen_speed, trn_speed),
        last_update=unit(TaskKind.UPDATE, config.tsp.enabled) * min(trn_works) / trn_speed,
        first_gen=first,
        tag_ratio=None if config.tag.policy == "off" else max(
            (unit(TaskKind.GEN) / gen_speed) / sum(1.0 / w for w in lws_i) / (unit(TaskKind.TAG_GEN) * tw / trn_speed)
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
               record_decisions: bool = True) -> RunOutcome:
    """Run ``config`` in the simulator and measure it."""
    executor = SimExecutor(cluster, profile, jitter=jitter, seed=seed, faults=faults)
    driver = Driver(config, executor)
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
    """The ablation ladder's configs for a scenario (see the module docstring)."""
    base = dict(prompts_per_step=s.prompts_per_step, n=s.n, num_steps=s.num_steps)
    col = cluster.colocated()
    per_timestep, batched = TspConfig(enabled=False), TspConfig(enabled=True)
    out: dict[str, tuple[ScheduleConfig, ClusterSpec]] = {
        "colocated": (ScheduleConfig(mode="colocated", pools=col.pools, gap=False, pipeline=False, tsp=per_timestep,
                                     **base), col),
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
    tcss = disaggregated(**FULL_DIGENRL_SETTINGS)
    for name, cfg in (("naive", naive), ("+GAP", gap), ("+TSP", tsp), ("+TAG static", static),
                      ("+TAG BTS", bts), ("+TCSS", tcss)):
        out[name] = (cfg, cluster)
    return out


def run_ladder(s: Scenario, *, jitter: float = 0.0, seed: int = 0) -> list[RunOutcome]:
    profile = get_profile(s.profile)
    cluster = ClusterSpec.parse(s.cluster)
    outcomes = []
    for label, (cfg, cl) in ladder_configs(s, cluster, profile).items():
        outcome = run_config(cfg, cl, profile, label=label, jitter=jitter, seed=seed)
        if cfg.tag.policy == "static":
            outcome.extra["static_k"] = cfg.tag.static_k
        outcomes.append(outcome)
    naive = next(o for o in outcomes if o.label == "naive")
    for o in outcomes:
        o.extra["speedup_vs_naive"] = naive.makespan / o.makespan
    return outcomes
