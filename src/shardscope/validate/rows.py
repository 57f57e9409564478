"""Turn a validation CSV row into (model, cluster, plan) from what the run's user states: the layout
columns, the `stack` (blank: the default stack) and the `flags` cell. Nothing else of the row is read
(not its source, notes or id).

Blank cells:
  global_batch  no accumulation: dp x micro-batch.
  micro_batch   the stack's default, else 1.
  vpp           1 (no interleaving).
  zero_or_fsdp  the stack's sharding (`ddp` under a stack whose default is the distributed optimizer is
                Megatron's DDP with it: ZeRO-1).
  recompute     the least recompute that fits, from the flags' policy up (none, selective, full): the run
                did not run out of memory, and recipes pick recompute that way.
Recompute cells: `none`, `selective`, `full`, `WORD (any note)`, `selective(<modules>)`, `full(block,N)`.
Models: a catalog config whose name matches the row's model (after checking the row's columns agree
with it), else one built from the columns (dense or MoE), with a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import Cluster, make_cluster
from shardscope.models.spec import GPT_BLOCK, ModelSpec, MoESpec
from shardscope.plan.flags import parse_flags
from shardscope.plan.plan import Plan, Recompute
from shardscope.plan.resolve import stack_plan
from shardscope.stacks import Stack, load_stack


class SkipRow(Exception):
    """A row this version cannot predict; the message is the reason shown in the report."""


@dataclass(frozen=True, slots=True)
class RowCase:
    model: ModelSpec
    cluster: Cluster
    plan: Plan
    stack: Stack
    warnings: tuple[str, ...] = ()


def _int(row: dict[str, str], key: str, default: int | None = None) -> int:
    value = (row.get(key) or "").strip()
    if not value:
        if default is None:
            raise SkipRow(f"no {key} in the row")
        return default
    return int(float(value))


def _squeezed(name: str) -> str:
    """A model name without case, separators or a text-to-video tag: "Llama-3.1-8B", "llama3.1_8b" and
    "llama3.1-8b" read alike, and "wan2.1_14b" as "wan2.1-t2v-14b"."""
    return re.sub(r"[^a-z0-9.]", "", name.lower()).replace("t2v", "")


def _catalog_name(model: str) -> str | None:
    """The catalog config a row's model names, or None."""
    from shardscope.models.catalog import list_models

    key = _squeezed(model)
    return next((name for name in list_models() if _squeezed(name) == key), None)


def _catalog_model(row: dict[str, str], name: str) -> ModelSpec:
    from shardscope.models.catalog import load_model

    m = load_model(name)
    checks = {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "vocab": m.vocab}
    if m.dit:
        checks |= {"ffn_hidden": m.ffn_hidden}
    if m.moe:
        checks |= {"experts": m.moe.experts, "topk": m.moe.top_k, "ffn_hidden": m.moe.expert_ffn}
    for col, value in checks.items():
        if row.get(col) and int(float(row[col])) != value:
            raise SkipRow(f"row's {col}={row[col]} disagrees with the {name} config ({value})")
    return m


def model_from_row(row: dict[str, str]) -> tuple[ModelSpec, tuple[str, ...]]:
    """The catalog config the row's model names, else the row's architecture columns + the family's
    structure (norm, MLP, positions, biases); the second item says when the model was built from columns."""
    name = row["model"].lower()
    catalog = _catalog_name(name)
    arch = (row.get("arch") or "dense").strip().lower()
    if catalog and (arch == "moe" or arch == "dit" or not row.get("layers")):
        return _catalog_model(row, catalog), ()
    if arch not in ("dense", "moe"):
        raise SkipRow(f"{arch} architecture needs a catalog config ({row['model']} has none)")
    if not (row.get("layers") and row.get("hidden") and row.get("heads")):
        raise SkipRow("architecture columns are blank in the source")
    heads = _int(row, "heads")
    hidden = _int(row, "hidden")
    common: dict = dict(
        name=row["model"],
        hidden=hidden,
        layers=_int(row, "layers"),
        heads=heads,
        kv_heads=_int(row, "kv_heads", heads),
        head_dim=hidden // heads,
        ffn_hidden=_int(row, "ffn_hidden", 4 * hidden),
        vocab=_int(row, "vocab", 51200),
    )
    warnings: tuple[str, ...] = ()
    if arch == "moe":
        experts, topk = _int(row, "experts", 0), _int(row, "topk", 0)
        if not (experts and topk):
            raise SkipRow("an MoE row needs its experts and topk columns")
        if topk > experts:
            raise SkipRow(f"topk {topk} exceeds the {experts} experts")
        common["moe"] = MoESpec(experts=experts, top_k=topk, expert_ffn=common["ffn_hidden"])
        warnings = (f"{row['model']}: no catalog config; built from its columns (every layer MoE, no shared experts)",)
    if name.startswith("nemotron"):  # squared-ReLU (non-gated) MLP, LayerNorm, RoPE, untied
        return ModelSpec(**common, mlp="gelu", norm="layernorm", position="rope"), warnings
    if name.startswith("mpt"):  # llm-foundry benchmark yamls: ALiBi, biases, tied embeddings
        return ModelSpec(**common, **GPT_BLOCK, tied_embeddings=True, position="alibi"), warnings
    if name.startswith("gpt") and arch == "dense":  # GPT-2/3 style: learned positions, biases, tied embeddings
        spec = ModelSpec(
            **common, **GPT_BLOCK, tied_embeddings=True, position="learned", pos_embedding_rows=_int(row, "seq_len")
        )
        return spec, warnings
    # Llama-style (Llama, Mistral, Qwen, Mixtral, Grok and the rest): SwiGLU, RMSNorm, RoPE
    return ModelSpec(**common, mlp="swiglu", norm="rmsnorm", position="rope"), warnings


