"""The paper's Sec. 5.4 shape in the simulator: 8 + 8 GPUs of two kinds, DigenRL vs colocated.

`python -m digenrl_verl.sim.hetero [--json]` (or `bash recipes/sim_hetero_8p8.sh`) runs the `hetero-paper-a+c`
scenario of `digenrl_verl.sim.scenarios` (HunyuanVideo DanceGRPO costs, 20 steps, 60% trained; generators on the
paper's testbed-A GPU, 48 GB at 0.307x the speed of the trainers' testbed-C GPU, 96 GB: `HETERO_PAPER_CLUSTER`), the
same 16 GPUs with the two classes swapped, the same speeds with equal (80 GB) memory (the speed half of
heterogeneity alone), and a homogeneous 8+8 reference of the faster class. For each: the colocated makespan (all 16
ranks in lock-step, so the slower class sets the pace and the smaller memory caps what a rank holds), full DigenRL
(GAP + TSP + TAG/BTS + TCSS) and the gain over `colocated-best` (TSP, rollout log-probs, the cheaper memory mode),
under the calibrated colocation costs (`sim.scenarios.calibrate`) unless ``--costs ideal``.

**Simulated, not measured**: durations come from the modelled cost profiles (`sim.profiles`, assumptions of the
right order for H800-class GPUs); the classes' speed ratio and memory come from a secondary summary of the paper
(`sim.scenarios.HETERO_PAPER_SPEED`). With --json the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any, Sequence

from digenrl_verl.sim.scenarios import COSTS, HETERO_PAPER_SPEED, costs_named, get_scenario, run_ladder

SCENARIO = "hetero-paper-a+c"
_SLOW = f"TestbedA@{HETERO_PAPER_SPEED:.3f}"
CLUSTERS = {
    "slow generators (scenario)": None,  # the scenario's own cluster
    "slow trainers (swapped)": f"gen=8xTestbedC/96,trn=8x{_SLOW}/48",
    "speed only (80 GB each)": f"gen=8x{_SLOW}/80,trn=8xTestbedC/80",
    "homogeneous reference": "gen=8xTestbedC/96,trn=8xTestbedC/96",
}


def hetero_report(scenario: str = SCENARIO, *, num_steps: int | None = None,
                  costs: str = "calibrated") -> dict[str, Any]:
    """Rows of {cluster, colocated_s (colocated-best), digenrl_s, gain} for the scenario and its variants."""
    base = get_scenario(scenario)
    if num_steps is not None:
        base = replace(base, num_steps=num_steps)
    rows = []
    for label, cluster in CLUSTERS.items():
        s = base if cluster is None else replace(base, cluster=cluster)
        outcomes = {o.label: o for o in run_ladder(s, costs=costs_named(costs),
                                                   labels=("colocated-best", "digenrl"))}
        col, full = outcomes["colocated-best"], outcomes["digenrl"]
        rows.append({"label": label, "cluster": s.cluster, "colocated_s": col.makespan, "digenrl_s": full.makespan,
                     "gain_over_colocated": col.makespan / full.makespan,
                     "digenrl_samples_per_s": full.samples_per_s, "colocated_samples_per_s": col.samples_per_s})
    return {"scenario": base.name, "profile": base.profile, "prompts_per_step": base.prompts_per_step, "n": base.n,
            "num_steps": base.num_steps, "costs": costs, "baseline": "colocated-best", "rows": rows,
            "note": "simulated from modelled costs, not measured"}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m digenrl_verl.sim.hetero", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default=SCENARIO)
    p.add_argument("--steps", type=int, default=None, help="global steps (default: the scenario's)")
    p.add_argument("--costs", choices=COSTS, default="calibrated", help="colocation cost terms (default: calibrated)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    report = hetero_report(args.scenario, num_steps=args.steps, costs=args.costs)
    print(f"{report['scenario']} ({report['profile']}, {report['prompts_per_step']} prompts x n={report['n']}, "
          f"{report['num_steps']} steps, {report['costs']} costs) -- {report['note']}")
    for r in report["rows"]:
        print(f"  {r['label']:<28} {r['cluster']:<28} colocated-best {r['colocated_s']:9.1f}s"
              f"  DigenRL {r['digenrl_s']:9.1f}s  gain {r['gain_over_colocated']:.2f}x")
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
