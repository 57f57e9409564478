"""The catalog of public model configs shipped with the package (no network at run time).

Each model is `models/catalog/<name>.json`: the model's Hugging Face config.json as published (or, for
models with no HF release, the paper's sizes in the GPT-2 config schema). `SOURCES.json` records where
each file and its checkpoint's exact parameter count came from.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path

from shardscope.errors import ShardscopeError, unknown_name
from shardscope.models.hf import load_hf_config_file, model_from_hf_config
from shardscope.models.spec import ModelSpec

_CATALOG = resources.files("shardscope.models") / "catalog"


def _normalize(name: str) -> str:
    """`Llama-3.1-70B`, `llama3.1_70b` and `meta-llama/Llama-3.1-70B` all become `llama3.1-70b`."""
    name = name.lower().rsplit("/", 1)[-1]
    name = name.replace("_", "-").replace("meta-llama-", "llama")
    name = re.sub(r"^(llama|qwen|mistral|mpt|gpt)-(?=\d)", r"\1", name)
    return name.removesuffix("-hf").removesuffix("-v0.1")


@cache
def list_models() -> list[str]:
    """Names of the catalog models, sorted."""
    return sorted(
        p.name.removesuffix(".json")
        for p in _CATALOG.iterdir()
        if p.name.endswith(".json") and p.name != "SOURCES.json"
    )


@cache
def catalog_sources() -> dict[str, dict]:
    """Provenance of each catalog entry (config source, exact checkpoint parameter count)."""
    path = _CATALOG / "SOURCES.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def catalog_config(name: str) -> dict:
    """The raw config.json content of a catalog model."""
    return json.loads((_CATALOG / f"{name}.json").read_text())


# Short names people use for catalog entries whose file names carry the variant.
ALIASES = {
    "wan2.1-14b": "wan2.1-t2v-14b",
    "wan2.1-1.3b": "wan2.1-t2v-1.3b",
    "hunyuan-video": "hunyuanvideo",
    "kimi-k2-base": "kimi-k2",
    "kimi-k2-instruct": "kimi-k2",
    "llama4-scout-17b-16e": "llama4-scout",
    "llama4-maverick-17b-128e": "llama4-maverick",
    "deepseek-v3.1": "deepseek-v3",  # same architecture and tensors (HF config.json of V3.1)
}


def resolve_model_name(name: str) -> str:
    """Map a user-typed name to a catalog name, or raise with the closest valid names."""
    names = list_models()
    if name in names:
        return name
    wanted = _normalize(name)
    if wanted in ALIASES:
        return ALIASES[wanted]
    for candidate in names:
        if _normalize(candidate) == wanted:
            return candidate
    raise unknown_name("model", name, names)


@cache
def _catalog_names() -> frozenset[str]:
    return frozenset(list_models())


@cache
def _load_catalog_model(name: str) -> ModelSpec:
    spec = model_from_hf_config(catalog_config(name), name=name)
    src = catalog_sources().get(name, {})
    return replace(spec, source=src.get("source", ""))


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog name (`llama3.1-70b`) or a path to an HF `config.json`."""
    if isinstance(name_or_path, str) and name_or_path in _catalog_names():
        return _load_catalog_model(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".json" or path.is_file() or path.is_dir():
        if path.is_dir():
            path = path / "config.json"
        return load_hf_config_file(path)
    if not str(name_or_path).strip():
        raise ShardscopeError("empty model name")
    return _load_catalog_model(resolve_model_name(str(name_or_path)))
