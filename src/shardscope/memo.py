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
