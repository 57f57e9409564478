"""A plan as a run's user states it: the stack's settings, then whatever the user set explicitly.

A user names the framework (`--stack NAME[@RELEASE]`) and the flags they set; everything else comes
from the stack file. Settings a framework applies only where it can (the EP all-to-all overlap, CUDA-graph
scopes) are dropped where the plan rules them out, as the framework's own checks would.
"""

from __future__ import annotations

from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import Cluster
from shardscope.memo import MemoTable
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan, cuda_graph_problem, ep_overlap_problem, make_plan, plan_field_names
from shardscope.records import evolve
from shardscope.stacks import Stack, load_stack


def stack_plan(model: ModelSpec, cluster: Cluster, stack: Stack | str | None = None, **explicit: Any) -> Plan:
    """The plan of `explicit` keywords (None = not stated) over `stack`'s settings, validated."""
    st = stack if isinstance(stack, Stack) else load_stack(stack or "")
    stated = {k: v for k, v in explicit.items() if v is not None}
    if stated.pop("async_tp", False):  # torchtitan's async TP: the TP collectives overlap the GEMMs
        stated["tp_comm_overlap"] = True
    plain, conditional = _stack_defaults(st, model.moe is not None)
    defaults = dict(plain)
    if not model.mtp_layers:
        defaults.pop("mtp", None)  # a stack that trains MTP modules trains none of a model without them
    if not (stated.get("shard_group") or any(k in stated for k in ("zero", "fsdp"))):
        defaults |= st.sharding_kwargs(stated.pop("sharding", ""))
    stated.pop("sharding", None)
    pp_reshard = st.value("pp_reshard_after_forward")
    if pp_reshard is not None and (stated.get("pp") or 1) > 1 and "reshard_after_forward" not in stated:
        defaults["reshard_after_forward"] = pp_reshard  # the framework's policy for pipelined FSDP
    plan = make_plan(model, cluster, **(defaults | stated))
    gather_recipes = st.value("fp8_all_gather_recipes")
    if gather_recipes is not None and plan.fp8_params and plan.fp8_recipe not in gather_recipes:
        if "fp8_all_gather" in stated:
            raise ShardscopeError(
                f"stack {st.label} gathers FP8 weights only under the {' or '.join(gather_recipes)} recipe, not "
                f"{plan.fp8_recipe}: drop --fp8-all-gather or choose --fp8-recipe {gather_recipes[0]}"
            )
        plan = evolve(plan, fp8_all_gather=False)
    # the stack's conditional settings, where the plan allows them and the user did not set them
    for key, value in conditional.items():
        if key in stated or not value:
            continue
        if key == "ep_comm_overlap":  # its rules do not read the overlap itself: checked on the plan as it is
            if ep_overlap_problem(plan) is None:
                plan = evolve(plan, ep_comm_overlap=value)
            continue
        candidate = evolve(plan, **{key: value})
        if cuda_graph_problem(model, candidate) is None:
            plan = candidate
    return plan


# Settings a framework applies only where the plan allows them (see `stack_plan`)
CONDITIONAL = ("ep_comm_overlap", "cuda_graphs")
_STACK_MEMO = MemoTable(limit=64)


def _stack_defaults(st: Stack, moe: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan fields `st` sets for a dense or an MoE model, checked against the Plan: (those set outright,
    the `CONDITIONAL` ones). Kept per stack (`load_stack` hands out one object per release): neither is to
    be changed."""
    memo = _STACK_MEMO.of(st)
    key = ("defaults", moe)
    if key not in memo:
        defaults = st.plan_defaults(moe)
        unknown = sorted(set(defaults) - plan_field_names())
        if unknown:
            raise ShardscopeError(f"stack {st.label} sets {', '.join(unknown)}, which no plan has")
        conditional = {k: defaults.pop(k) for k in CONDITIONAL if k in defaults}
        memo[key] = defaults, conditional
    return memo[key]
