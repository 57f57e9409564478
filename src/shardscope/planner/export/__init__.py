"""Write a plan as a launchable config for a framework release: torchtitan (a 0.3 launch script or a 0.2 job
TOML), Megatron-LM (a `pretrain_gpt.py` launch script), DeepSpeed (its JSON config).

Field names are the frameworks' own. Each carries the launch (nodes, GPUs per node, global and micro batch,
the steps of `--tokens`) and marks what the user must fill in (`FILL IN`: the data path, the learning-rate
schedule). What a framework release cannot run is refused with the reason and the framework file that says
so (`CONSTRAINTS` of each exporter), and `--export X` searches only the plans X can run (`runnable_problems`).
"""

from __future__ import annotations

import json
from functools import cache

from shardscope.errors import ShardscopeError
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan
from shardscope.planner.export import deepspeed as _deepspeed
from shardscope.planner.export import megatron as _megatron_module
from shardscope.planner.export import torchtitan as _torchtitan
from shardscope.planner.export.common import (
    DEFAULT_RELEASES,
    EXPORT_RELEASES,
    FILL_IN,
    FORMATS,
    Constraint,
    ExportTarget,
    Launch,
    constraints_target,
    export_target,
    hf_repo,
    launch_for,
)
from shardscope.planner.export.deepspeed import to_deepspeed, zero_stage
from shardscope.planner.export.megatron import (
    _megatron,
    layer_pattern,
    megatron_launch_args,
    megatron_model_args,
    to_megatron,
    to_megatron_script,
)
from shardscope.planner.export.torchtitan import (
    TORCHTITAN_CONFIGS,
    TORCHTITAN_FLAVORS,
    TitanConfig,
    titan_config,
    titan_degrees,
    titan_pipeline_split,
    titan_stage_layers,
    to_torchtitan_script,
    to_torchtitan_toml,
    torchtitan_args,
)

__all__ = [
    "CONSTRAINTS",
    "DEFAULT_RELEASES",
    "EXPORT_RELEASES",
    "FILL_IN",
    "FORMATS",
    "TORCHTITAN_CONFIGS",
    "TORCHTITAN_FLAVORS",
    "Constraint",
    "ExportTarget",
    "Launch",
    "TitanConfig",
    "_megatron",
    "constraints_target",
    "export",
    "export_target",
    "hf_repo",
    "launch_for",
    "layer_pattern",
    "megatron_launch_args",
    "megatron_model_args",
    "runnable_problems",
    "search_problems",
    "titan_config",
    "titan_degrees",
    "titan_pipeline_split",
    "titan_stage_layers",
    "to_deepspeed",
    "to_megatron",
    "to_megatron_script",
    "to_torchtitan",
    "to_torchtitan_script",
    "to_torchtitan_toml",
    "torchtitan_args",
    "zero_stage",
]

# Each framework's constraints, beside its exporter
CONSTRAINTS: dict[str, tuple[Constraint, ...]] = {
    "torchtitan": _torchtitan.CONSTRAINTS,
    "megatron": _megatron_module.CONSTRAINTS,
    "deepspeed": _deepspeed.CONSTRAINTS,
}


# The search asks for every plan it tries: resolve each `NAME@RELEASE` once
_resolved = cache(export_target)


def _target(target: ExportTarget | str) -> ExportTarget:
    return target if isinstance(target, ExportTarget) else _resolved(target)


def runnable_problems(target: ExportTarget | str, model: ModelSpec, plan: Plan, *, uniform: bool = False) -> list[str]:
    """Why `target`'s framework release cannot run `plan` of `model` (each reason with its source file), or [].
    `uniform`: only the constraints that hold for every plan of a search alike."""
    t = _target(target)
    rows = (c for c in CONSTRAINTS[t.framework] if c.holds_at(t.release) and (c.uniform or not uniform))
    return [c.message(model, plan) for c in rows if c.breaks(model, plan)]


def search_problems(target: ExportTarget | str, model: ModelSpec, probe: Plan) -> list[str]:
    """What `target` cannot run whatever the layout: the uniform constraints on `probe`, a plan holding the
    settings every plan of a search shares (precision, kernels, a fixed dispatcher with expert parallelism)."""
    return runnable_problems(target, model, probe, uniform=True)


def to_torchtitan(model: ModelSpec, plan: Plan, release: str = "0.3", launch: Launch | None = None) -> str:
    """The torchtitan export of `release`: 0.3's launch script or 0.2's job TOML."""
    if release == "0.2":
        return to_torchtitan_toml(model, plan, launch)
    return to_torchtitan_script(model, plan, launch)


def export(fmt: ExportTarget | str, model: ModelSpec, plan: Plan, launch: Launch | None = None) -> str:
    """`plan` of `model` as `fmt` (`NAME[@RELEASE]` or a target) writes it; the launch defaults to nodes of 8
    GPUs and a placeholder step count. Raises ShardscopeError, naming every reason, where the framework
    release cannot run the plan."""
    t = _target(fmt)
    problems = runnable_problems(t, model, plan)
    if problems:
        raise ShardscopeError(f"{t.label} cannot run this plan of {model.name}: " + "; ".join(problems))
    if t.framework == "torchtitan":
        text = to_torchtitan(model, plan, t.release, launch)
    elif t.framework == "megatron":
        text = to_megatron_script(model, plan, t, launch)
    else:
        text = to_deepspeed(model, plan, t, launch)
    if t.stack.warnings:  # a release resolved to the nearest known one: said in the export
        if t.framework == "deepspeed":
            cfg = json.loads(text)
            cfg["_shardscope"]["notes"] += list(t.stack.warnings)
            return json.dumps(cfg, indent=2) + "\n"
        first, rest = text.split("\n", 1)
        text = first + "\n" + "".join(f"# note: {w}\n" for w in t.stack.warnings) + rest
    return text
