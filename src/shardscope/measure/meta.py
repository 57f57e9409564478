"""Build a transformers causal LM on the meta device from a config and measure it.

On the meta device tensors have shapes and dtypes but no storage: building a 70B model takes no memory,
and a forward + backward runs every op's shape logic without computing anything. What is read:

- the exact parameter count (shared tensors, tied embeddings, counted once);
- the standard block fields of `ModelSpec` from the module tree: hidden size and vocabulary from the input
  embedding, query and key/value widths from the attention projections, the FFN size and gating from the
  MLP projections, norm kind and biases from the norm and linear modules, position kind from the rotary or
  position-embedding modules (neither: ALiBi where the modeling code builds an ALiBi bias);
- per decoder layer, forward and backward FLOPs (`torch.utils.flop_counter`'s formulas, per aten op),
  saved-activation bytes (`saved_tensors_hooks`) and the forward GEMM shapes (aten.mm / addmm), at two
  small sequence lengths: each quantity is a·s + b·s² per sequence, the s² part being the eager attention's
  score matrices, the linear part everything else;
- whether the MLP reads its input independently of the attention output (the parallel block).

Mixture-of-experts blocks: transformers' default ("eager") experts loop over the experts a batch routes
to (`nonzero`), a data-dependent shape the meta device cannot run. They are measured with transformers'
"batched_mm" experts implementation instead: each token-expert pair gathers its expert's weights and
multiplies them (a batched matrix-vector product), with no data-dependent shape. Every token runs top-k
experts whichever they are, so the FLOPs per token are the model's exact ones for any routing (the meta
device's arbitrary routing, a balanced one, a skewed one alike); the per-pair products are recorded as
the experts' grouped GEMM (`expert_gemms`: top-k rows per token), and the gathered weight copies, which a
grouped GEMM reads in place, are not counted as saved activations. How tokens spread over the experts
(the hottest rank's load) is the estimator's routing model (`graph.routing`), not measured here.

Blocks the standard fields cannot describe are measured as kinds of their own, named by their parts
(`JambaMambaMixer+JambaSparseMoeBlock`, `NemotronHMamba2Mixer`), and priced wholly from the measurement
(`graph.measured.whole_block_group`): a Mamba/SSM mixer (a depthwise Conv1d or an `A_log` decay), a layer the
config's `layer_types` calls linear attention, an attention or an MLP alone (Nemotron-H), and every block of
a model whose attention + MLP blocks the fields cannot read (RWKV; dense and MoE blocks mixed). Blocks alike
are those of the same modules and parameter shapes. Besides FLOPs and GEMMs such a kind records the
activation bytes its GEMMs read and write (the traffic of the fused kernels between them), the FLOPs of its
products over an s x s matrix (an attention's scores: its s² part), its experts, and, without attention,
its FLOPs as a·s + c (a scan's per-sequence start). Such models are measured at 64 and 128 tokens, or at one
and two of the scan's chunks (`chunk_size`), where a chunked scan's cost is linear in the tokens.

Nothing here runs a checkpoint's own code unless the caller allows it (`trust_remote_code`).
"""

from __future__ import annotations

import inspect
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from shardscope.errors import ShardscopeError, warn
from shardscope.measure.cache import SCHEMA

# Sequence lengths of the two measuring passes (batch 1): small, since every quantity is a·s + b·s².
SEQ_LENS = (128, 256)
# ... of a model with blocks priced from their measurement (`_seq_lens`); multiples of the 64-token chunks
# of transformers' reference gated-DeltaNet code (Qwen3-Next), whose chunk the config does not state
SSM_SEQ_LENS = (64, 128)
_ATTN_WORDS = ("attn", "attention")
_aten = torch.ops.aten
_GEMMS = {_aten.mm, _aten.addmm}


