"""How the stack runs a layer's elementwise regions and GEMMs: the fused kernels the op builders assume
(Transformer Engine norms, Megatron's fused RoPE, TE GEMM modules), or PyTorch-native model code.

Eager PyTorch model code (torchtitan, Hugging Face, NeMo AutoModel without `torch.compile`) runs an RMSNorm
and a RoPE as chains of ATen kernels, each reading and writing the whole tensor, several in fp32:
  * RMSNorm (`F.rms_norm`'s composite, as `nn.RMSNorm` and HF's `LlamaRMSNorm` write it): upcast to fp32,
    pow, mean, add eps, rsqrt, multiply, multiply by the weight, cast back: 8 kernels and 40 bytes per bf16
    element forward (2+4 cast, 4+4 pow, 4 mean, 4+4 normalise, 4+4 weight, 4+2 cast back); autograd's
    backward through them is 14 kernels and about 88 bytes per element, and autograd keeps the fp32 input
    and the fp32 normalised tensor (8 bytes per element) where the fused kernel keeps only its statistics.
  * RoPE as complex multiplication (torchtitan `apply_rotary_emb`: upcast, view as complex, multiply by
    the frequencies, cast back), for q and k each: 3 kernels, 20 bytes per element, forward and backward
    alike; nothing extra saved (the frequencies are constants).
`torch.compile` fuses each chain into one Triton kernel at the fused rates and keeps what its partitioner
keeps (the fused accounting), except complex-number RoPE, which Inductor leaves eager (`Plan.complex_rope`).
Measured on one H100 (validation/eager_regions_h100.json, 8192 tokens of Llama-3.1-8B): the pre-2.9
composite RMSNorm 0.58 ms forward and 1.53 backward (these figures at the eager-ATen rate: 0.72, 1.57),
keeping 8 bytes per element; torchtitan's complex RoPE on q and k 0.43 and 0.51 (0.45, 0.45).
Plain `nn.Linear` GEMMs are issued by PyTorch, not Transformer Engine
(`Op.te_module`), which sets their host cost (costs.host).
"""

from __future__ import annotations

from shardscope.graph.common import BF16, FP32, NONE_ONLY, OpGroup
from shardscope.graph.ops import Op, Saved
from shardscope.plan.plan import Plan
from shardscope.records import evolve

RMSNORM_EAGER = {"fwd_bytes": 40, "bwd_bytes": 88, "fwd_kernels": 8, "bwd_kernels": 14, "saved_bytes": 2 * FP32}
ROPE_EAGER = {"fwd_bytes": 20, "bwd_bytes": 20, "kernels": 3}


def _eager(op: Op, norms: bool, rope: bool, rmsnorm: bool) -> tuple[Op, list[Saved]]:
    if op.role == "norm" and rmsnorm and norms:
        elems = op.bytes / (2 * BF16)  # the fused kernel reads and writes each element once
        e = RMSNORM_EAGER
        chain = evolve(
            op, bytes=e["fwd_bytes"] * elems, bwd_bytes=e["bwd_bytes"] * elems, launches=e["fwd_kernels"],
            bwd_launches=e["bwd_kernels"], aten=True,
        )  # fmt: skip
        return chain, [Saved(f"{op.name} fp32 input and normalised", e["saved_bytes"] * elems, NONE_ONLY)]
    if op.role == "rope" and rope:
        elems = op.bytes / (2 * BF16)
        r = ROPE_EAGER
        chain = evolve(
            op, bytes=r["fwd_bytes"] * elems, bwd_bytes=r["bwd_bytes"] * elems, launches=2 * r["kernels"],
            bwd_launches=2 * r["kernels"], aten=True,
        )  # fmt: skip
        return chain, []
    return op, []


def as_the_stack_runs(group: OpGroup, plan: Plan, rmsnorm: bool) -> OpGroup:
    """`group` with its norms and RoPE as eager ATen chains (`Plan.eager_chains`) and its GEMMs issued by
    plain PyTorch (`Plan.linear_impl` "torch")."""
    eager, rope, torch_linear = plan.eager_chains, plan.eager_chains or plan.complex_rope, plan.linear_impl == "torch"
    if not (eager or rope or torch_linear):
        return group
    ops: list[Op] = []
    extra: list[Saved] = []
    for op in group.ops:
        op, saved = _eager(op, eager, rope, rmsnorm)
        extra += saved
        if torch_linear and op.kind == "gemm" and op.te_module:
            op = evolve(op, te_module=False)
        ops.append(op)
    return OpGroup(tuple(ops), group.saved + tuple(extra), group.comms, group.attn_ops)
