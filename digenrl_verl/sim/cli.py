"""``digenrl-sim``: run the scheduler on a simulated cluster.

Examples::

    digenrl-sim --scenario hunyuanvideo-20-0.6                 # full DigenRL on one scenario
    digenrl-sim --scenario wan2.1 --tag-policy static --tag-static-k 8 --png wan.png --trace wan.json
    digenrl-sim --suite ladder --scenario flux.1 --costs calibrated   # every row of one scenario
    digenrl-sim --suite paper --json                           # every paper-like scenario x {ideal, calibrated}
    digenrl-sim --suite scale --json                           # 1024 GPUs, 1024 micro-batches per step
    digenrl-sim --scenario flux.1-hybrid --png h.png --trace h.json   # TAG on verl-omni's hybrid engine
    digenrl-sim --scenario flux.1 --hybrid-switch-gb-s 2       # the same, at another switch bandwidth
    digenrl-sim --suite hybrid --jitter 0.1 --seeds 7 --json   # tag off / BTS in-process / BTS hybrid, medians
    digenrl-sim --list

Schedule flags are generated from ``ScheduleSettings`` (the dataclass behind ``trainer.digenrl.*``): one flag per
setting, ``--<section>-<field>`` (``--tag-policy``, ``--tcss-staleness``, ``--tsp-enabled`` / ``--no-tsp-enabled``,
``--gap`` / ``--no-gap``, ...), applied on top of full DigenRL (``scenarios.FULL_DIGENRL_SETTINGS``).
With ``--json`` the last line printed is one JSON object. Figures are simulated from modelled costs
(``digenrl_verl.sim.profiles``). ``--suite paper`` runs every scenario twice: ``ideal`` (no colocation cost terms)
and ``calibrated`` (the terms of ``sim.profiles.ColocationCosts``, the unknown one fitted on one paper figure); each
has the rows ``colocated-verl-omni``, ``colocated-best`` and ``digenrl`` (and the ablation ladder between), the key
``digenrl_vs_colocated_best``, and, where the paper reports the scenario, the paper's range; the held-out prediction
errors are under ``predictions``. ``--hybrid-switch-gb-s`` / ``--hybrid-gen-factor`` run TAG on verl-omni's hybrid
engine (``sim.profiles.HybridEngine``: a rollout replica on every trainer rank, woken, synced and put back to sleep by
every TAG micro-batch); ``--suite hybrid`` compares it with TAG off and TAG in the trainer's process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
import warnings
from dataclasses import replace
from typing import Any, Sequence

from digenrl_verl.schedule.config import TCSS_LOSS_FIELDS, ScheduleConfig, ScheduleSettings, TcssConfig
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.profiles import PROFILES, HybridEngine, get_profile
from digenrl_verl.sim.scenarios import (ALTERNATIVE_CALIBRATION, COSTS, DISAGGREGATED_LADDER, FULL_DIGENRL_SETTINGS,
                                        HETERO_TARGET, HYBRID_ROWS, IDEAL_PARITY_TARGET, PAPER_FIGURES, PAPER_SUITE,
                                        PAPER_VS_VERL_OMNI, SCENARIOS, RunOutcome, Scenario, calibrate, costs_named,
                                        get_scenario, paper_check, predictions, ratios, run_config, run_hybrid_suite,
                                        run_global_std_suite, run_ladder, scenario_profile)

EFFICIENCY_TARGET = 0.95
ALTERNATIVE_ROWS = ("colocated-verl-omni", "colocated-best", "+TAG BTS", "digenrl")
"""Rows the alternative calibration runs: what the paper figures compare."""
SCALE = Scenario("scale-1024", "synthetic-scale", "gen=512xH800,trn=512xH800", prompts_per_step=1024, n=16,
                 num_steps=2)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="digenrl-sim", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="hunyuanvideo-20-0.6", help=f"one of {sorted(SCENARIOS)}")
    p.add_argument("--suite", choices=("paper", "ladder", "scale", "hybrid", "global-std"),
                   help="run a suite instead of one config")
    p.add_argument("--costs", choices=COSTS, default="ideal",
                   help="--suite ladder: colocation cost terms off (ideal) or on (calibrated); "
                        "the paper suite runs both")
    p.add_argument("--profile", help="override the scenario's cost profile")
    p.add_argument("--cluster", help="override the cluster, e.g. 'gen=8xH800,trn=8xH800' or 'col=16xH800'")
    _add_settings_flags(p)
    p.add_argument("--prompts", type=int, help="prompts per step")
    p.add_argument("--n", type=int, help="samples per prompt")
    p.add_argument("--steps", type=int, help="global steps")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="a checkpoint barrier every k global steps (the drain costs the profile's checkpoint time)")
    p.add_argument("--mini-batches", type=int, default=1,
                   help="optimizer steps per global step (verl's train_batch_size / ppo_mini_batch_size); divides "
                        "--prompts")
    p.add_argument("--hybrid-switch-gb-s", type=float, metavar="GBS",
                   help="TAG on verl-omni's hybrid engine (a rollout replica on each trainer rank) whose switch (wake, "
                        "weight sync, sleep) moves its bytes at this bandwidth, GB/s per rank; default: the scenario's "
                        "engine (sim.profiles.HybridEngine)")
    p.add_argument("--hybrid-gen-factor", type=float, metavar="F",
                   help="with the hybrid engine: the replica's generation per sample relative to the generator's "
                        "(default 1.0)")
    p.add_argument("--jitter", type=float, default=0.0, help="relative std of task durations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="--suite hybrid: runs per row (seeds --seed, --seed + 1, ...)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--trace", help="write the Chrome/Perfetto trace JSON here (single run, or the ladder's last row)")
    p.add_argument("--png", help="write the Gantt chart PNG here (same run as --trace)")
    p.add_argument("--schedule-text", help="write the schedule's text form here")
    p.add_argument("--list", action="store_true", help="list scenarios and profiles")
    return p


def _setting_paths(cls: type = ScheduleSettings, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, type) of every leaf setting of `cls`, sections expanded (``tag.policy``, ``gap``, ...)."""
    out: list[tuple[str, Any]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += _setting_paths(kind, f"{prefix}{f.name}.")
        elif f.name != "mode":  # the cluster decides the mode
            out.append((prefix + f.name, kind))
    return out


def _flag(path: str) -> str:
    return "--" + path.replace(".", "-").replace("_", "-")


def _parse_optional(kind: Any):
    inner = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]

    def parse(text: str):
        return None if text.lower() in ("none", "null") else inner[0](text)
    return parse