def build_meta_model(cfg: dict[str, Any], source_dir: Path | None = None, trust_remote_code: bool = False) -> nn.Module:
    """The causal LM transformers builds from `cfg`, on the meta device, with eager attention (so that the
    attention's matmuls are aten ops the meter sees)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = cfg.get("model_type")
    native = isinstance(model_type, str) and model_type in CONFIG_MAPPING
    try:
        if native:
            try:
                config = AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items() if k != "model_type"})
            except Exception as exc:  # the config class's own validation (huggingface_hub's strict dataclasses)
                lines = [x.strip() for x in str(exc).splitlines() if x.strip()] or [type(exc).__name__]
                raise ShardscopeError(f"transformers rejects the config: {lines[-1]}") from None
        elif not trust_remote_code:
            raise ShardscopeError(
                f"not built into transformers {transformers.__version__}; its code ships with the checkpoint "
                "(auto_map): pass --trust-remote-code to run it"
            )
        elif source_dir is None:
            raise ShardscopeError("its modeling code ships with the checkpoint: give the checkpoint folder")
        else:
            config = AutoConfig.from_pretrained(source_dir, trust_remote_code=True)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(
                config,
                attn_implementation="eager",
                dtype=torch.bfloat16,
                trust_remote_code=not native,
                **({"experts_implementation": "batched_mm"} if native else {}),  # MoE: no data-dependent shapes
            )
    except ShardscopeError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, OSError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShardscopeError(f"transformers cannot build it as a causal LM: {first}") from None


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The ModuleList of the decoder blocks: the largest list holding `num_hidden_layers` modules."""
    count = getattr(model.config, "num_hidden_layers", None)
    found = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.ModuleList) and len(mod) == count and count
    ]
    if not found:
        raise ShardscopeError(f"{type(model).__name__}: no list of {count} decoder layers in the module tree")
    return max(found, key=lambda item: sum(p.numel() for p in item[1].parameters()))


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _is_attention(path: str) -> bool:
    return any(word in part.lower() for part in path.split(".") for word in _ATTN_WORDS)


def _linears(layer: nn.Module) -> tuple[list[tuple[str, nn.Linear]], list[tuple[str, nn.Linear]]]:
    """(attention, other) linear modules of a block, by their path (`self_attn.q_proj`, `mlp.fc1`)."""
    attn, other = [], []
    for path, mod in layer.named_modules():
        if isinstance(mod, nn.Linear):
            (attn if _is_attention(path) else other).append((path, mod))
    return attn, other


def _norms(layer: nn.Module) -> list[tuple[str, nn.Module]]:
    """Norm modules (nn.LayerNorm and the per-family RMSNorm classes), by class name."""
    return [(p, m) for p, m in layer.named_modules() if "norm" in type(m).__name__.lower()]


