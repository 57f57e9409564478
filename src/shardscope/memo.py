"""Memoisation on immutable specs: the planner asks the same derived questions of one model spec and one
shared op graph for thousands of plans, so each answer is computed once and kept on the object."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class Memoised:
    """Mixin for frozen dataclasses that declare `memo: dict = field(default_factory=dict, init=False,
    repr=False, compare=False, hash=False)`; the object must never change after construction."""

    __slots__ = ()
    memo: dict

    def memoised(self, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()`, evaluated once per object and `key`."""
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = compute()
        return hit


class MemoTable:
    """Memos for objects that cannot keep their own (slotted records defined elsewhere, such as the op graph),
    or for a combination of objects (a graph on a cluster): one dict per object or combination, found by
    identity, without hashing the objects. Each entry holds its objects, so no other object can take one of
    their ids while the entry lives; past `limit` entries the table starts afresh (as the graph cache does)."""

    __slots__ = ("_entries", "_limit")

    def __init__(self, limit: int) -> None:
        self._entries: dict[int | tuple[int, ...], tuple[tuple[object, ...], dict]] = {}
        self._limit = limit

    def clear(self) -> None:
        """Forget every memo (a cold computation after it)."""
        self._entries.clear()

    def of(self, *objs: object) -> dict:
        """The memo dict of `objs` together (empty at first)."""
        key = tuple(map(id, objs)) if len(objs) > 1 else id(objs[0])
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self._limit:
                self._entries.clear()
            entry = self._entries[key] = (objs, {})
        return entry[1]
