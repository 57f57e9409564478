"""Read `shardscope estimate` flags from a string ("--compile --async-tp --fp8-recipe rowwise"), as a
validation row's `flags` cell or a plan file states them: each flag is a `Plan` field (its type from
the field's default) or one of the cluster flags below. One declaration: the Plan dataclass."""

from __future__ import annotations

import shlex
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.plan.plan import cli_fields, option_flag, option_type

# Flags that describe the cluster or the run rather than a Plan field: name -> (keyword, type)
CLUSTER_FLAGS: dict[str, tuple[str, type]] = {
    "power-limit": ("power_limit_w", float),
    "gpus-per-node": ("gpus_per_node", int),
}
ALIASES = {"async-tp": ("async_tp", bool)}


def plan_flag_types() -> dict[str, tuple[str, type]]:
    """Each Plan option's flag (without the dashes) -> (field, the type its value is read as)."""
    return {option_flag(f)[2:]: (f.name, option_type(f)) for f in cli_fields()}


def parse_flags(text: str, ignored: list[str] | None = None) -> dict[str, Any]:
    """Keywords for `shardscope.setup` from a flags string; a bad flag raises ShardscopeError. With an
    `ignored` list, an unknown flag (and its value, if the next word is not a flag) is put there instead:
    a measured run's description may state settings this version does not model."""
    known = plan_flag_types() | CLUSTER_FLAGS | ALIASES
    try:
        words = shlex.split(text or "")
    except ValueError as exc:
        raise ShardscopeError(f"flags {text!r}: {exc}") from None
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ShardscopeError(f"flags: expected --name, got {word!r}")
        name, _, inline = word[2:].partition("=")
        negated = name.startswith("no-") and name[3:] in known and known[name[3:]][1] is bool
        key, kind = known.get(name[3:] if negated else name, (None, None))
        if key is None and ignored is not None:
            takes_value = not inline and i + 1 < len(words) and not words[i + 1].startswith("--")
            ignored.extend(words[i : i + 1 + takes_value])
            i += 1 + takes_value
            continue
        if key is None:
            raise ShardscopeError(f"flags: unknown --{name}; choose from --{', --'.join(sorted(known))}")
        if kind is bool:
            out[key] = not negated
            i += 1
            continue
        if inline:
            value = inline
            i += 1
        elif i + 1 < len(words):
            value = words[i + 1]
            i += 2
        else:
            raise ShardscopeError(f"flags: --{name} needs a value")
        try:
            out[key] = kind(value)
        except ValueError:
            raise ShardscopeError(f"flags: --{name} takes a {kind.__name__}, got {value!r}") from None
    return out
