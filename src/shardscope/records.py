"""`evolve`: `dataclasses.replace` for the frozen, slotted records of the hot paths (plans, ops, saved
tensors). `replace` builds its keyword arguments and re-runs `__init__` over every field; the planner
makes about 10^6 such copies in a large search, and copying the slots directly takes half the time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")


@cache
def _layout(cls: type) -> tuple[tuple[str, ...], tuple[tuple[str, Callable[[], Any]], ...], Callable | None]:
    """(init fields, non-init fields with their factories, `__post_init__` or None) of a dataclass."""
    copied = tuple(f.name for f in fields(cls) if f.init)
    fresh = tuple((f.name, f.default_factory) for f in fields(cls) if not f.init and f.default_factory is not MISSING)
    return copied, fresh, getattr(cls, "__post_init__", None)


def evolve(obj: T, **changes: Any) -> T:
    """A copy of the frozen slotted dataclass `obj` with `changes`, as `dataclasses.replace` gives it:
    fields outside `__init__` start afresh from their factories (a `Memoised` object's memo), and
    `__post_init__` runs. A name that is not a field raises AttributeError (no slot for it)."""
    cls = type(obj)
    copied, fresh, post_init = _layout(cls)
    new = object.__new__(cls)
    set_slot = object.__setattr__
    for name in copied:
        set_slot(new, name, getattr(obj, name))
    for name, value in changes.items():
        set_slot(new, name, value)
    for name, factory in fresh:
        set_slot(new, name, factory())
    if post_init is not None:
        post_init(new)
    return new
