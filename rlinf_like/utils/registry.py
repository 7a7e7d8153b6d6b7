"""Name -> component tables, so a config string picks an algorithm, engine, env, policy or backend, and
a typo names the choices.

A component is registered directly (`@REG.register("name")`) or lazily by import path
(`REG.register("name", "package.module:Attr")`): the module is imported on the first `get`, so a
table can list components whose modules are heavy or need optional stacks without importing them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def import_ref(ref: str) -> Any:
    """What "module:attr" names, its module imported now (lazy entries, and declarations that point at code)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


class UnknownNameError(KeyError, ValueError):
    """A name no component is registered under. A KeyError for table look-ups, a ValueError for
    config checks (which raise ValueError for every bad value)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str, key: str | None = None):
        """`kind` names what is registered ("rollout engine"); `key`, when given, is the config key
        that picks one ("rollout.engine"), and errors name it."""
        self.kind, self.key = kind, key
        self._items: dict[str, T | str] = {}

    def register(self, name: str, target: T | str | None = None) -> Callable[[T], T]:
        """`register(name, obj_or_import_path)`, or `@register(name)` as a decorator."""
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        if target is not None:
            self._items[name] = target
            return lambda obj: obj

        def add(obj: T) -> T:
            self._items[name] = obj
            return obj

        return add

    def unregister(self, name: str) -> None:
        """For tests that register a component for their own use."""
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        if name not in self._items:
            where = f"{self.key}={name!r} is not one of" if self.key else f"unknown {self.kind} {name!r}; allowed:"
            raise UnknownNameError(f"{where} {self.names()}")
        item = self._items[name]
        if isinstance(item, str):  # a lazy entry: import it now, once
            item = self._items[name] = import_ref(item)
        return item

    def names(self) -> list[str]:
        """Sorted, so error messages and listings do not depend on import order."""
        return sorted(self._items)

    def registered(self) -> tuple[str, ...]:
        """In registration order (the built-ins first, as they were listed)."""
        return tuple(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
