"""HunyuanVideo's blocks as diffusers runs them: `HunyuanVideoTransformerBlock` (dual-stream: video and
text through their own weights, joint attention) and `HunyuanVideoSingleTransformerBlock` (the two
streams concatenated; q/k/v and the MLP input read the same normalised tokens, one output projection
over [attention, MLP]). These are the modules NeMo DFM's automodel trains (FSDP2, a flash-attention
backend); everything outside the GEMMs and the attention kernel is eager PyTorch, so each elementwise
step is its own kernel and keeps its own tensors for backward.

The elementwise regions are priced by the bytes their ATen ops read and write per element, forward and
backward (autograd's own ops: gradient sums at every fork, bias gradients, slice gradients):

    region (per element of its input)      fwd   bwd   ops
    LayerNorm (no affine) + modulate        12    20   layer_norm, x*(1+scale), +shift
    RMSNorm (diffusers, fp32 statistics)    34    90   to(fp32), pow, mean, rsqrt, x*r, to(bf16), *w
      + per token and head (fp32 r)         24    40   mean output, +eps, rsqrt, the read of r
    RoPE (real form, video q and k)         52    46   unbind, neg, stack, float(), *cos, *sin, +, to(bf16)
      + cos and sin tables read per token   8·hd  8·hd
    gated residual (r + y*gate)             10    18   the mul and add; backward: y*gate, sum(g*y), fork sum
    GELU (tanh)                              4     6
    cat (a fresh copy)                       4     0   backward hands each input a view
    split of a tensor two consumers read     0    12   slice_backward of each part (zeros + copy) and their sum
    gradient sum at a fork                   0     6
    bias gradient (per GEMM output)          0     2

tests/test_dit.py checks each block's totals, its saved tensors and its GEMM FLOPs against the diffusers
modules under PyTorch's dispatcher (FakeTensorMode).
"""

from __future__ import annotations

from dataclasses import replace

from shardscope.graph.attention import core_attention, cp_collectives
from shardscope.graph.common import ALL, BF16, FP32, NONE_ONLY, NOT_FULL, OpGroup, Shapes, gemm, tp_collectives
from shardscope.graph.ops import Op, Saved
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import Plan


def _eager(
    name: str, elems: float, fwd: float, bwd: float, launches: tuple[int, int] = (1, 1), aten: bool = False
) -> Op:
    """An eager elementwise region over `elems` elements at `fwd` / `bwd` bytes per element; `aten`: over
    broadcast or mixed-precision operands, so at `ATEN_HBM_FRACTION` (copies, sums and GELU stream as
    contiguous kernels do)."""
    fwd_k, bwd_k = launches
    return Op(
        name,
        "memory",
        bytes=fwd * elems,
        bwd_bytes=bwd * elems,
        cheap=True,
        launches=fwd_k,
        bwd_launches=bwd_k,
        aten=aten,
    )


def _norm_modulate(name: str, tokens: float, d: int) -> tuple[Op, list[Saved]]:
    """LayerNorm without affine, then x·(1 + scale) + shift: keeps its input's statistics, the normalised
    tensor (for the scale's gradient) and the modulated output (the next GEMMs' input)."""
    op = _eager(name, tokens * d, 12, 20, (3, 5), aten=True)
    return op, [
        Saved(f"{name} stats", 2 * FP32 * tokens, NONE_ONLY),
        Saved(f"{name} normalised", BF16 * tokens * d, NONE_ONLY),
        Saved(f"{name} out (GEMM input)", BF16 * tokens * d, NONE_ONLY),
    ]


def _qk_rmsnorm(name: str, tokens: float, nh: int, hd: int) -> tuple[Op, list[Saved]]:
    """diffusers' RMSNorm of q and k over each head: an fp32 copy (for pow), the bf16 input and the fp32
    1/rms (for x·r), and the normalised bf16 tensor (for the weight's gradient), per tensor."""
    elems, rows = 2 * tokens * nh * hd, 2 * tokens * nh
    op = Op(
        name,
        "memory",
        bytes=34 * elems + 24 * rows,
        bwd_bytes=90 * elems + 40 * rows,
        cheap=True,
        launches=16,
        bwd_launches=34,
        aten=True,
    )
    return op, [Saved(f"{name} fp32 copy, input and output", (FP32 + 2 * BF16) * elems + FP32 * rows, NONE_ONLY)]