def _add_settings_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("schedule settings (ScheduleSettings; default: full DigenRL)")
    for path, kind in _setting_paths():
        dest = "set:" + path
        if kind is bool or typing.get_args(kind) == (bool, type(None)):
            group.add_argument(_flag(path), dest=dest, action=argparse.BooleanOptionalAction, default=None)
        else:
            group.add_argument(_flag(path), dest=dest, type=_parse_optional(kind), default=None, metavar="V")


def settings_from_flags(args: argparse.Namespace, mode: str) -> ScheduleSettings:
    """Full DigenRL (colocated: the per-timestep baseline) with the flags given applied: the same dataclass the
    trainer's ``trainer.digenrl`` section builds."""
    given = {k.removeprefix("set:"): v for k, v in vars(args).items() if k.startswith("set:") and v is not None}
    for name in TCSS_LOSS_FIELDS:
        if f"tcss.{name}" in given:
            warnings.warn(f"{_flag('tcss.' + name)} has no effect in the simulator: it sets the trainer's loss of "
                          "stale rows, which costs no extra pass", UserWarning, stacklevel=2)
    if mode == "colocated":
        settings = ScheduleSettings(mode="colocated", pipeline=False)
    else:
        settings = ScheduleSettings(mode="disaggregated", **FULL_DIGENRL_SETTINGS)
        if given.get("tcss.staleness") == 0 and "tcss.max_stale_fraction" not in given:
            settings = replace(settings, tcss=TcssConfig())  # no stale fraction without a staleness window
    changes: dict[str, Any] = {}
    for path, value in given.items():
        section, _, name = path.rpartition(".")
        if section:
            changes.setdefault(section, {})[name] = value
        else:
            changes[name] = value
    return replace(settings, **{k: replace(getattr(settings, k), **v) if isinstance(v, dict) else v
                                for k, v in changes.items()})


