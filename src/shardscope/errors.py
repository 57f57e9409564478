"""User-facing errors: the CLI prints them as one line and exits with status 2."""

from __future__ import annotations

import difflib


class ShardscopeError(ValueError):
    """Bad input from a user (unknown name, inconsistent plan, malformed file)."""


def unknown_name(kind: str, name: str, choices: list[str]) -> ShardscopeError:
    """An error for an unknown catalog name that suggests the closest valid names."""
    close = difflib.get_close_matches(name.lower(), [c.lower() for c in choices], n=3, cutoff=0.5)
    lookup = {c.lower(): c for c in choices}
    hint = f"; did you mean {', '.join(lookup[c] for c in close)}?" if close else ""
    return ShardscopeError(f"unknown {kind} {name!r}{hint} (valid: {', '.join(sorted(choices))})")
