"""FP8 training recipes: which GEMMs run in FP8, the quantization traffic, and the FP8 copies in memory.

Transformer Engine / torchao recipes run every linear of a transformer block in FP8 (forward, dgrad,
wgrad); the output layer, embedding and attention stay in BF16 (Megatron-Core and torchtitan defaults).

Quantization traffic per element, in bytes (read + write), from what the kernels do:
  tensorwise (current scaling): an amax pass (read 2) then the cast (read 2, write 1)        = 5
  rowwise (torchao): the same per row; backward quantizes the high-precision input again along the
  other axis (amax and cast, 5) instead of transposing an FP8 copy, and the output gradient once per
  axis (dgrad scales it along rows, wgrad along columns: torchao `matmul_with_hp_or_float8_args`)  = 5
  delayed scaling: amax fused into the cast with last steps' scale (read 2, write 1)         = 3
  blockwise (Hopper 1x128 / 128x128) and MXFP8 (Blackwell, 1x32): one pass that writes the
  row-wise and column-wise FP8 copies with their scales (read 2, write 2)                      = 4
Backward quantizes each output gradient the same way; on Hopper per-tensor FP8 GEMMs only accept the
TN layout, so wgrad needs transposed FP8 copies of the saved input (read 1, write 1 = 2).
"""

from __future__ import annotations

from shardscope.plan.plan import Plan

CAST_BYTES = {"tensorwise": 5.0, "rowwise": 5.0, "delayed": 3.0, "blockwise": 4.0, "mxfp8": 4.0}
TRANSPOSE_BYTES = 2.0
# Kernels that quantize one GEMM operand: current ("tensorwise") scaling zeroes the amax, reduces it,
# computes the scale and casts; the other recipes cast in one kernel (Transformer Engine 2.9).
QUANT_KERNELS = {"tensorwise": 4, "rowwise": 4, "delayed": 1, "blockwise": 1, "mxfp8": 1}


def needs_transpose(plan: Plan, arch: str) -> bool:
    return arch == "hopper" and plan.fp8_recipe in ("tensorwise", "delayed")


def quantization_bytes(plan: Plan, arch: str, input_elems: float, grad_elems: float) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the casts around a block's FP8 GEMMs."""
    cast = CAST_BYTES[plan.fp8_recipe]
    fwd = cast * input_elems
    bwd = cast * grad_elems + (TRANSPOSE_BYTES * input_elems if needs_transpose(plan, arch) else 0.0)
    if plan.fp8_recipe == "rowwise":  # the input and the output gradient quantized along their other axis
        bwd += cast * (input_elems + grad_elems)
    return fwd, bwd


# Scale bytes per weight element of one FP8 copy: Transformer Engine's Float8BlockScaling quantizes weights
# in 128x128 blocks (`w_block_scaling_dim = 2`, one fp32 scale each); MXFP8 gives every 32 elements along
# a copy's rows one E8M0 byte.
WEIGHT_SCALE_BYTES = {"blockwise": 4.0 / (128 * 128), "mxfp8": 1.0 / 32}


def weight_copy_bytes_per_param(plan: Plan, arch: str) -> float:
    """FP8 copies of the weights kept for the step: the FP8 tensor, plus its transpose (Hopper
    per-tensor) or its column-wise copy (block/MX scaling, each copy with its scales)."""
    if plan.fp8_recipe in WEIGHT_SCALE_BYTES:
        return 2.0 * (1.0 + WEIGHT_SCALE_BYTES[plan.fp8_recipe])
    if plan.fp8_recipe == "rowwise":
        return 2.0
    return 2.0 if needs_transpose(plan, arch) else 1.0