def _rope(tokens: float, nh: int, hd: int) -> Op:
    """RoPE on the video tokens' q and k, in diffusers' real form (`apply_rotary_emb`, fp32 math)."""
    elems = 2 * tokens * nh * hd
    tables = 2 * 8 * hd * tokens
    fwd, bwd = 52 * elems + tables, 46 * elems + tables
    return Op("rope (video q, k)", "memory", bytes=fwd, bwd_bytes=bwd, cheap=True, launches=16, aten=True)


def _linear(name: str, m: float, n: int, k: int, fp8: bool) -> Op:
    """A `torch.nn.Linear` with bias (plain PyTorch: no Transformer Engine module)."""
    return gemm(name, m, n, k, fp8, te_module=False)


def _bias_grads(name: str, gemms: list[Op]) -> Op:
    """Backward's bias gradients: a sum over the tokens of each GEMM's output gradient."""
    outputs = sum(op.mnk[0] * op.mnk[1] for op in gemms)
    return Op(name, "memory", bwd_bytes=2 * outputs, launches=0, bwd_launches=len(gemms), cheap=True)


def _joint_attention(model: ModelSpec, plan: Plan, kind: LayerKind, nh: int) -> tuple[list[Op], list[Saved], list]:
    """Non-causal flash attention over this rank's video tokens and the sample's text tokens."""
    hd = model.head_dim
    joint = replace(plan, seq_len=plan.seq_len + model.dit.text_len * plan.cp)  # type: ignore[union-attr]
    tokens = Shapes.of(joint).t
    ops, saved = core_attention(model, joint, kind, nh, hd, hd)
    saved = [Saved("attention q, k, v, out", 4 * BF16 * tokens * nh * hd, NOT_FULL), *saved]
    return ops, saved, cp_collectives(joint, tokens, 2 * nh * hd, 4 * nh * hd)


def _fp8_elements(ops: list[Op]) -> tuple[float, float]:
    """Elements an FP8 recipe quantizes: each FP8 GEMM's input (forward) and output gradient (backward)."""
    gemms = [op for op in ops if op.kind == "gemm" and op.fp8]
    return sum(op.mnk[0] * op.mnk[2] for op in gemms), sum(op.mnk[0] * op.mnk[1] for op in gemms)


def _sizes(model: ModelSpec, plan: Plan) -> tuple[Shapes, float, float, int, int, int]:
    assert model.dit is not None
    sh = Shapes.of(plan)
    text = plan.micro_batch * model.dit.text_len  # every CP rank holds the sample's text tokens
    nh = model.heads // plan.tp
    return sh, sh.t, text, nh, nh * model.head_dim, model.ffn_hidden // plan.tp


def double_block(model: ModelSpec, plan: Plan, kind: LayerKind) -> tuple[OpGroup, float, float]:
    """`HunyuanVideoTransformerBlock` on one GPU for one micro-batch (and the elements FP8 quantizes)."""
    sh, video, text, nh, w, f = _sizes(model, plan)
    d, hd = model.hidden, model.head_dim
    ops: list[Op] = []
    saved: list[Saved] = [Saved("layer input", BF16 * (video + text) * d, ALL)]
    for stream, n in (("video", video), ("text", text)):
        nm, nm_saved = _norm_modulate(f"{stream} norm1", n, d)
        qkv = [_linear(f"{stream} {x} proj", n, w, d, sh.fp8) for x in "qkv"]
        qk, qk_saved = _qk_rmsnorm(f"{stream} q/k norm", n, nh, hd)
        ops += [nm, *qkv, _eager(f"{stream} q/k/v input grad sum", n * d, 0, 12, (0, 2)), qk]
        ops += [_rope(n, nh, hd)] if stream == "video" else []
        saved += nm_saved + qk_saved
    joint = video + text
    attn, attn_saved, cp_comms = _joint_attention(model, plan, kind, nh)
    ops += [_eager("joint q/k/v concat", 3 * joint * w, 4, 0, (3, 0)), *attn]
    ops += [_eager("joint attention out split", joint * w, 0, 12, (0, 3))]
    saved += attn_saved
    attn_ops = len(ops)
    for stream, n in (("video", video), ("text", text)):
        out = _linear(f"{stream} out proj", n, d, w, sh.fp8)
        nm, nm_saved = _norm_modulate(f"{stream} norm2", n, d)
        up, down = _linear(f"{stream} ff up", n, f, d, sh.fp8), _linear(f"{stream} ff down", n, d, f, sh.fp8)
        ops += [out, _eager(f"{stream} attn gated residual", n * d, 10, 18, (2, 5), aten=True), nm, up]
        ops += [_eager(f"{stream} gelu", n * f, 4, 6), down]
        ops += [_eager(f"{stream} ff gated residual", n * d, 10, 18, (2, 5), aten=True)]
        saved += [Saved(f"{stream} out proj output (gate input)", BF16 * n * d, NOT_FULL)]
        saved += [Saved(f"{stream} attn residual (norm2 input)", BF16 * n * d, NOT_FULL), *nm_saved]
        saved += [Saved(f"{stream} ff up output (gelu input)", BF16 * n * f, NOT_FULL)]
        saved += [Saved(f"{stream} gelu output (ff down input)", BF16 * n * f, NONE_ONLY)]
        saved += [Saved(f"{stream} ff down output (gate input)", BF16 * n * d, NOT_FULL)]
    ops.append(_bias_grads("bias gradients", [op for op in ops if op.kind == "gemm"]))
    comms = tp_collectives(plan, "attn", BF16 * joint * d) + tp_collectives(plan, "mlp", BF16 * joint * d) + cp_comms
    fi, fg = _fp8_elements(ops)
    return OpGroup(tuple(ops), tuple(saved), tuple(comms), attn_ops), fi, fg