def sharding_of(cell: str, stack: Stack) -> dict:
    """Plan keywords of a `zero_or_fsdp` cell (SOURCES.md's spellings) under `stack`."""
    z = (cell or "").strip().lower()
    if z.startswith("megatron_fsdp"):
        m = re.search(r"shard_group=(\d+)", z)
        return {"zero": 3, "shard_group": int(m.group(1)) if m else 0}
    if z.startswith("hsdp"):
        m = re.search(r"(\d+)", z)
        return {"fsdp": True, "shard_group": int(m.group(1)) if m else 0}
    if z.startswith("fsdp"):
        if "zero2" in z or "shard_grad_op" in z:
            return {"fsdp": True, "reshard_after_forward": False}
        return {"fsdp": True}
    if z in ("", "ddp"):
        return stack.sharding_kwargs(z)
    if z.startswith("zero") and z[4:5].isdigit():
        return {"zero": int(z[4])}
    raise SkipRow(f"unknown zero_or_fsdp {z!r}")


def recompute_of(cell: str) -> tuple[str, int, str | None]:
    """(policy, layers, modules) of a recompute cell: `selective(<modules>)`, `full(block,N)`, or a policy
    word with any note after it (`none (selective, empty module list)`)."""
    text = (cell or "").strip().lower()
    if not text:
        return "", 0, None
    if m := re.match(r"full\(\w+,\s*(\d+)\)", text):
        return "full", int(m.group(1)), None
    if m := re.match(r"selective\(([^)]*)\)", text):
        modules = ",".join(x.strip() for x in m.group(1).split(",") if x.strip())
        return "selective", 0, modules or None
    word = re.match(r"[a-z]+", text)
    if not word or word.group(0) not in ("none", "selective", "full"):
        raise SkipRow(f"unknown recompute {cell!r}")
    return word.group(0), 0, None


def case_from_row(row: dict[str, str]) -> RowCase:
    try:
        stack = load_stack((row.get("stack") or "").strip())
    except ShardscopeError as exc:
        raise SkipRow(str(exc)) from None
    ignored: list[str] = []
    try:
        flags = parse_flags(row.get("flags") or "", ignored)
    except ShardscopeError as exc:
        raise SkipRow(str(exc)) from None
    try:
        model, warnings = model_from_row(row)
    except ShardscopeError as exc:  # columns a framework would refuse (KV heads not dividing heads, ...)
        raise SkipRow(f"model rejected: {exc}") from None
    cluster_kw = {k: flags.pop(k) for k in ("power_limit_w", "gpus_per_node") if k in flags}
    try:
        cluster = make_cluster(row["gpu"], _int(row, "num_gpus"), **cluster_kw)
    except ShardscopeError as exc:
        raise SkipRow(str(exc)) from None
    precision = (row.get("precision") or "bf16").strip().lower()
    policy, layers, modules = recompute_of(row.get("recompute", ""))
    tp, pp, cp = _int(row, "tp", 1), _int(row, "pp", 1), _int(row, "cp", 1)
    dp = _int(row, "dp", 0) or cluster.gpus // (tp * pp * cp)
    micro = _int(row, "micro_batch", 0) or flags.pop("micro_batch", None) or stack.value("micro_batch", 1)
    kw = dict(
        tp=tp,
        pp=pp,
        vpp=_int(row, "vpp", 1),
        cp=cp,
        dp=dp,
        ep=_int(row, "ep", 1),
        micro_batch=micro,
        global_batch=_int(row, "global_batch", 0) or dp * micro,
        seq_len=_int(row, "seq_len"),
        precision="fp8" if precision == "fp8" else "bf16",
        **sharding_of(row.get("zero_or_fsdp", ""), stack),
    )
    if policy:
        kw |= {"recompute": policy, "recompute_layers": layers, "recompute_modules": modules}
    kw |= flags  # the run's stated flags override the columns' defaults
    try:
        plan = stack_plan(model, cluster, stack, **kw)
    except ShardscopeError as exc:
        raise SkipRow(f"plan rejected: {exc}") from None
    if not policy:
        plan = _least_recompute_that_fits(model, cluster, plan, floor=plan.recompute)
    ignored_note = (f"flags not modelled, ignored: {' '.join(ignored)}",) if ignored else ()
    return RowCase(model, cluster, plan, stack, warnings + stack.warnings + ignored_note)


def _least_recompute_that_fits(model: ModelSpec, cluster: Cluster, plan: Plan, floor: Recompute = "none") -> Plan:
    """A run whose recompute is not known: it did not run out of memory, so it used the least recompute
    that fits, from `floor` up (none, then selective, then full) — which frameworks' recipes pick the same
    way. The plan's own selective modules are kept at its own level; a policy above it takes the policy's
    defaults."""
    from shardscope.analytic.step import estimate_step

    policies: tuple[Recompute, ...] = ("none", "selective", "full")
    if floor not in policies:
        raise ShardscopeError(f"unknown recompute floor {floor!r}; choose one of {', '.join(policies)}")
    for policy in policies[policies.index(floor) :]:
        modules = plan.recompute_modules if policy == plan.recompute else ()
        candidate = replace(plan, recompute=policy, recompute_modules=modules)
        if policy == "full":  # Megatron-Core refuses the EP all-to-all overlap with full recompute
            candidate = replace(candidate, ep_comm_overlap=False)
        if estimate_step(model, cluster, candidate).fits:
            return candidate
    # nothing fits: the most a run could have recomputed
    return replace(plan, recompute="full", recompute_modules=(), ep_comm_overlap=False)