def read_structure(
    model: nn.Module, layers: Sequence[nn.Module], order: list[str], count: int | None = None
) -> dict[str, Any]:
    """The standard ModelSpec fields of a dense decoder, read from the built module tree; `layers`: its
    standard attention + MLP blocks (all of them but a hybrid's others), `count` all its blocks; `order`:
    the paths of the first block's linear modules in the order they ran (the last of the attention's and
    of the MLP's is its output projection)."""
    config = model.config
    count = len(layers) if count is None else count
    emb = model.get_input_embeddings()
    hidden, vocab = emb.embedding_dim, emb.num_embeddings
    layer = layers[0]
    name = type(model).__name__
    attn, other = _linears(layer)
    moe = _moe_structure(model, layers, hidden, other)
    ran = {p: i for i, p in enumerate(order)}
    attn_ran = sorted((x for x in attn if x[0] in ran), key=lambda x: ran[x[0]])
    mlp_ran = sorted((x for x in other if x[0] in ran), key=lambda x: ran[x[0]])
    attn_out = [attn_ran[-1][1]] if attn_ran else []
    mlp_out = [mlp_ran[-1][1]] if mlp_ran else []
    attn_in = [m for _, m in attn if m.in_features == hidden and m not in attn_out]
    mlp_in = [m for _, m in other if m.in_features == hidden and m not in mlp_out]
    if moe:  # the MLP is the experts (checked in _moe_structure); the attention is checked as a dense one's
        mlp_out, mlp_in = attn_out, attn_in
    if not (attn_out and mlp_out and attn_in and mlp_in) or {attn_out[0].out_features, mlp_out[0].out_features} != {
        hidden
    }:
        raise ShardscopeError(
            f"{name}: the block is not a standard attention + MLP block (attention projections "
            f"{[p for p, _ in attn]}, others {[p for p, _ in other]}); measuring it is not supported yet"
        )
    q_dim = attn_out[0].in_features
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = int(getattr(config, "head_dim", 0) or 0) or (q_dim // heads if heads else 0)
    kv_total = sum(m.out_features for m in attn_in) - q_dim
    if not heads or not head_dim or q_dim != heads * head_dim or kv_total <= 0 or kv_total % (2 * head_dim):
        raise ShardscopeError(
            f"{name}: attention widths (q {q_dim}, q+k+v {q_dim + kv_total}) do not split into "
            f"{heads} heads of {head_dim}"
        )
    ffn = moe["expert_ffn"] if moe else mlp_out[0].in_features
    up = moe.pop("up") if moe else sum(m.out_features for m in mlp_in)
    if up not in (ffn, 2 * ffn):
        raise ShardscopeError(f"{name}: MLP input width {up} is neither the FFN size {ffn} nor a gated 2x{ffn}")
    norms = _norms(layer)
    # LayerNorm subtracts the mean (nn.LayerNorm, or a family's own: OLMo's parameter-free, Cohere's
    # bias-free); RMSNorm does not (Llama-style classes, which some families name "...LayerNorm" too).
    layernorm = any(
        isinstance(m, nn.LayerNorm)
        or ("layernorm" in type(m).__name__.lower() and "rms" not in type(m).__name__.lower())
        for _, m in norms
    )
    block_norms = [m for p, m in norms if not _is_attention(p)]
    qk_norm = any(_is_attention(p) and _params(m) in (head_dim, 2 * head_dim) for p, m in norms)
    out_emb = model.get_output_embeddings()
    tied = out_emb is not None and out_emb.weight is emb.weight
    rope = any("rotary" in type(m).__name__.lower() for m in model.modules())
    # A position table: an embedding of width `hidden` other than the token embedding (OPT keeps 2 extra rows).
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding) and m is not emb and m.embedding_dim == hidden]
    if rope:
        position, rows = "rope", 0
    elif tables:
        position, rows = "learned", sum(m.num_embeddings for m in tables)
    else:  # neither rotary nor a table: ALiBi where the modeling code builds it (BLOOM, MPT, Falcon-RW)
        source = inspect.getsource(sys.modules[type(model).__module__])
        position, rows = ("alibi" if "alibi" in source.lower() else "learned"), 0
    return dict(
        hidden=hidden,
        layers=count,
        heads=heads,
        kv_heads=kv_total // (2 * head_dim),
        head_dim=head_dim,
        ffn_hidden=ffn,
        vocab=vocab,
        mlp="swiglu" if up == 2 * ffn else "gelu",
        norm="layernorm" if layernorm else "rmsnorm",
        norm_bias=any(getattr(m, "bias", None) is not None for m in block_norms),
        qkv_bias=any(m.bias is not None for m in attn_in),
        out_bias=attn_out[0].bias is not None,
        mlp_bias=moe.pop("bias") if moe else any(m.bias is not None for m in mlp_in + mlp_out),
        qk_norm=qk_norm,
        tied_embeddings=tied,
        lm_head_bias=out_emb is not None and getattr(out_emb, "bias", None) is not None,
        position=position,
        pos_embedding_rows=rows,
        **_attention_layout(config, count),
    ) | ({"moe": moe} if moe else {})


def _experts_module(layer: nn.Module) -> nn.Module | None:
    """The module of a block holding the experts' stacked (3-D) weights, or None (a dense block)."""
    return next(
        (
            m
            for m in layer.modules()
            if not isinstance(m, nn.Conv1d)  # a Mamba mixer's depthwise convolution
            and any(p.dim() == 3 and p.shape[0] > 1 for p in m.parameters(recurse=False))  # not RWKV's (1, 1, h)
        ),
        None,
    )


