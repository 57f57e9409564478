"""User-facing errors and warnings: the CLI prints each as one line on stderr; an error exits with status 2."""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class ShardscopeError(ValueError):
    """Bad input from a user (unknown name, inconsistent plan, malformed file)."""


class ShardscopeWarning(UserWarning):
    """Input that is accepted but is probably not what was meant (a misspelt config key) or lies past what
    anyone has run (a cluster larger than any built): the estimate goes on, the user is told."""


def warn(message: str) -> None:
    """Issue a ShardscopeWarning attributed to the caller's caller (the code that passed the input)."""
    warnings.warn(message, ShardscopeWarning, stacklevel=3)


@contextmanager
def warnings_to_stderr() -> Iterator[None]:
    """Within it, each distinct ShardscopeWarning prints once as one line `warning: ...` on stderr (as the
    CLI prints errors); other warnings print as Python prints them. On exit the warning state is restored."""
    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("always", ShardscopeWarning)  # repeats are dropped here, by text, not per line
        python_show = warnings.showwarning

        def show(
            message: Warning | str, category: type[Warning], filename: str, lineno: int,
            file: TextIO | None = None, line: str | None = None,
        ) -> Any:  # fmt: skip
            if not issubclass(category, ShardscopeWarning):
                return python_show(message, category, filename, lineno, file, line)
            text = str(message)
            if text not in seen:
                seen.add(text)
                sys.stderr.write(f"warning: {text}\n")
            return None

        warnings.showwarning = show
        yield


def unknown_name(kind: str, name: str, choices: list[str]) -> ShardscopeError:
    """An error for an unknown catalog name that suggests the closest valid names."""
    close = difflib.get_close_matches(name.lower(), [c.lower() for c in choices], n=3, cutoff=0.5)
    lookup = {c.lower(): c for c in choices}
    hint = f"; did you mean {', '.join(lookup[c] for c in close)}?" if close else ""
    return ShardscopeError(f"unknown {kind} {name!r}{hint} (valid: {', '.join(sorted(choices))})")
