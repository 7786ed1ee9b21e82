"""Pre-flight of a test tier: import every module that the tier's test files import when they are imported (`import
x`, `from x import y`, also inside if / try blocks, where a failed import used to turn into a module-level skip), in
this interpreter, before pytest starts; exit 1 naming each one that fails. Relative imports are left to pytest; the
helper modules beside the tests (tests/_upstream.py, tests/verl_omni/_engine_harness.py) are left to pytest too.

    python scripts/tier_preflight.py tests/verl_omni [more folders or files]
    python scripts/tier_preflight.py "--banner=venv: vllm {vllm.__version__}" tests/contract   # also prints the line

`--banner=TEMPLATE`: the modules the template names (`{vllm.__version__}`) are imported first and the line is printed
with them (the tier's versions, from this interpreter: one import of the stack instead of two).
"""

from __future__ import annotations

import ast
import importlib
import string
import sys
import traceback
from pathlib import Path


def _module_level(nodes: list[ast.stmt]):
    """The statements that run when the module is imported: the body, into if / try / with blocks, not into defs."""
    for node in nodes:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                yield from _module_level(block)
            for handler in getattr(node, "handlers", []):
                yield from _module_level(handler.body)


def imported_modules(path: Path) -> set[str]:
    """The absolute module names `path` imports when it is imported (for `from a.b import c`: `a.b`, and `a.b.c`,
    which is a module or an attribute). Imports inside a test function fail that test when they break."""
    names: set[str] = set()
    for node in _module_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def test_files(args: list[str]) -> list[Path]:
    files: list[Path] = []
    for arg in args:
        p = Path(arg.split("::")[0])
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p] if p.suffix == ".py" else [])
    return files


def with_sibling_imports(files: list[Path]) -> list[Path]:
    """`files` and, transitively, the test modules beside them that they import by name (a test module importing
    another's helpers, as pytest's importlib mode lets it): their imports are checked too, and they are not imported
    here (they import the helpers that tests/conftest.py registers)."""
    files, todo = list(files), list(files)
    while todo:
        path = todo.pop()
        for name in imported_modules(path):
            sibling = path.resolve().parent / f"{name.split('.')[0]}.py"
            if name.split(".")[0].startswith("test_") and sibling.exists() and sibling not in map(Path.resolve, files):
                files.append(sibling)
                todo.append(sibling)
    return files


def banner(template: str) -> str:
    """`template` formatted with the modules its fields name (`{vllm.__version__}` imports vllm)."""
    names = {f.split(".")[0].split("[")[0] for _, f, _, _ in string.Formatter().parse(template) if f}
    return template.format(**{n: importlib.import_module(n) for n in names})


def main(argv: list[str]) -> int:
    for arg in argv:
        if arg.startswith("--banner="):
            print(banner(arg.removeprefix("--banner=")), flush=True)
    files = with_sibling_imports(test_files([a for a in argv if not a.startswith("-")]))
    local = {f.stem for f in files}
    # the helper modules, importable as the tests import them: tests/<name>.py registered by tests/conftest.py, and the
    # tier's folder, which its modules append to sys.path
    for helper in Path(__file__).resolve().parents[1].joinpath("tests").glob("_*.py"):
        local.add(helper.stem)
    for folder in sorted({f.resolve().parent for f in files}):
        sys.path.append(str(folder))
    wanted = sorted({m for f in files for m in imported_modules(f)} - local)
    failed: dict[str, str] = {}
    for name in wanted:
        if name.split(".")[0] in local or any(name.startswith(f"{f}.") for f in failed):
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            parent = name.rpartition(".")[0]
            if parent and e.name == name and parent in sys.modules:  # `from a.b import c`: c may be an attribute
                if hasattr(sys.modules[parent], name.rpartition(".")[2]):
                    continue
                failed[name] = f"ImportError: {parent} has no module or attribute {name.rpartition('.')[2]!r}"
                continue
            failed[name] = traceback.format_exception_only(e)[-1].strip()
        except Exception as e:  # noqa: BLE001  (any import-time failure is what the pre-flight reports)
            failed[name] = traceback.format_exception_only(e)[-1].strip()
    for name, why in failed.items():
        print(f"pre-flight: cannot import {name}: {why}", file=sys.stderr)
    print(f"pre-flight: {len(failed)} of the {len(wanted)} modules that {len(files)} test files import failed"
          if failed else f"pre-flight: the {len(wanted)} modules that {len(files)} test files import are importable",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