def _moe_structure(
    model: nn.Module, layers: Sequence[nn.Module], hidden: int, other: list[tuple[str, nn.Linear]]
) -> dict[str, Any]:
    """The MoESpec fields of a block whose experts are stacked weights (transformers' Mixtral, Qwen2/3-MoE,
    OLMoE layout), read from the weights' shapes: experts, the expert FFN size (and whether gated: the up
    width), top-k (`num_experts_per_tok`), a shared expert (Qwen2-MoE: linears under a "shared" path); {} for
    a dense block. Blocks that mix dense and MoE layers, or keep each expert as its own modules, are refused."""
    name = type(model).__name__
    found = [_experts_module(layer) for layer in layers]
    experts = found[0]
    if any(m is not None for m in found) and any(m is None for m in found):
        raise ShardscopeError(f"{name}: dense and mixture-of-experts blocks mixed; measuring them is not supported yet")
    if experts is None:
        if any("expert" in p.lower() for layer in layers for p, _ in layer.named_modules()):
            raise ShardscopeError(f"{name}: experts kept as separate modules; measuring them is not supported yet")
        return {}
    weights = dict(experts.named_parameters(recurse=False))
    down, up = weights.get("down_proj"), weights.get("gate_up_proj", weights.get("up_proj"))
    top_k = int(getattr(model.config, "num_experts_per_tok", 0) or 0)
    if down is None or up is None or down.dim() != 3 or up.dim() != 3 or not top_k or hidden not in down.shape[1:]:
        raise ShardscopeError(f"{name}: expert weights {sorted(weights)} are not a known layout; not supported yet")
    ffn = down.shape[2] if down.shape[1] == hidden else down.shape[1]  # (E, h, f), or transposed (E, f, h)
    up_width = up.shape[1] if up.shape[2] == hidden else up.shape[2]
    shared = [m for p, m in other if "shared" in p.lower() and m.out_features == hidden]
    return dict(
        experts=int(down.shape[0]),
        top_k=top_k,
        expert_ffn=int(ffn),
        shared_experts=len(shared),
        shared_ffn=shared[0].in_features if shared else 0,
        normalize_top_k=bool(getattr(model.config, "norm_topk_prob", True)),
        up=int(up_width),  # read by read_structure (gated or not), not a MoESpec field
        bias=any(n.endswith("bias") for n in weights),
    )


def _attention_layout(config: Any, layers: int) -> dict[str, Any]:
    """Per-layer attention kind from the config's `layer_types` (transformers' standard field: Gemma-2/3,
    Qwen3, GPT-OSS) or a model-wide `sliding_window`; the window or chunk size."""
    window = int(getattr(config, "sliding_window", 0) or 0)
    chunk = int(getattr(config, "attention_chunk_size", 0) or 0)
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) == layers:
        kinds = ["window" if "sliding" in str(t) else "chunk" if "chunk" in str(t) else "full" for t in types]
    elif window and getattr(config, "use_sliding_window", True) is not False:
        kinds = ["window"] * layers
    else:
        kinds = ["full"] * layers
    size = chunk if "chunk" in kinds else window if "window" in kinds else 0
    if not size:
        kinds = ["full"] * layers
    pattern = [] if len(set(kinds)) == 1 and (kinds[0] == "window") == bool(size) else kinds
    return dict(attention_window=size, attention_pattern=pattern)


