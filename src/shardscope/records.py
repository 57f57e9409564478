"""`evolve`: `dataclasses.replace` for the frozen records of the hot paths (plans, ops, saved tensors).
`replace` builds its keyword arguments and re-runs `__init__` over every field; the planner makes about
10^6 such copies in a large search. A slotted record is copied by a function generated for its class, one
statement per slot (a quarter of `replace`'s time); a record that keeps its fields in its `__dict__` (`Plan`)
by one dict update (a tenth)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from functools import cache
from types import MemberDescriptorType
from typing import Any, TypeVar

T = TypeVar("T")


@cache
def _layout(
    cls: type,
) -> tuple[tuple[str, ...], frozenset[str], tuple[tuple[str, Callable[[], Any]], ...], Callable | None, bool]:
    """(init fields, them as a set, non-init fields with their factories, `__post_init__` or None, whether
    instances keep their fields in a `__dict__` with no field outside `__init__`) of a dataclass."""
    copied = tuple(f.name for f in fields(cls) if f.init)
    fresh = tuple((f.name, f.default_factory) for f in fields(cls) if not f.init and f.default_factory is not MISSING)
    by_dict = "__slots__" not in cls.__dict__ and len(copied) == len(fields(cls))
    return copied, frozenset(copied), fresh, getattr(cls, "__post_init__", None), by_dict


@cache
def _slot_copier(cls: type) -> Callable[[Any, Any], None]:
    """A function `copy(obj, new)` that sets each init field of `new` to `obj`'s, one statement per field
    through the field's slot descriptor, generated as `dataclasses` generates `__init__` (about twice as
    fast as a loop over the fields that calls `getattr` and `object.__setattr__`)."""
    copied = _layout(cls)[0]
    env: dict[str, Any] = {}
    lines = ["def copy(obj, new):"]
    for i, name in enumerate(copied):
        slot = getattr(cls, name, None)
        # a slot's descriptor sets the value as `object.__setattr__` does (frozen or not); anything else
        # (not expected of a slotted dataclass) goes through `object.__setattr__` itself
        env[f"set_{i}"] = slot.__set__ if isinstance(slot, MemberDescriptorType) else _setter(name)
        lines.append(f"    set_{i}(new, obj.{name})")
    lines.append("    return None")
    exec("\n".join(lines), env)  # names are the dataclass's field names, identifiers
    return env["copy"]


def _setter(name: str) -> Callable[[Any, Any], None]:
    def set_field(new: Any, value: Any) -> None:
        object.__setattr__(new, name, value)

    return set_field


def evolve(obj: T, **changes: Any) -> T:
    """A copy of the frozen dataclass `obj` with `changes`, as `dataclasses.replace` gives it: fields
    outside `__init__` start afresh from their factories (a `Memoised` object's memo), and
    `__post_init__` runs. A name that is not a field raises AttributeError."""
    cls = type(obj)
    copied, names, fresh, post_init, by_dict = _layout(cls)
    new = object.__new__(cls)
    if by_dict:  # every field is an init field kept in `__dict__`: copy them all, then the changes
        if not names.issuperset(changes):
            raise AttributeError(f"{cls.__name__} has no field {', '.join(sorted(set(changes) - names))}")
        state = new.__dict__
        state.update(obj.__dict__)
        state.update(changes)
    else:
        set_slot = object.__setattr__
        _slot_copier(cls)(obj, new)
        for name, value in changes.items():
            set_slot(new, name, value)
        for name, factory in fresh:
            set_slot(new, name, factory())
    if post_init is not None:
        post_init(new)
    return new
