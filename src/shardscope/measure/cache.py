"""The cache of measurements: one JSON file per config, named by the hash of the config's content and of
the transformers release that built it (another release may build the same config differently)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# Bump when the measurement record changes shape: older files are then measured again.
SCHEMA = 3
ENV_DIR = "SHARDSCOPE_MEASURE_CACHE"  # overrides the cache folder (tests point it at a temporary one)


def cache_dir() -> Path:
    """$SHARDSCOPE_MEASURE_CACHE, else the user cache dir (XDG_CACHE_HOME or ~/.cache)/shardscope/measured."""
    if env := os.environ.get(ENV_DIR):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardscope" / "measured"


def _transformers_version() -> str:
    """The installed transformers release, read from package metadata (no import of transformers)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return ""


def config_key(cfg: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the config, the transformers release and the record schema."""
    text = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str)
    payload = f"{SCHEMA}\n{_transformers_version()}\n{text}"
    return hashlib.sha256(payload.encode()).hexdigest()


def cache_path(cfg: dict[str, Any]) -> Path:
    return cache_dir() / f"{config_key(cfg)}.json"


def load_cached(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The cached record of this config, or None (absent, unreadable or of another schema)."""
    path = cache_path(cfg)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("schema") == SCHEMA else None


def store(cfg: dict[str, Any], record: dict[str, Any]) -> Path | None:
    """Write the record (atomically: a temporary file renamed); a cache that cannot be written is skipped,
    the measurement is then repeated next time."""
    path = cache_path(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        return None
    return path
