"""Benchmarks: `python -m digenrl_verl.bench <name> [--json]`.

Each benchmark is a module `digenrl_verl.bench.<name>` with `main(argv: list[str]) -> int`. With `--json`
the last line of its output is one JSON object with the figures and the config that produced them.
Speed goals live here, never in timed tests.
"""

BENCHMARKS: dict[str, str] = {
    "tsp": "digenrl_verl.bench.tsp",
    "bts": "digenrl_verl.bench.bts",
    "e2e": "digenrl_verl.bench.e2e",
    "driver": "digenrl_verl.bench.driver",
    "tcss": "digenrl_verl.bench.tcss",
    "global_std": "digenrl_verl.bench.global_std",
    "rollout": "digenrl_verl.bench.rollout",
}