class _Meter(TorchDispatchMode):
    """Counts each aten op's FLOPs (the flop counter's formulas) against the decoder layer running it, in
    forward or backward, and records the forward GEMM shapes (M, N, K)."""

    def __init__(self, seq: int = 0) -> None:
        super().__init__()
        self.seq = seq  # tokens of the pass: a batched product over fewer rows is not the experts'
        self.registry = FlopCounterMode(display=False).flop_registry
        self.layer: int | None = None  # the decoder layer whose ops run now (None: embedding, head, loss)
        self.backward = False
        self.flops: defaultdict[tuple[int | None, bool], float] = defaultdict(float)
        self.gemms: defaultdict[int | None, Counter[tuple[int, int, int]]] = defaultdict(Counter)
        # batched matrix-vector products of gathered expert weights: (token-expert pairs, N, K)
        self.experts: defaultdict[int | None, Counter[tuple[int, int, int]]] = defaultdict(Counter)
        # forward bytes of the activations the GEMMs read and write (inputs and outputs, not weights): what
        # the fused elementwise and scan kernels between them read and write (`graph.measured`)
        self.io: defaultdict[int | None, float] = defaultdict(float)
        # forward FLOPs of products over an s x s matrix: eager attention's scores (or a scan's chunk, where
        # the chunk is the pass's length: `measure_config` reads them at the longer pass)
        self.scores: defaultdict[int | None, float] = defaultdict(float)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in self.registry:
            self.flops[(self.layer, self.backward)] += self.registry[packet](*args, **kwargs, out_val=out)
            if packet in _GEMMS and not self.backward:
                a, b = (args[0], args[1]) if packet is _aten.mm else (args[1], args[2])
                self.gemms[self.layer][(a.shape[0], b.shape[1], a.shape[1])] += 1
                self.io[self.layer] += (a.numel() + out.numel()) * out.element_size()
            square = (self.seq, self.seq)
            if packet in (_aten.bmm, _aten.baddbmm) and not self.backward:
                a = args[0] if packet is _aten.bmm else args[1]
                if tuple(out.shape[-2:]) == square or tuple(a.shape[-2:]) == square:  # QK^T, or PV over the scores
                    self.scores[self.layer] += self.registry[packet](*args, **kwargs, out_val=out)
            if packet is _aten.bmm and not self.backward:
                a, b = args[0], args[1]
                pairs = a.shape[0] >= self.seq  # one product per token-expert pair (not a scan's per-step one)
                shape = None
                if pairs and b.shape[2] == 1:  # (pairs, N, K) weights @ (pairs, K, 1) inputs
                    shape = (a.shape[0], a.shape[1], a.shape[2])
                elif pairs and a.shape[1] == 1:  # (pairs, 1, K) inputs @ (pairs, K, N) transposed weights
                    shape = (a.shape[0], b.shape[2], a.shape[2])
                if shape:
                    self.experts[self.layer][shape] += 1
                    self.io[self.layer] += shape[0] * (shape[1] + shape[2]) * out.element_size()
        return out


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def _reaches(start: Any, target: Any, limit: int = 5000) -> bool:
    """Whether autograd node `target` is upstream of node `start` (the value at `start` depends on it)."""
    seen, todo = set(), [start]
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or node in seen:
            continue
        if node is target:
            return True
        seen.add(node)
        todo.extend(n for n, _ in node.next_functions)
    return False


def _gathered_weights(t: torch.Tensor) -> bool:
    """Whether `t` is rows gathered from a parameter (`weight[expert_ids]`: the batched experts' copies)."""
    node = t.grad_fn
    return (
        node is not None
        and type(node).__name__.startswith("Index")
        and any(n is not None and type(n).__name__ == "AccumulateGrad" for n, _ in node.next_functions)
    )


def _measure_pass(model: nn.Module, layers: nn.ModuleList, seq: int, probed: int = 0) -> dict[str, Any]:
    """One forward + backward of a batch of one `seq`-token sequence with a loss; per layer: FLOPs
    (forward, backward), saved-activation bytes, forward GEMM shapes and the bytes of the activations they
    read and write (with the block's input and output); and whether layer `probed` is a parallel block."""
    meter = _Meter(seq)
    params = {id(p) for p in model.parameters()}
    saved: defaultdict[int | None, float] = defaultdict(float)
    kept: dict[int, torch.Tensor] = {}  # each saved storage once (views of one tensor share it)
    handles = []
    probe: dict[str, Any] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t
        while base._base is not None:
            base = base._base
        if id(base) not in params and id(base) not in kept and not meter.backward and not _gathered_weights(base):
            kept[id(base)] = base
            saved[meter.layer] += base.numel() * base.element_size()
        return t

    for i, layer in enumerate(layers):

        def enter(mod: nn.Module, args: tuple, kwargs: dict, i: int = i) -> None:
            meter.layer = i
            x = _first_tensor(args) if args else kwargs.get("hidden_states")
            if isinstance(x, torch.Tensor):  # the block reads its input and writes its output once
                meter.io[i] += 2 * x.numel() * x.element_size()
            if isinstance(x, torch.Tensor) and x.requires_grad:
                # fires when the gradient of the layer's input is complete: its backward is done
                x.register_hook(lambda g, i=i: setattr(meter, "layer", None) if meter.layer == i else None)

        def leave(mod: nn.Module, args: tuple, output: Any, i: int = i) -> None:
            meter.layer = None
            y = _first_tensor(output)
            if isinstance(y, torch.Tensor) and y.requires_grad:  # its gradient arrives: the backward begins
                y.register_hook(lambda g, i=i: setattr(meter, "layer", i))

        handles.append(layer.register_forward_pre_hook(enter, with_kwargs=True))
        handles.append(layer.register_forward_hook(leave))
    # Parallel block probe on layer `probed`: the attention output projection's output and the MLP's input.
    # Its linear modules in the order they run, with the autograd nodes of their input and output.
    for path, m in layers[probed].named_modules():
        if isinstance(m, nn.Linear):

            def seen(mod: nn.Module, args: tuple, out: torch.Tensor, path: str = path) -> None:
                probe.setdefault(path, (args[0].grad_fn, out.grad_fn))

            handles.append(m.register_forward_hook(seen))
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    try:
        with meter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
            meter.backward, meter.layer = True, None
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    # Parallel: the MLP's first projection reads nothing computed from the attention's output projection.
    attn = [p for p in probe if _is_attention(p)]
    mlp = [p for p in probe if not _is_attention(p)]
    parallel = bool(attn and mlp) and not _reaches(probe[mlp[0]][0], probe[attn[-1]][1])
    n = len(layers)
    return dict(
        fwd=[meter.flops[(i, False)] for i in range(n)],
        bwd=[meter.flops[(i, True)] for i in range(n)],
        saved=[saved[i] for i in range(n)],
        gemms=[meter.gemms[i] for i in range(n)],
        experts=[meter.experts[i] for i in range(n)],
        io=[meter.io[i] for i in range(n)],
        scores=[meter.scores[i] for i in range(n)],
        other_fwd=meter.flops[(None, False)],
        other_bwd=meter.flops[(None, True)],
        parallel=parallel,
        order=list(probe),
    )


