"""Measured profiles (SQLite): schema and writing (`db`), interpolation (`interp`), the shipped profiles
built from the project's measurements (`shipped`), and `load_profile` by shipped name or file."""

from __future__ import annotations

import gzip
import sqlite3
from functools import cache
from importlib import resources
from pathlib import Path

from shardscope.errors import ShardscopeError
from shardscope.hardware.profile.db import digest, read_rows
from shardscope.hardware.profile.interp import Profile

__all__ = ["Profile", "load_profile", "shipped_names"]


def shipped_names() -> list[str]:
    """Names of the profiles shipped with shardscope (`hardware/profiles/NAME.sql`, or `NAME.sql.gz` as
    `shardscope calibrate` wrote it on that GPU)."""
    folder = resources.files("shardscope.hardware") / "profiles"
    names = (p.name.removesuffix(".gz") for p in folder.iterdir() if p.name.endswith((".sql", ".sql.gz")))
    return sorted(n.removesuffix(".sql") for n in names)


def _from_connection(con: sqlite3.Connection, source: str) -> Profile:
    try:
        meta, conds, points = read_rows(con)
    except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
        raise ShardscopeError(f"{source} is not a shardscope profile ({exc})") from None
    finally:
        con.close()
    return Profile(
        meta.get("name", source), meta.get("gpu", ""), digest(meta, conds, points), meta, conds, points, source
    )


def _from_sql(text: str, source: str) -> Profile:
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(text)
    except sqlite3.DatabaseError as exc:
        con.close()
        raise ShardscopeError(f"{source} is not a shardscope profile ({exc})") from None
    return _from_connection(con, source)


@cache
def _shipped(name: str) -> Profile:
    folder = resources.files("shardscope.hardware") / "profiles"
    plain = folder / f"{name}.sql"
    text = plain.read_text() if plain.is_file() else gzip.decompress((folder / f"{name}.sql.gz").read_bytes()).decode()
    return _from_sql(text, f"shipped profile {name}")


def load_profile(ref: str | Path) -> Profile:
    """A profile by shipped name (case-insensitive, e.g. "H100") or by file (`.db` SQLite, `.sql` text, `.sql.gz`)."""
    path = Path(ref)
    if path.is_file():
        if path.suffix == ".sql":
            return _from_sql(path.read_text(), str(path))
        if path.suffixes[-2:] == [".sql", ".gz"]:
            return _from_sql(gzip.decompress(path.read_bytes()).decode(), str(path))
        return _from_connection(sqlite3.connect(f"file:{path}?mode=ro", uri=True), str(path))
    names = shipped_names()
    match = next((n for n in names if n.lower() == str(ref).strip().lower()), None)
    if match is None:
        raise ShardscopeError(f"no profile {str(ref)!r}: not a file, nor a shipped profile ({', '.join(names)})")
    return _shipped(match)
