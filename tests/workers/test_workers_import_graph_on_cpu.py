"""The package's import graph runs down the layers only. Every module is parsed with `ast` (nothing is imported),
and every import statement counts: top level, function-local, under `if TYPE_CHECKING`.

Layers, bottom up: `schedule` (pure Python) | `weights` (torch only) | `diffusion`, `models`, `rewards` |
`engines` (rollout engines) | `workers` | `trainer`, `sim` | entry points (`main`, `integrations`, `bench`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import digenrl_verl

PACKAGE_DIR = Path(digenrl_verl.__file__).parent
#: what sits on top: the CLIs (`python -m digenrl_verl.main`, `python -m digenrl_verl.bench ...`) and the host plugin
ENTRY_POINTS = ("digenrl_verl.main", "digenrl_verl.integrations", "digenrl_verl.bench")
CONFIG_MODULE = "digenrl_verl.trainer.config"
#: engine modules the config may import: the registry and the specs (everything else there is a backend)
ENGINE_FRONT = ("digenrl_verl.engines", "digenrl_verl.engines.base", "digenrl_verl.engines.spec")
BACKEND_PACKAGES = ("vllm", "vllm_omni")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module an import statement of `source` names, anywhere in the file. `from a import b` names `a`, and
    `a.b` too when that is a module of the project; relative imports are resolved against `module`."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if is_project_module(f"{base}.{a.name}"))
    return out


def is_project_module(name: str) -> bool:
    """`name` is a module or package of this project (a file or directory under the package)."""
    if not within(name, "digenrl_verl"):
        return False
    path = PACKAGE_DIR.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_graph() -> dict[str, set[str]]:
    return {module_name(p): imported_modules(p.read_text(), module_name(p), p.name == "__init__.py")
            for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(graph: dict[str, set[str]], importer: str, forbidden) -> list[str]:
    """`module -> import` pairs of modules under `importer` whose imports satisfy `forbidden`."""
    return sorted(f"{m} -> {i}" for m, imports in graph.items() if within(m, importer)
                  for i in imports if forbidden(i))


GRAPH = package_graph()


def test_the_scanner_sees_function_local_and_relative_imports():
    src = "import os\ndef f():\n    from digenrl_verl.trainer import data\n    from .sharding import X\n"
    found = imported_modules(src, "digenrl_verl.workers.roles")
    assert {"os", "digenrl_verl.trainer", "digenrl_verl.trainer.data", "digenrl_verl.workers.sharding"} <= found
    assert len(GRAPH) > 40 and "digenrl_verl.workers.roles" in GRAPH


def test_workers_never_import_the_trainer():
    assert violations(GRAPH, "digenrl_verl.workers", lambda i: within(i, "digenrl_verl.trainer")) == []


def test_engines_and_weights_sit_below_the_workers():
    above = ("digenrl_verl.workers", "digenrl_verl.trainer", "digenrl_verl.sim", "digenrl_verl.main",
             "digenrl_verl.integrations")
    assert violations(GRAPH, "digenrl_verl.engines", lambda i: any(within(i, a) for a in above)) == []
    assert violations(GRAPH, "digenrl_verl.weights",
                      lambda i: within(i, "digenrl_verl") and not within(i, "digenrl_verl.weights")) == []


def shared_leaves(graph: dict[str, set[str]]) -> set[str]:
    """Top-level modules (not packages) that import nothing of the project, e.g. `digenrl_verl.errors`: the
    bottom of every layer, so any module may import them."""
    return {m for m, imports in graph.items() if m.count(".") == 1 and (PACKAGE_DIR / f"{m.split('.')[1]}.py").is_file()
            and not any(within(i, "digenrl_verl") for i in imports)}


def test_schedule_imports_nothing_of_the_project_outside_schedule():
    leaves = shared_leaves(GRAPH)
    assert violations(GRAPH, "digenrl_verl.schedule",
                      lambda i: within(i, "digenrl_verl") and not within(i, "digenrl_verl.schedule")
                      and i not in leaves) == []


def test_only_entry_points_import_integrations():
    bad = sorted(f"{m} -> {i}" for m, imports in GRAPH.items() if not any(within(m, e) for e in ENTRY_POINTS)
                 for i in imports if within(i, "digenrl_verl.integrations"))
    assert bad == []


def test_config_imports_no_engine_backend():
    """`trainer/config.py` and the `config` package validate `rollout.name` through `RolloutEngineSpec` (the engine
    registry), never by importing an engine backend or vLLM."""
    def backend(i: str) -> bool:
        engine_backend = within(i, "digenrl_verl.engines") and i not in ENGINE_FRONT
        return engine_backend or any(within(i, b) for b in BACKEND_PACKAGES)

    assert CONFIG_MODULE in GRAPH
    bad = [v for importer in (CONFIG_MODULE, "digenrl_verl.config") for v in violations(GRAPH, importer, backend)]
    assert bad == []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The project's import cycles (strongly connected groups of more than one module), each sorted. A module's import
    of its own package (``from digenrl_verl.models import X`` in `models.flux`: the package's facade, which imports
    its modules back) is left out: the package and its modules are one unit."""
    edges = {m: {i for i in imports if i in graph and i != m and not within(m, i)} for m, imports in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components (the graph is ~100 modules deep at most)
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(cycles)


def test_the_cycle_finder_finds_a_cycle_and_ignores_a_package_facade():
    graph = {"digenrl_verl.a": {"digenrl_verl.b"}, "digenrl_verl.b": {"digenrl_verl.a"},
             "digenrl_verl.p": {"digenrl_verl.p.m"}, "digenrl_verl.p.m": {"digenrl_verl.p"}}
    assert import_cycles(graph) == [["digenrl_verl.a", "digenrl_verl.b"]]


def test_no_import_cycle():
    """Every import counts, function-local ones too (a lazy import still ties the two modules together)."""
    assert import_cycles(GRAPH) == []


def test_config_sits_below_the_trainer():
    """The `config` package turns verl-omni's keys into specs: it may import the layers below it (diffusion, models,
    engines' front, workers' specs, schedule), never the trainer or what sits on top of it."""
    above = ("digenrl_verl.trainer", "digenrl_verl.sim", *ENTRY_POINTS)
    assert violations(GRAPH, "digenrl_verl.config", lambda i: any(within(i, a) for a in above)) == []