def _is_ssm(layer: nn.Module) -> bool:
    """A block holding a state-space (Mamba) mixer: its causal depthwise convolution or its A_log decay."""
    return any(isinstance(m, nn.Conv1d) for m in layer.modules()) or any(
        n.endswith("A_log") for n, _ in layer.named_parameters()
    )


def _is_standard(layer: nn.Module) -> bool:
    """An attention + MLP (or experts) block the standard fields describe; anything else (a Mamba mixer, an
    attention or an MLP alone, a parallel attention + Mamba) is priced wholly from what was measured."""
    attn, other = _linears(layer)
    return not _is_ssm(layer) and bool(attn) and bool(other or _experts_module(layer) is not None)


def _signature(layer: nn.Module) -> tuple:
    """Blocks alike: the same modules holding parameters of the same shapes (one class may hold a Mamba,
    an attention or an MLP mixer: Nemotron-H's, Bamba's blocks)."""
    return tuple(
        (path, type(m).__name__, tuple(tuple(p.shape) for p in m.parameters(recurse=False)))
        for path, m in layer.named_modules()
    )


def _label(layer: nn.Module) -> str:
    """A measured block's name: the classes of its parts besides its norms (`JambaMambaMixer+JambaMLP`)."""
    parts = [
        type(m).__name__
        for _, m in layer.named_children()
        if _params(m) and "norm" not in type(m).__name__.lower() and not isinstance(m, nn.Linear)
    ]
    return "+".join(parts) or type(layer).__name__


def _placeholder_structure(model: nn.Module, count: int) -> dict[str, Any]:
    """The standard fields of a model without an attention + MLP block (Mamba): the embedding, the final
    norm and the output layer are read; the block fields, which no block uses (every block is priced from
    its measurement), are the smallest valid ones."""
    emb = model.get_input_embeddings()
    hidden, vocab = emb.embedding_dim, emb.num_embeddings
    out_emb = model.get_output_embeddings()
    norms = [m for _, m in _norms(model) if _params(m) in (hidden, 2 * hidden)]
    layernorm = any(isinstance(m, nn.LayerNorm) for m in norms)
    return dict(
        hidden=hidden,
        layers=count,
        heads=1,
        kv_heads=1,
        head_dim=hidden,
        ffn_hidden=hidden,
        vocab=vocab,
        norm="layernorm" if layernorm else "rmsnorm",
        norm_bias=layernorm and any(getattr(m, "bias", None) is not None for m in norms),
        tied_embeddings=out_emb is not None and out_emb.weight is emb.weight,
        lm_head_bias=out_emb is not None and getattr(out_emb, "bias", None) is not None,
        position="learned",
        pos_embedding_rows=0,
        attention_window=0,
        attention_pattern=[],
    )