def _scenario(args: argparse.Namespace) -> Scenario:
    s = get_scenario(args.scenario)
    changes: dict[str, Any] = {}
    if args.profile:
        get_profile(args.profile)
        changes["profile"] = args.profile
    if args.cluster:
        changes["cluster"] = args.cluster
    for key, attr in (("prompts", "prompts_per_step"), ("n", "n"), ("steps", "num_steps")):
        if getattr(args, key) is not None:
            changes[attr] = getattr(args, key)
    hybrid = _hybrid(args, s.hybrid)
    if hybrid != s.hybrid:
        changes["hybrid"] = hybrid
    return replace(s, **changes) if changes else s


def _hybrid(args: argparse.Namespace, engine: HybridEngine | None) -> HybridEngine | None:
    """The scenario's hybrid engine with ``--hybrid-switch-gb-s`` / ``--hybrid-gen-factor`` applied (either flag turns
    it on for a scenario without one; the gen factor alone needs a bandwidth)."""
    gb_s, factor = args.hybrid_switch_gb_s, args.hybrid_gen_factor
    if gb_s is None and factor is None:
        return engine
    if gb_s is None and engine is None:
        raise ValueError("--hybrid-gen-factor needs the hybrid engine's switch bandwidth: add --hybrid-switch-gb-s "
                         "(GB/s per rank), or use a *-hybrid scenario")
    base = engine or HybridEngine(gb_s)
    return HybridEngine(base.switch_gb_s if gb_s is None else gb_s, base.gen_factor if factor is None else factor)


def _single_config(args: argparse.Namespace, s: Scenario, cluster: ClusterSpec) -> ScheduleConfig:
    return ScheduleConfig.of(settings_from_flags(args, cluster.mode), prompts_per_step=s.prompts_per_step, n=s.n,
                             num_steps=s.num_steps, pools=cluster.pools, checkpoint_every=args.checkpoint_every,
                             mini_batches_per_step=args.mini_batches)


def _write_outputs(args: argparse.Namespace, outcome: RunOutcome) -> None:
    trace = outcome.driver.trace
    if args.trace:
        trace.write_chrome(args.trace)
    if args.schedule_text:
        with open(args.schedule_text, "w") as fh:
            fh.write(trace.to_text())
    if args.png:
        from digenrl_verl.viz.gantt import save_gantt

        save_gantt(trace, args.png, title=f"{outcome.label} ({outcome.cluster.describe()})")


