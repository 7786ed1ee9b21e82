"""BTS search time: ``python -m digenrl_verl.bench bts [--json] [--repeat R] [--scale]``.

Grid: B in {8, 32, 128} micro-batches x update/generation ratio t/g in {0.1, 0.5, 1.0}, at the start of a
step (the largest search a step needs), with a cold solver (empty memo) each repetition. Costs: g = 1,
scoring 0.05·g, TAG g' = 1.15·g (the profiles' TAG overhead). Target: <= 50 ms for B = 128 at t/g = 0.1.
``--scale`` adds B in {512, 1024} (the 1024-micro-batch scale check, target <= 100 ms per solve).

Times are for the default state budget (``trainer.digenrl.tag.bts_max_states``); ``exact_ms`` is one solve
with no budget (the exact optimum). Each row also reports the decision quality: the predicted makespan
against no TAG and the best static TAG(k) (k swept over 0..B by rollouts of the same model), and
whether the state budget was hit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from digenrl_verl.schedule.bts import BtsCosts, BtsSolver, BtsState, no_tag_policy, rollout, static_policy
from digenrl_verl.schedule.config import TagConfig

GRID_B = (8, 32, 128)
SCALE_B = (512, 1024)
RATIOS = (0.1, 0.5, 1.0)
TARGET_MS = {128: 50.0, 1024: 100.0}


def _row(b: int, ratio: float, repeat: int, max_states: int) -> dict[str, Any]:
    costs = BtsCosts(gen=1.0, score=0.05, update=ratio, tag=1.15)
    state = BtsState(pending=b)
    times, result = [], None
    for _ in range(repeat):
        solver = BtsSolver(costs, max_states=max_states)
        start = time.perf_counter()
        result = solver.solve(state)
        times.append(1000.0 * (time.perf_counter() - start))
    assert result is not None
    start = time.perf_counter()
    exact = BtsSolver(costs, max_states=10**8).solve(state)
    exact_ms = 1000.0 * (time.perf_counter() - start)
    ks = range(b + 1) if b <= 128 else range(0, b + 1, max(1, b // 128))
    best_static = min(rollout(costs, state, static_policy(k)) for k in ks)
    row = {
        "B": b, "ratio": ratio, "ms_min": min(times), "ms_median": statistics.median(times),
        "states": result.states, "pruned": result.pruned, "budget_hit": result.budget_hit,
        "exact_ms": exact_ms, "exact_states": exact.states, "exact_makespan": exact.makespan,
        "makespan": result.makespan, "no_tag_makespan": rollout(costs, state, no_tag_policy()),
        "best_static_makespan": best_static, "tag_now": result.tag_now,
    }
    if b in TARGET_MS and ratio == 0.1:
        row["target_ms"] = TARGET_MS[b]
        row["meets_target"] = row["ms_median"] <= TARGET_MS[b]
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m digenrl_verl.bench bts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scale", action="store_true", help="also B = 512 and 1024")
    parser.add_argument("--max-states", type=int, default=TagConfig().bts_max_states)
    args = parser.parse_args(argv)
    sizes = GRID_B + (SCALE_B if args.scale else ())
    rows = [_row(b, r, args.repeat, args.max_states) for b in sizes for r in RATIOS]
    print(f"{'B':>5} {'t/g':>5} {'ms(min)':>9} {'ms(med)':>9} {'states':>7} {'budget':>6} {'exact ms':>9} "
          f"{'states':>7} {'makespan':>9} {'exact':>9} {'no-TAG':>9} {'static*':>9}")
    for r in rows:
        print(f"{r['B']:>5} {r['ratio']:>5} {r['ms_min']:>9.2f} {r['ms_median']:>9.2f} {r['states']:>7} "
              f"{str(r['budget_hit']):>6} {r['exact_ms']:>9.2f} {r['exact_states']:>7} {r['makespan']:>9.2f} "
              f"{r['exact_makespan']:>9.2f} {r['no_tag_makespan']:>9.2f} {r['best_static_makespan']:>9.2f}")
    headline = next(r for r in rows if r["B"] == 128 and r["ratio"] == 0.1)
    out = {"bench": "bts", "repeat": args.repeat, "max_states": args.max_states, "rows": rows,
           "headline": {"B": 128, "ratio": 0.1, "ms_median": headline["ms_median"], "target_ms": 50.0,
                        "meets_target": headline["meets_target"]}}
    if args.json:
        print(json.dumps(out))
    return 0
