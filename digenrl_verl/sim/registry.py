"""A named registry for the simulator's profiles and scenarios: rejects duplicates, lists names on a miss."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class NamedRegistry(dict, Generic[T]):
    """`name -> item`; `what` names the kind of item in error messages (e.g. "cost profile")."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def register(self, name: str, item: T) -> T:
        if name in self:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self[name] = item
        return item

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            raise ValueError(f"unknown {self.what} {name!r}; valid names: {sorted(self)}") from None
