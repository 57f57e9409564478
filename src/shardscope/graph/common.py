"""Shared pieces of the op graph: sizes of one GPU's share of a micro-batch, and op constructors."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shardscope.graph.ops import Collective, Op, Saved
from shardscope.memo import Memoised
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan
from shardscope.records import evolve

ALL = frozenset({"none", "selective", "full"})
NOT_FULL = frozenset({"none", "selective"})
NONE_ONLY = frozenset({"none"})
SELECTIVE_ONLY = frozenset({"selective"})


BF16 = 2  # bytes per activation element in bf16/fp16 mixed precision
FP32 = 4
E5M6 = 1.5  # DeepSeek-V3's 12-bit activation format (1 sign, 5 exponent, 6 mantissa bits)
FP8_BLOCK_SCALED = 1 + FP32 / 128  # an FP8 element with its share of one fp32 scale per 1x128 tile


@dataclass(frozen=True, slots=True)
class OpGroup(Memoised):
    """Ops, saved tensors and collectives of one unit (a transformer layer, the embedding, the head)."""

    ops: tuple[Op, ...]
    saved: tuple[Saved, ...]
    comms: tuple[Collective, ...]
    attn_ops: int = 0  # a layer: how many leading ops form its attention half (the rest: the MLP half)
    # Results derived from this immutable group (saved bytes per policy, op times per GPU), kept for the
    # planner, which asks the same questions of one shared graph for thousands of plans.
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def saved_bytes(self, policy: str, modules: tuple[str, ...] = ()) -> float:
        """Bytes kept under `policy`; "selective" with Megatron `modules` keeps what "none" keeps except
        the tensors those modules recompute."""
        return self.memoised(("saved", policy, modules), lambda: self._saved_bytes(policy, modules))

    def _saved_bytes(self, policy: str, modules: tuple[str, ...]) -> float:
        if policy == "selective" and modules:
            return sum(s.bytes for s in self.saved if "none" in s.policies and not s.modules.intersection(modules))
        return sum(s.bytes for s in self.saved if policy in s.policies)

    def recomputed_ops(self, modules: tuple[str, ...] = ()) -> list[Op]:
        """Ops that "selective" recompute re-runs in backward: those of the Megatron `modules`, or the
        cheap ones (norms, activations, rope) of op-level selective checkpointing."""
        if modules:
            return [op for op in self.ops if op.modules.intersection(modules)]
        return [op for op in self.ops if op.cheap]

    def __add__(self, other: OpGroup) -> OpGroup:
        ops, saved, comms = self.ops + other.ops, self.saved + other.saved, self.comms + other.comms
        return OpGroup(ops, saved, comms, self.attn_ops)


def alternate_mm_share(model: ModelSpec, plan: Plan, unit: OpGroup) -> dict[str, float]:
    """Per GEMM of `unit`, the share of its FLOPs (and of its output) that torchtitan's op-level selective
    AC re-runs in backward: it counts the block's matmuls in forward order and recomputes every second one.
    Our fused GEMMs are split into the model's own matmuls (q, k, v; gate, up) to count them; grouped expert
    GEMMs are not `aten.mm` calls and are not counted. Kept on the unit (its graph fixes `plan.tp`)."""
    return unit.memoised("alternate mm share", lambda: _alternate_mm_share(model, plan, unit))


def _alternate_mm_share(model: ModelSpec, plan: Plan, unit: OpGroup) -> dict[str, float]:
    out: dict[str, float] = {}
    count = 0
    for op in unit.ops:
        if op.kind != "gemm" or op.groups > 1:
            continue
        n = op.mnk[1]
        if op.name == "qkv proj" and not model.mla:
            q = model.heads // plan.tp * model.head_dim
            kv = (n - q) / 2
            parts = [q, kv, kv]
        elif op.name == "gate/up proj":
            parts = [n / 2, n / 2]
        else:
            parts = [n]
        redo = 0.0
        for part in parts:
            count += 1
            redo += part if count % 2 == 0 else 0.0
        out[op.name] = redo / n
    return out


@dataclass(frozen=True, slots=True)
class Shapes:
    """One GPU's share of a micro-batch: `t` tokens enter attention (after CP), `t_sp` are held by
    the norms / residual stream (after sequence parallel), `t_kept` in the input a column GEMM keeps for
    its weight gradient (Megatron keeps the sequence-parallel shard, DTensor TP the gathered tensor:
    `Plan.tp_keeps_gathered_input`)."""

    t: int
    t_sp: float
    t_kept: float
    fp8: bool

    @classmethod
    def of(cls, plan: Plan) -> Shapes:
        t = plan.micro_batch * plan.seq_len // plan.cp
        t_sp = t / plan.tp if plan.sp else t
        t_kept = t if plan.tp_keeps_gathered_input else t_sp
        return cls(t=t, t_sp=t_sp, t_kept=t_kept, fp8=plan.precision == "fp8")

    @property
    def gemm_in(self) -> int:
        """Bytes per element of a saved GEMM input (an FP8 GEMM saves it quantized)."""
        return 1 if self.fp8 else BF16


def tagged(items: list, *modules: str) -> list:
    """`items` (ops or saved tensors) marked as re-run / dropped by these Megatron recompute modules."""
    return [evolve(x, modules=x.modules | frozenset(modules)) for x in items]


def scoped(ops: Iterable[Op], scope: str) -> list[Op]:
    """`ops` marked as captured by the Megatron-Core CUDA-graph module `scope` (ops already in one keep it)."""
    return [op if op.scope else evolve(op, scope=scope) for op in ops]


def norm(name: str, model: ModelSpec, tokens: float, width: int | None = None) -> tuple[Op, Saved]:
    """A fused RMSNorm/LayerNorm: reads and writes the activation; saves fp32 statistics. Backward is two
    kernels, the input gradient with per-block weight-gradient partials and their reduction
    (Transformer Engine `rmsnorm_bwd_finalize_*_kernel` / `ln_bwd_finalize_*_kernel`)."""
    w = width or model.hidden
    stats = FP32 * (2 if model.norm == "layernorm" else 1)
    op = Op(
        name, "memory", bytes=2 * BF16 * tokens * w, bwd_bytes=3 * BF16 * tokens * w, cheap=True, bwd_launches=2,
        role="norm",
    )  # fmt: skip
    return op, Saved(f"{name} stats", stats * tokens, NONE_ONLY)


def qk_norm(
    name: str, model: ModelSpec, plan: Plan, rows: tuple[float, float], heads: tuple[int, int]
) -> tuple[Op, list[Saved], list[Collective]]:
    """RMSNorm of q and k (`rows` tokens each, `heads` of this rank's heads each): the op, its saved input
    and fp32 statistics, and its collectives. Per head (Qwen3) it normalises each head's vector; across
    heads (Wan's `rms_norm_across_heads`) one vector of all heads, which under TP the rank first gathers
    from the TP group and scatters back after (Megatron-DFM `layernorm_across_heads`): it keeps the
    gathered input, and backward gathers the gradients the same way."""
    hd = model.head_dim
    across = model.qk_norm_across_heads
    gathered = plan.tp if across else 1
    elems = sum(r * h * hd for r, h in zip(rows, heads, strict=True))
    op = Op(
        name, "memory", bytes=2 * BF16 * elems * gathered, bwd_bytes=3 * BF16 * elems * gathered, cheap=True,
        role="norm",
    )  # fmt: skip
    stats = FP32 * sum(r * (1 if across else h) for r, h in zip(rows, heads, strict=True))
    saved = [Saved(f"{name} input", BF16 * elems * gathered, NONE_ONLY), Saved(f"{name} stats", stats, NONE_ONLY)]
    comms = [
        Collective(f"tp all-gather {name}", "all_gather", "tp", BF16 * elems * plan.tp, phase)
        for phase in ("fwd", "bwd")
        if across and plan.tp > 1
    ]
    return op, saved, comms


def residual(name: str, model: ModelSpec, tokens: float) -> Op:
    size = BF16 * tokens * model.hidden
    return Op(name, "memory", bytes=3 * size, bwd_bytes=3 * size, cheap=True)


def flash_attention(
    name: str,
    flops: float,
    io: float,
    head_dim: float,
    kv_span: int = 0,
    query_rows: int = 0,
    sinks: bool = False,
) -> Op:
    """A flash-attention kernel: `flops` forward over the keys each query sees, `io` bytes of Q, K, V and
    output; backward does 2.5x the FLOPs (5 matmuls vs 2, Dao 2023) and moves twice the bytes. `kv_span`:
    the keys a query's loop covers where a sliding window or chunk bounds it; `query_rows`: batch x heads x
    queries on this GPU (the kernel's grid); `sinks`: a learned sink logit per head."""
    return Op(
        name,
        "attention",
        flops=flops,
        bytes=io,
        bwd_flops=2.5 * flops,
        bwd_bytes=2 * io,
        head_dim=head_dim,
        kv_span=kv_span,
        query_rows=query_rows,
        sinks=sinks,
    )


def gemm(
    name: str, m: float, n: int, k: int, fp8: bool = False, groups: int = 1, te_module: bool = True,
    splits: tuple[int, ...] = (),
) -> Op:
    """A GEMM (M, N, K); `groups` > 1 is a grouped GEMM of that many equal problems (MoE experts);
    `te_module`: issued through a Transformer Engine module (else plain PyTorch); `splits`: N run as
    separate linears of these widths (`Op.splits`)."""
    flops = 2.0 * m * n * k
    io = BF16 * (m * k + groups * k * n + m * n)
    return Op(
        name,
        "gemm",
        flops=flops,
        bytes=io,
        bwd_flops=2 * flops,
        bwd_bytes=2 * io,
        mnk=(int(m), n, k),
        fp8=fp8,
        groups=groups,
        te_module=te_module,
        splits=splits,
    )


# The fused column GEMMs that model code without fusion runs as several linears on one input
SPLIT_PROJECTIONS = ("qkv proj", "gate/up proj")


def tp_collectives(plan: Plan, where: str, act_bytes: float, column: str = "", row: str = "") -> list[Collective]:
    """Megatron TP around one column→row parallel pair: all-reduce fwd and bwd, or with sequence
    parallel an all-gather before and a reduce-scatter after (and their transposes in backward, plus,
    where the plan keeps only the local input, Megatron's re-gather of it for wgrad, overlapped with
    dgrad: `Plan.tp_keeps_gathered_input`). `column` and
    `row` name the pair's GEMMs: an overlapped all-gather feeds the column GEMM (forward; its transpose
    in backward leaves the column GEMM's dgrad), a reduce-scatter follows the row GEMM, and each hides
    under the GEMM it is split with ("": under the unit's GEMMs together)."""
    if plan.tp == 1:
        return []
    hide = "gemm" if plan.tp_comm_overlap else ""
    if not plan.sp:
        return [
            Collective(f"tp all-reduce {where}", "all_reduce", "tp", act_bytes, ph, hide, gemm_op=op)
            for ph, op in (("fwd", row), ("bwd", column))
        ]
    out = []
    for ph, (ag_op, rs_op) in (("fwd", (column, row)), ("bwd", (row, column))):
        out.append(Collective(f"tp all-gather {where}", "all_gather", "tp", act_bytes, ph, hide, gemm_op=ag_op))
        # the input gradient of split projections is a sum of matmuls, which no GEMM split hides
        rs_hide = "" if ph == "bwd" and plan.split_projections and column in SPLIT_PROJECTIONS else hide
        rs = Collective(f"tp reduce-scatter {where}", "reduce_scatter", "tp", act_bytes, ph, rs_hide, gemm_op=rs_op)
        out.append(rs)
    if not plan.tp_keeps_gathered_input:  # Megatron re-gathers its saved shard for wgrad, beside dgrad
        name = f"tp all-gather {where} input (wgrad)"
        out.append(Collective(name, "all_gather", "tp", act_bytes, "bwd", "gemm", gemm_op=column))
    return out