def single_block(model: ModelSpec, plan: Plan, kind: LayerKind) -> tuple[OpGroup, float, float]:
    """`HunyuanVideoSingleTransformerBlock` on one GPU for one micro-batch (and the elements FP8 quantizes)."""
    sh, video, text, nh, w, f = _sizes(model, plan)
    d, hd = model.hidden, model.head_dim
    n = video + text
    nm, nm_saved = _norm_modulate("norm", n, d)
    mlp_in = _linear("mlp in proj", n, f, d, sh.fp8)
    qkv = [_linear(f"{x} proj", n, w, d, sh.fp8) for x in "qkv"]
    qk, qk_saved = _qk_rmsnorm("q/k norm", n, nh, hd)
    ops: list[Op] = [
        _eager("video|text concat", n * d, 4, 0),
        nm,
        _eager("norm out grad sum", n * d, 0, 6, (0, 1)),
        mlp_in,
        _eager("gelu", n * f, 4, 6),
        # the attention processor splits the normalised tokens into video and text and concatenates them again
        _eager("attention input split + concat", n * d, 4, 12, (1, 3)),
        *qkv,
        _eager("q/k/v input grad sum", n * d, 0, 12, (0, 2)),
        qk,
        _rope(video, nh, hd),
        _eager("q/k rope concat", 2 * n * w, 4, 12, (2, 6)),
    ]
    attn, attn_saved, cp_comms = _joint_attention(model, plan, kind, nh)
    ops += attn
    attn_ops = len(ops)
    out = _linear("out proj", n, d, w + f, sh.fp8)
    ops += [
        _eager("attention out split + concat", n * w, 4, 12, (1, 3)),
        _eager("attention|mlp concat", n * (w + f), 4, 0),
        out,
        _eager("gated residual", n * d, 10, 18, (2, 5), aten=True),
        _eager("video|text output split", n * d, 0, 12, (0, 3)),
    ]
    ops.append(_bias_grads("bias gradients", [op for op in ops if op.kind == "gemm"]))
    saved = [
        Saved("layer input (video|text concat)", BF16 * n * d, ALL),
        *nm_saved,
        Saved("attention input (concat copy)", BF16 * n * d, NONE_ONLY),
        Saved("mlp in output (gelu input)", BF16 * n * f, NOT_FULL),
        *qk_saved,
        *attn_saved,
        Saved("attention|mlp concat (out proj input)", BF16 * n * (w + f), NOT_FULL),
        Saved("out proj output (gate input)", BF16 * n * d, NOT_FULL),
    ]
    comms = tp_collectives(plan, "attn", BF16 * n * d) + cp_comms
    fi, fg = _fp8_elements(ops)
    return OpGroup(tuple(ops), tuple(saved), tuple(comms), attn_ops), fi, fg
