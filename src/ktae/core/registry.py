"""Name -> function registries, so that a trainer picks an estimator from a config string."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A small named registry of pure functions (``@REGISTRY.register("name")``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise ValueError(f"unknown {self.kind} {name!r}; expected one of: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
