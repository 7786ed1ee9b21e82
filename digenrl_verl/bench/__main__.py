"""Dispatch `python -m digenrl_verl.bench <name> ...` to the benchmark module of that name."""

from __future__ import annotations

import importlib
import sys

from digenrl_verl.bench import BENCHMARKS


def usage() -> str:
    names = "\n".join(f"  {name:<8} (module {module}; its options: python -m digenrl_verl.bench {name} --help)"
                      for name, module in sorted(BENCHMARKS.items()))
    return f"usage: python -m digenrl_verl.bench <name> [--json] [options]\n\nbenchmarks:\n{names}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in BENCHMARKS:
        got = repr(argv[0]) if argv else "nothing"
        print(f"usage: python -m digenrl_verl.bench <name> [--json]; got {got}, valid names: {sorted(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
