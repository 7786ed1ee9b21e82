"""Run a callback on a module right after its code runs, in whichever process imports it (the post-import idiom
verl-omni uses for vLLM's fused-MoE alias), without importing it ahead of time.

verl and verl-omni import their heavy modules (vLLM, the rollout workers, the engines) only where a process needs
them; a registration or a small fix on such a module must not pull it into every process that imports verl. So
`after_import(name, callback)` runs `callback(module)` at once where ``name`` is already imported, else installs one
meta-path finder that wraps that module's loader when it is first imported (each watched name once; the finder leaves
``sys.meta_path`` when nothing is left to watch)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

Callback = Callable[[object], None]


class _RunAfterExec(importlib.abc.Loader):
    """A watched module's real loader, then its callbacks on the module it filled."""

    def __init__(self, loader: importlib.abc.Loader, callbacks: list[Callback]) -> None:
        self.loader = loader
        self.callbacks = callbacks

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        for callback in self.callbacks:
            callback(module)

    def __getattr__(self, name: str):  # get_source, get_filename, ...: the real loader's
        return getattr(self.loader, name)


class _WatchFinder(importlib.abc.MetaPathFinder):
    """Finds the watched modules with the other finders and wraps their loaders."""

    def __init__(self) -> None:
        self.watched: dict[str, list[Callback]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.watched:
            return None
        callbacks = self.watched.pop(fullname)
        if not self.watched:
            sys.meta_path.remove(self)
        spec = self._find_with_the_others(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RunAfterExec(spec.loader, callbacks)
        return spec

    def _find_with_the_others(self, fullname: str):
        present = self in sys.meta_path
        if present:
            sys.meta_path.remove(self)
        try:
            return importlib.util.find_spec(fullname)
        finally:
            if present:
                sys.meta_path.insert(0, self)


def _finder() -> _WatchFinder:
    for finder in sys.meta_path:
        if isinstance(finder, _WatchFinder):
            return finder
    finder = _WatchFinder()
    sys.meta_path.insert(0, finder)
    return finder


def after_import(name: str, callback: Callback) -> None:
    """`callback(module)` once module ``name`` is imported: now if it is, else right after its code runs (a callback
    already waiting for that module is not added twice)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    callbacks = _finder().watched.setdefault(name, [])
    if callback not in callbacks:
        callbacks.append(callback)