def ladder_report(s: Scenario, outcomes: list[RunOutcome], costs: str = "ideal") -> dict[str, Any]:
    """Rows, the headline ratios and the checks of one scenario under one cost setting: the disaggregated ladder
    (naive .. digenrl) is monotone; with calibrated costs, the paper's figures for the scenario."""
    rows = [o.summary() for o in outcomes]
    steps = [o for o in outcomes if o.label in DISAGGREGATED_LADDER]
    violations = [f"{b.label} ({b.makespan:.1f}s) slower than {a.label} ({a.makespan:.1f}s)"
                  for a, b in zip(steps, steps[1:]) if b.makespan > a.makespan * (1 + 1e-9)]
    # the same check on the time after step 0 ended, i.e. once the online profile has measured every cost
    def after0(o: RunOutcome) -> float:
        return o.makespan - o.steps[0].end

    steady = [f"{b.label} slower than {a.label} after step 0 ({after0(b):.1f}s vs {after0(a):.1f}s)"
              for a, b in zip(steps, steps[1:]) if after0(b) > after0(a) * (1 + 1e-9)]
    full = next(o for o in outcomes if o.label == "digenrl")
    out: dict[str, Any] = {
        "scenario": s.name, "costs": costs, "profile": s.profile, "cluster": s.cluster,
        "prompts_per_step": s.prompts_per_step, "n": s.n, "num_steps": s.num_steps, "rows": rows, **ratios(outcomes),
        "monotone": not violations, "violations": violations,
        "monotone_after_step0": not steady, "violations_after_step0": steady,
        "full_efficiency": full.efficiency, "full_speedup_vs_naive": full.extra.get("speedup_vs_naive"),
        "paper_speedup_vs_naive": s.paper_speedup,
    }
    homogeneous = len(ClusterSpec.parse(s.cluster).speeds) == 1
    if costs == "calibrated":
        paper = PAPER_FIGURES.get(s.name)
        if paper is not None:
            out["paper"] = dict(paper)
            out["paper_check"] = {"vs_colocated": paper_check(out["digenrl_vs_colocated_best"],
                                                              paper["vs_colocated"])}
            if "vs_colocated_without_tcss" in paper:
                out["paper_check"]["vs_colocated_without_tcss"] = paper_check(
                    out["digenrl_without_tcss_vs_colocated_best"], paper["vs_colocated_without_tcss"])
        if homogeneous and "digenrl_vs_colocated_verl_omni" in out:
            out["paper_vs_verl_omni"] = dict(PAPER_VS_VERL_OMNI)
            out.setdefault("paper_check", {})["vs_colocated_verl_omni"] = paper_check(
                out["digenrl_vs_colocated_verl_omni"], PAPER_VS_VERL_OMNI["range"])
    return out


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    try:
        import io

        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        return "\n".join([title, fmt.format(*header)] + [fmt.format(*r) for r in rows])
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*[str(x) for x in r])
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=False).print(table)
    return buf.getvalue().rstrip()


def _fmt_range(r: Sequence[float] | None) -> str:
    return f"{r[0]:.2f}-{r[1]:.2f}" if r else "-"


def _fmt_hetero(hetero: dict[str, dict[str, float]]) -> str:
    return "; ".join(name + " " + ", ".join(f"{k} {v:.2f}x" for k, v in by.items()) for name, by in hetero.items())


def _print_predictions(title: str, calibration: dict[str, Any], preds: Sequence[dict[str, Any]]) -> None:
    fixed = "".join(f", {k} = {v:g}" for k, v in calibration["fixed"].items())
    print(f"calibration: {calibration['parameter']} = {calibration['value']:.3g}{fixed} fits "
          f"{calibration['figure']} to {calibration['reached']:.3f}x (target {calibration['target']:.3f}x, paper "
          f"{_fmt_range(calibration['paper_range'])}{', at the bound' if calibration['at_bound'] else ''})")
    print(_table(title, ["figure", "metric", "held out", "paper", "simulated", "error vs mid", "where"],
                 [[p["figure"].split(": ", 1)[-1][:48], p["metric"], str(p["held_out"]), _fmt_range(p["paper"]),
                   _fmt_range(p["simulated_range"]), f"{p['error_vs_midpoint']:+.1%}", p["where"]] for p in preds]))


