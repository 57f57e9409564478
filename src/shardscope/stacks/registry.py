"""Load a stack file and resolve `NAME[@RELEASE]` to the settings that release runs with.

A stack file holds `settings` (what every release of the framework does) and `releases` (what changed at a
release: each entry applies to that release and every later one). Every setting carries the source it
comes from. An unknown release resolves to the nearest known one, with a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from shardscope.errors import ShardscopeError

# A stack's settings are Plan fields (the plan's defaults where the user sets nothing; `plan.resolve`
# checks them against the Plan) and these, which are not: `sharding` (the data-parallel state sharding a
# run gets when the user names none, and what a Megatron "DDP" means: with the distributed optimizer,
# ZeRO-1), the shardings the framework offers (`shardings`: what a plan search tries, `planner.space`) and
# the FLOP counter of the framework's own throughput report (`flops_attention`: causal | full;
# `flops_exact_glu_window`), `pp_reshard_after_forward` (FSDP's reshard-after-forward where the plan is
# pipelined and the user sets none: `plan.resolve`), `moe_model_code` (plan fields the framework sets
# differently for MoE models, which it runs with model code of its own) and `fp8_all_gather_recipes` (the FP8
# recipes under which the framework can gather weights in FP8; absent: every recipe).
STACK_ONLY_KEYS = ("sharding", "shardings", "flops_attention", "flops_exact_glu_window", "pp_reshard_after_forward",
                   "moe_model_code", "fp8_all_gather_recipes")  # fmt: skip
SHARDINGS = ("ddp", "zero1", "fsdp")
# The stack of a run that names none: Megatron-Core with Transformer Engine, as its examples run it.
DEFAULT_STACK = "megatron"
# Other names users give the same software
ALIASES = {
    "megatron-lm": "megatron", "megatron-core": "megatron", "mcore": "megatron",
    "megatron-bridge": "nemo", "nemo2": "nemo", "nemo-2": "nemo",
    "automodel": "nemo-automodel", "nemo_automodel": "nemo-automodel",
    "llmfoundry": "llm-foundry", "llm_foundry": "llm-foundry", "composer": "llm-foundry",
    "megatron-deepspeed": "deepspeed", "transformers": "hf", "huggingface": "hf", "accelerate": "hf",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Setting:
    value: Any
    source: str
    since: str = ""  # the release that introduced it ("" = every release)


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    release: str  # the release resolved ("" for a stack without releases)
    title: str
    settings: dict[str, Setting]
    warnings: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return f"{self.name}@{self.release}" if self.release else self.name

    def value(self, key: str, default: Any = None) -> Any:
        setting = self.settings.get(key)
        return default if setting is None else setting.value

    def plan_defaults(self, moe: bool = False) -> dict[str, Any]:
        """The plan fields this stack sets (for an MoE model: with its `moe_model_code` settings)."""
        fields = {k: s.value for k, s in self.settings.items() if k not in STACK_ONLY_KEYS}
        return fields | dict(self.value("moe_model_code") or {}) if moe else fields

    def sharding_kwargs(self, cell: str = "") -> dict[str, Any]:
        """Plan keywords for the sharding a run states: "" (the stack's default) or "ddp" (for a stack whose
        default is ZeRO-1, Megatron's DDP with the distributed optimizer)."""
        default = self.value("sharding", "ddp")
        if cell == "ddp" and default != "zero1":
            default = "ddp"
        return {"ddp": {"zero": 0}, "zero1": {"zero": 1}, "fsdp": {"fsdp": True}}[default]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.label,
            "settings": {k: s.value for k, s in self.settings.items()},
            "warnings": list(self.warnings),
        }


def _version(release: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in release.split("."))
    except ValueError:
        return ()


@cache
def stack_names() -> tuple[str, ...]:
    """The stacks shipped: one `NAME.yaml` each beside this module."""
    files = resources.files("shardscope.stacks").iterdir()
    return tuple(sorted(e.name.removesuffix(".yaml") for e in files if e.name.endswith(".yaml")))


@cache
def _stack_file(name: str) -> dict:
    """One stack file, read only when asked for (a CLI run reads one)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((resources.files("shardscope.stacks") / f"{name}.yaml").read_text(), Loader=loader)


def list_stacks() -> list[Stack]:
    """Every stack at its default release."""
    return [load_stack(name) for name in stack_names()]


def known_releases(name: str) -> list[str]:
    return [str(r) for r in _stack_file(name).get("known_releases", ())]


def _nearest(release: str, known: list[str]) -> str:
    """The known release nearest `release` (by version order; a tie goes to the older one)."""
    v = _version(release)
    if not v:
        raise ShardscopeError(f"release {release!r} is not a version (choose from {', '.join(known)})")
    ordered = sorted(known, key=_version)
    older = [r for r in ordered if _version(r) <= v]
    newer = [r for r in ordered if _version(r) > v]
    if not older:
        return newer[0]
    if not newer:
        return older[-1]

    def gap(r: str) -> tuple[int, ...]:
        a, b = _version(r), v
        n = max(len(a), len(b))
        a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
        return tuple(abs(x - y) for x, y in zip(a, b, strict=True))

    return min((older[-1], newer[0]), key=gap)


@cache
def load_stack(spec: str = DEFAULT_STACK) -> Stack:
    """`NAME` or `NAME@RELEASE` (`nemo@25.04`, `megatron@2021`), resolved against the stack files."""
    name, _, release = (spec or DEFAULT_STACK).strip().lower().partition("@")
    name = ALIASES.get(name, name)
    if found := re.search(r"\d+(?:\.\d+)*", release):  # "v0.2.0", "core_r0.12", "24.12-py3" as users write them
        release = found.group(0)
    if name not in stack_names():
        raise ShardscopeError(f"unknown stack {name!r}; choose one of {', '.join(stack_names())}")
    data = _stack_file(name)
    known = known_releases(name)
    warnings: list[str] = []
    if not release:
        release = str(data.get("default_release", ""))
    elif known and not _version(release):  # "main", "nightly", "latest"
        newest = max(known, key=_version)
        warnings.append(f"{name}@{release} is not a release number; using the newest known, {name}@{newest}")
        release = newest
    elif known and release not in known and _version(release) in {_version(r) + (0,) for r in known}:
        release = next(r for r in known if _version(r) + (0,) == _version(release))  # "0.2.0" is 0.2
    elif known and release not in known:
        nearest = _nearest(release, known)
        warnings.append(f"{name}@{release} is not a known release; using the nearest, {name}@{nearest}")
        release = nearest
    elif not known:
        warnings.append(f"{name} has no releases; {name}@{release} runs as {name}")
        release = ""
    settings = {k: Setting(v["value"], v["source"]) for k, v in data["settings"].items()}
    for rel, changes in sorted((data.get("releases") or {}).items(), key=lambda kv: _version(str(kv[0]))):
        rel = str(rel)
        if release and _version(rel) <= _version(release) or rel == release:
            settings |= {k: Setting(v["value"], v["source"], rel) for k, v in changes.items()}
    if settings.get("sharding") and settings["sharding"].value not in SHARDINGS:
        raise ShardscopeError(f"stack {name}: sharding must be one of {', '.join(SHARDINGS)}")
    return Stack(name, release, data["title"], settings, tuple(warnings))