def _seq_lens(model: nn.Module, measured: bool) -> tuple[int, int]:
    """The two measuring lengths: SEQ_LENS; with blocks priced from their measurement, shorter ones (eager
    Mamba runs its scan one token at a time: hundreds of ops per token), or with a chunked state-space scan
    (Mamba-2's SSD) one and two chunks, over which its cost is linear in the tokens as at any multiple of
    the chunk."""
    if not measured:
        return SEQ_LENS
    config = model.config
    keys = ("chunk_size", "mamba_chunk_size", "block_size")  # Mamba-2, Falcon-H1/Bamba, MiniMax's lightning attention
    chunk = next((int(getattr(config, k, 0) or 0) for k in keys if hasattr(config, k)), 0)
    return (chunk, 2 * chunk) if chunk > 0 else SSM_SEQ_LENS


def _line(v1: float, v2: float, s1: int, s2: int) -> tuple[float, float]:
    """(a, c) with a·s + c through (s1, v1) and (s2, v2): per-token and per-sequence parts."""
    a = (v2 - v1) / (s2 - s1)
    return a, v1 - a * s1


def _fit(v1: float, v2: float, s1: int, s2: int) -> list[float]:
    """[a, b] with a·s + b·s² through (s1, v1) and (s2, v2): per-token and per-token-per-key parts."""
    b = (v2 / s2 - v1 / s1) / (s2 - s1)
    return [v1 / s1 - b * s1, b]


def measure_config(
    cfg: dict[str, Any], source_dir: Path | None = None, trust_remote_code: bool = False
) -> dict[str, Any]:
    """The measurement record of `cfg` (JSON-ready; `measure.spec` turns it into a ModelSpec). Attention +
    MLP blocks are read into the standard fields; the others (Mamba/SSM mixers, an attention or an MLP
    alone) are kinds of their own, named by their parts and priced wholly from what was measured."""
    # transformers' notes that its reference PyTorch kernels stand in for mamba-ssm's are no news here:
    # nothing runs but shapes (the meta device)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return _measure(cfg, source_dir, trust_remote_code)
    finally:
        transformers.logging.set_verbosity(verbosity)