def _alternative_calibration(args: argparse.Namespace) -> dict[str, Any]:
    """The paper figures under `ALTERNATIVE_CALIBRATION` (the colocated generator's slowdown fitted on the same
    figure, the switch at an assumed bandwidth): the rows the predictions need, every scenario."""
    costs, calibration = calibrate(unknown=ALTERNATIVE_CALIBRATION)
    reports = [ladder_report(SCENARIOS[name], run_ladder(SCENARIOS[name], costs=costs, jitter=args.jitter,
                                                         seed=args.seed, labels=ALTERNATIVE_ROWS), "calibrated")
               for name in PAPER_SUITE]
    return {"calibration": calibration, "costs": dataclasses.asdict(costs), "rows": list(ALTERNATIVE_ROWS),
            "predictions": predictions(reports, calibration),
            "digenrl_vs_colocated_best": {r["scenario"]: r["digenrl_vs_colocated_best"] for r in reports},
            "digenrl_without_tcss_vs_colocated_best": {r["scenario"]: r["digenrl_without_tcss_vs_colocated_best"]
                                                       for r in reports},
            "digenrl_vs_colocated_verl_omni": {r["scenario"]: r["digenrl_vs_colocated_verl_omni"] for r in reports}}


def _run_suite_paper(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    calibrated, calibration = calibrate()
    reports = []
    for name in tqdm(PAPER_SUITE, desc="scenarios", file=sys.stderr, disable=None):
        for costs in COSTS:
            outcomes = run_ladder(SCENARIOS[name], costs=costs_named(costs), jitter=args.jitter, seed=args.seed)
            reports.append(ladder_report(SCENARIOS[name], outcomes, costs))
    header = ["scenario", "costs", "verl-omni s", "col-best s", "digenrl s", "digenrl/col-best",
              "digenrl/verl-omni", "paper vs colocated", "where"]
    rows = []
    for r in reports:
        by = {row["label"]: row for row in r["rows"]}
        check = r.get("paper_check", {}).get("vs_colocated")
        rows.append([r["scenario"], r["costs"], f"{by['colocated-verl-omni']['makespan_s']:.0f}",
                     f"{by['colocated-best']['makespan_s']:.0f}", f"{by['digenrl']['makespan_s']:.0f}",
                     f"{r['digenrl_vs_colocated_best']:.3f}x", f"{r['digenrl_vs_colocated_verl_omni']:.2f}x",
                     _fmt_range(r.get("paper", {}).get("vs_colocated")), check["where"] if check else "-"])
    print(_table("speedups of full DigenRL (simulated; 'x' = baseline makespan / DigenRL makespan)", header, rows))
    preds = predictions(reports, calibration)
    _print_predictions("paper figures: calibration and held-out predictions", calibration, preds)
    alternative = _alternative_calibration(args)
    _print_predictions("alternative model (colocated generator slowdown fitted): held-out predictions",
                       alternative["calibration"], alternative["predictions"])
    ideal_homog = [r for r in reports if r["costs"] == "ideal" and len(ClusterSpec.parse(r["cluster"]).speeds) == 1]
    parity = min(r["digenrl_vs_colocated_best"] for r in ideal_homog)
    hetero: dict[str, dict[str, float]] = {}
    for r in reports:
        if len(ClusterSpec.parse(r["cluster"]).speeds) > 1:
            hetero.setdefault(r["scenario"], {})[r["costs"]] = r["digenrl_vs_colocated_best"]
    effs = [r["full_efficiency"] for r in reports]
    out = {
        "suite": "paper", "costs": list(COSTS), "scenarios": reports, "calibration": calibration,
        "calibrated_costs": dataclasses.asdict(calibrated), "predictions": preds,
        "alternative_calibration": alternative,
        "ideal_parity_target": IDEAL_PARITY_TARGET, "ideal_min_digenrl_vs_colocated_best": parity,
        "ideal_below_parity_target": {r["scenario"]: r["digenrl_vs_colocated_best"] for r in ideal_homog
                                      if r["digenrl_vs_colocated_best"] < IDEAL_PARITY_TARGET},
        "hetero_target": HETERO_TARGET, "hetero_digenrl_vs_colocated_best": hetero,
        "efficiency_target": EFFICIENCY_TARGET,
        "all_efficiency_at_least_target": all(e >= EFFICIENCY_TARGET for e in effs),
        "min_full_efficiency": min(effs), "all_monotone": all(r["monotone"] for r in reports),
        "all_monotone_after_step0": all(r["monotone_after_step0"] for r in reports),
        "violations": {f"{r['scenario']} ({r['costs']})": r["violations"] for r in reports if r["violations"]},
    }
    print(f"ideal homogeneous: min digenrl/colocated-best {parity:.3f} (target {IDEAL_PARITY_TARGET}); "
          f"heterogeneous: {_fmt_hetero(hetero)} (target {HETERO_TARGET})")
    for key, vs in out["violations"].items():
        for v in vs:
            print(f"ladder not monotone in {key}: {v}")
    return out


def _ladder_table(s: Scenario, outcomes: list[RunOutcome], costs: str = "ideal") -> str:
    header = ["row", "makespan s", "samples/s", "x naive", "LB s", "LB/makespan", "util", "TAG mb", "stale"]
    rows = []
    for o in outcomes:
        m = o.summary()
        rows.append([o.label, f"{o.makespan:.1f}", f"{o.samples_per_s:.3f}", f"{m['speedup_vs_naive']:.2f}",
                     f"{o.bound.value:.1f}", f"{o.efficiency:.3f}", f"{m['utilisation']:.3f}",
                     str(m["tag_microbatches"]), str(m["stale_samples"])])
    return _table(f"{s.name} ({costs} costs): {s.profile} on {s.cluster}, {s.prompts_per_step}x{s.n} per step, "
                  f"{s.num_steps} steps", header, rows)


def _run_scale(args: argparse.Namespace) -> dict[str, Any]:
    s = SCALE if args.steps is None else replace(SCALE, num_steps=args.steps)
    cluster, profile = ClusterSpec.parse(s.cluster), get_profile(s.profile)
    cfg = ScheduleConfig(mode="disaggregated", pools=cluster.pools, prompts_per_step=s.prompts_per_step, n=s.n,
                         num_steps=s.num_steps, **FULL_DIGENRL_SETTINGS)
    o = run_config(cfg, cluster, profile, label="scale", jitter=args.jitter, seed=args.seed, record_decisions=False)
    summary = o.summary()
    _write_outputs(args, o)
    print(f"{s.name}: {cluster.total_ranks} GPUs, {len(o.driver.lanes)} generator lanes, "
          f"{o.steps[0].microbatches} micro-batches per step, {s.num_steps} steps")
    print(f"driver: {summary['decisions']} decisions, {summary['driver_ms_per_decision']:.3f} ms per decision "
          f"(target <= 1 ms); BTS: {summary['bts_solves']} solves, max {summary['bts_max_ms']:.1f} ms, "
          f"mean {summary['bts_mean_ms']:.2f} ms (target <= 100 ms); LB/makespan {o.efficiency:.3f}")
    return {"suite": "scale", "scenario": s.name, "gpus": cluster.total_ranks, "lanes": len(o.driver.lanes),
            "microbatches_per_step": o.steps[0].microbatches, **summary,
            "driver_target_ms": 1.0, "bts_target_ms": 100.0,
            "driver_ok": summary["driver_ms_per_decision"] <= 1.0, "bts_ok": summary["bts_max_ms"] <= 100.0}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        print("scenarios:", ", ".join(sorted(SCENARIOS)))
        print("profiles: ", ", ".join(sorted(PROFILES)))
        return 0
    try:
        hybrid_flags = args.hybrid_switch_gb_s is not None or args.hybrid_gen_factor is not None
        if hybrid_flags and args.suite in ("paper", "scale", "hybrid", "global-std"):
            raise ValueError(f"--hybrid-switch-gb-s / --hybrid-gen-factor apply to one scenario (a single run or "
                             f"--suite ladder), not to --suite {args.suite}")
        if args.suite == "paper":
            out = _run_suite_paper(args)
        elif args.suite == "scale":
            out = _run_scale(args)
        elif args.suite == "hybrid":
            out = run_hybrid_suite(jitter=args.jitter, seeds=range(args.seed, args.seed + max(1, args.seeds)))
            print(_hybrid_table(out))
        elif args.suite == "global-std":
            out = {"suite": "global-std", "rows": run_global_std_suite()}
            print(_global_std_table(out["rows"]))
        elif args.suite == "ladder":
            s = _scenario(args)
            outcomes = run_ladder(s, costs=costs_named(args.costs), jitter=args.jitter, seed=args.seed)
            print(_ladder_table(s, outcomes, args.costs))
            _write_outputs(args, outcomes[-1])
            out = {"suite": "ladder", **ladder_report(s, outcomes, args.costs)}
        else:
            s = _scenario(args)
            cluster = ClusterSpec.parse(s.cluster)
            cfg = _single_config(args, s, cluster)
            rc = scenario_profile(s, cluster)
            o = run_config(cfg, cluster, rc.profile, label="run", jitter=args.jitter, seed=args.seed)
            _write_outputs(args, o)
            print(_single_table(s, o))
            out = {"scenario": s.name, "cluster": cluster.describe(), "config": _config_dict(cfg), **o.summary()}
            if rc.info:
                out["tag_engine"] = rc.info
    except ValueError as exc:
        print(f"digenrl-sim: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, default=str))
    return 0


def _single_table(s: Scenario, o: RunOutcome) -> str:
    m = o.summary()
    rows = [[f"{o.makespan:.1f}", f"{o.samples_per_s:.3f}", f"{o.bound.value:.1f}", f"{o.efficiency:.3f}",
             f"{m['utilisation']:.3f}", str(m["tag_microbatches"]), str(m["stale_samples"]),
             f"{m['driver_ms_per_decision']:.3f}"]]
    header = ["makespan s", "samples/s", "LB s", "LB/makespan", "util", "TAG mb", "stale", "driver ms/dec"]
    return _table(f"{s.name}: {s.profile} on {s.cluster}", header, rows)


def _global_std_table(rows: list[dict[str, Any]]) -> str:
    header = ["scenario", "costs", "opt steps", "per-group s", "barrier s", "deferred s", "barrier/per-group",
              "barrier/deferred"]
    body = [[r["scenario"], r["costs"], str(r["mini_batches_per_step"]),
             *(f"{r['makespan_s'][m]:.0f}" for m in ("per-group std", "global std: barrier", "global std: deferred")),
             f"{r['barrier_over_per_group']:.3f}x", f"{r['barrier_over_deferred']:.3f}x"] for r in rows]
    return _table("algorithm.global_std (simulated, full DigenRL row): the barrier vs deferred scaling; 'x' = "
                  "makespan ratio", header, body)


def _hybrid_table(out: dict[str, Any]) -> str:
    header = ["scenario", "row", "median makespan s", "x tag off", "TAG mb (median)", "switch s / TAG"]
    rows = []
    for base, by in out["bases"].items():
        for label in HYBRID_ROWS:
            r = by[label]
            switch = r["cost_model"].get("switch_s")
            rows.append([base, label, f"{r['median_makespan_s']:.1f}", f"{r['speedup_vs_tag_off']:.3f}",
                         f"{r['median_tag_microbatches']:g}", "-" if switch is None else f"{switch:.1f}"])
    return _table(f"TAG on verl-omni's hybrid engine (simulated; 'x tag off' = tag-off median makespan / row median; "
                  f"jitter {out['jitter']:g}, {len(out['seeds'])} seed(s))", header, rows)


def _config_dict(cfg: ScheduleConfig) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    out["pools"] = {k: {"size": v.size, "worker_class": v.worker_class} for k, v in cfg.pools.items()}
    return out


if __name__ == "__main__":
    sys.exit(main())