def _measure(cfg: dict[str, Any], source_dir: Path | None, trust_remote_code: bool) -> dict[str, Any]:
    model = build_meta_model(cfg, source_dir, trust_remote_code)
    _, layers = decoder_layers(model)
    groups: dict[tuple, list[int]] = {}
    types = getattr(model.config, "layer_types", None)
    for i, layer in enumerate(layers):
        kind = str(types[i]) if isinstance(types, (list, tuple)) and len(types) == len(layers) else ""
        groups.setdefault((_signature(layer), "linear" in kind), []).append(i)
    # Linear attention (the config's layer type says so: MiniMax's lightning attention, Qwen3-Next's gated
    # DeltaNet, Jamba's Mamba) is no softmax attention the standard fields could price.
    types = getattr(model.config, "layer_types", None)
    linear = {i for i, t in enumerate(types or ()) if "linear" in str(t)} if len(types or ()) == len(layers) else set()
    standard = [i for i, layer in enumerate(layers) if _is_standard(layer) and i not in linear]
    whole = {tuple(idx) for idx in groups.values() if idx[0] not in standard}
    s1, s2 = _seq_lens(model, bool(whole))
    probed = standard[0] if standard else 0
    try:
        one, two = (_measure_pass(model, layers, s, probed) for s in (s1, s2))
    except ShardscopeError:
        raise
    except Exception as exc:  # the family's own forward, on the meta device: whatever it raises is one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ShardscopeError(f"{type(model).__name__}: its forward pass failed on the meta device: {first}") from None
    structure: dict[str, Any] = {}
    if standard:
        try:
            structure = read_structure(model, [layers[i] for i in standard], one["order"], len(layers))
        except ShardscopeError as exc:  # blocks the fields cannot describe: priced wholly from what was measured
            if not whole and len(groups) == 1 and not _is_ssm(layers[0]):
                raise  # a uniform attention + MLP block misread is a bug to see, not to price around
            why = str(exc).split("; measuring")[0]  # the standard fields' reason, without "not supported yet"
            warn(f"{why}: its blocks are priced wholly from what was measured")
            whole |= {tuple(idx) for idx in groups.values()}
            standard = []
    if not standard:
        structure = _placeholder_structure(model, len(layers))
    pattern = structure["attention_pattern"] or ["window" if structure["attention_window"] else "full"] * len(layers)
    labels: dict[int, str] = {}
    for idx in sorted(whole):
        label = _label(layers[idx[0]])
        while label in labels.values():  # two blocks of the same parts and other sizes
            label += "'"
        labels |= dict.fromkeys(idx, label)
    pattern = [labels.get(i, kind) for i, kind in enumerate(pattern)]
    if labels:
        structure["attention_pattern"] = pattern
    kinds: dict[str, dict[str, Any]] = {}
    for i, kind in enumerate(pattern):
        if kind in kinds:
            kinds[kind]["layers"] += 1
            continue
        # GEMM shapes with M as rows per token: M scales with the tokens, N and K are the weights' sizes.
        gemms = sorted([m / s1, n, k, c] for (m, n, k), c in one["gemms"][i].items())
        # the experts' products: top-k rows per token of each expert's (N, K)
        expert_gemms = sorted([m / s1, n, k, c] for (m, n, k), c in one["experts"][i].items())
        kinds[kind] = dict(
            layers=1,
            params=_params(layers[i]),
            flops_fwd=_fit(one["fwd"][i], two["fwd"][i], s1, s2),
            flops_bwd=_fit(one["bwd"][i], two["bwd"][i], s1, s2),
            saved_bytes=_fit(one["saved"][i], two["saved"][i], s1, s2),
            gemms=gemms,
            expert_gemms=expert_gemms,
        )
        if i in labels:
            kinds[kind] |= _whole_block(model, layers[i], _fit(one["io"][i], two["io"][i], s1, s2))
            # its attention's score FLOPs per query per key (over the s x s square the eager code computes)
            kinds[kind]["attention_flops"] = scores = two["scores"][i] / s2**2
            if not scores:  # no attention: linear in s, with a cost per sequence (a scan's start)
                a_f, c_f = _line(one["fwd"][i], two["fwd"][i], s1, s2)
                a_b, c_b = _line(one["bwd"][i], two["bwd"][i], s1, s2)
                kinds[kind] |= dict(flops_fwd=[a_f, 0.0], flops_bwd=[a_b, 0.0], flops_per_sequence=[c_f, c_b])
    layer_params = [_params(layer) for layer in layers]
    return dict(
        schema=SCHEMA,
        transformers=transformers.__version__,
        torch=torch.__version__,
        architecture=type(model).__name__,
        model_type=str(cfg.get("model_type")),
        params_total=_params(model),
        layer_params=layer_params,
        structure=structure | {"parallel_block": one["parallel"] if standard else False},
        seq_lens=[s1, s2],
        kinds=kinds,
        other=dict(
            flops_fwd=_fit(one["other_fwd"], two["other_fwd"], s1, s2),
            flops_bwd=_fit(one["other_bwd"], two["other_bwd"], s1, s2),
        ),
    )


def _whole_block(model: nn.Module, layer: nn.Module, io_bytes: list[float]) -> dict[str, Any]:
    """What pricing a block wholly from its measurement needs besides FLOPs and GEMMs: its activation
    traffic around the GEMMs (`io_bytes`, a·s + b·s²), whether it holds a state-space scan, its experts
    (count and parameters: the routed weights a token does not use), and the config's attention head size."""
    config = model.config
    experts = _experts_module(layer)
    expert_params = sum(p.numel() for p in experts.parameters(recurse=False) if p.dim() == 3) if experts else 0
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    hidden = model.get_input_embeddings().embedding_dim
    head_dim = int(getattr(config, "head_dim", 0) or 0) or (hidden // heads if heads else 0)
    return dict(
        whole=True,
        ssm=_is_ssm(layer),
        io_bytes=io_bytes,
        experts=int(next(iter(experts.parameters(recurse=False))).shape[0]) if experts else 0,
        expert_params=int(expert_params),
        head_dim=head_dim,  # of the config's attention, where the block has one (its s² FLOPs say so)
        parts=[type(m).__name__ for _, m in layer.named_children()],
    )
