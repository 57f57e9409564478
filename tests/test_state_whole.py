"""Model state counted whole: the parameters one GPU holds (and so its weights, gradients and optimizer
state) add up to the model's, for every model class, and a DiT's blocks, embedders and head are the
parameters diffusers' own modules have; a Wan block as diffusers runs it keeps, under FakeTensorMode,
the activations the graph prices for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardscope
from shardscope.costs.memory import dense_params_local, model_state_bytes, rank_params_local, rank_state_bytes
from shardscope.graph.build import build_stage_graph
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import list_models, load_model
from shardscope.models.spec import LayerKind, ModelSpec
from shardscope.plan.plan import make_plan

CATALOG = Path(shardscope.__file__).parent / "models" / "catalog"
VIDEO = "17x256x256"  # a small clip: parameter counts do not depend on it

# diffusers' linears that read a TP-split input (the attention output, the FFN hidden layer): row-parallel
# under TP, so each rank adds the whole bias once after the reduction.
ROW_PARALLEL = ("to_out.0", "to_add_out", "net.2", "proj_out")


def _tp1(name: str) -> tuple[shardscope.Estimate, tuple]:
    m = load_model(name)
    kw: dict = dict(video=VIDEO) if m.dit else dict(seq_len=1024)
    args = dict(gpu="H100", gpus=8, tp=1, pp=1, global_batch=8, **kw)
    return shardscope.estimate(name, **args), shardscope.setup(name, **args)


def _check_whole(name: str) -> None:
    e, (model, _, plan) = _tp1(name)
    assert e.params.per_gpu == e.params.total == model.params_total
    # weights, gradients and optimizer state follow the count: one rank holds the state of the whole model
    state, whole = rank_state_bytes(model, plan, 0), model_state_bytes(model.params_total, plan)
    assert (state.params, state.grads, state.optimizer) == pytest.approx((whole.params, whole.grads, whole.optimizer))


def test_wan_params_per_gpu_equal_total_at_tp1():
    """The issue's plan: 9.857 B of 14.288 B per GPU before (no cross-attention, embedders or head)."""
    e = shardscope.estimate("wan2.1-14b", gpu="H100", gpus=8, video="81x720x1280")
    assert e.params.per_gpu == e.params.total == 14288491584
    _check_whole("wan2.1-t2v-14b")


def test_hunyuan_params_per_gpu_equal_total_at_tp1():
    """6.80 B of 12.82 B per GPU before (the dual-stream blocks counted as one stream of an LLM block)."""
    _check_whole("hunyuanvideo")


@pytest.mark.parametrize("name", list_models())
def test_every_catalog_model_params_counted_whole(name):
    _check_whole(name)


# ----- TP / PP / EP -------------------------------------------------------------------------------------
def _tp_replicated(m: ModelSpec, kind: LayerKind) -> int:
    """Parameters of one block every TP rank holds whole, from the architecture: norm weights (and
    biases), row-parallel output biases, q/k norms, MLA's down-projections with their latent norms, the
    router; Wan's across-heads q/k norms (d wide), affine cross-attention norm and modulation table."""
    d, hd = m.hidden, m.head_dim
    if kind.mlp == "dit":
        return 2 * (d + 2 * d) + 2 * d + d + 6 * d
    if kind.mlp == "dit-double":
        return 4 * hd + 4 * d
    if kind.mlp == "dit-single":
        return 2 * hd + d
    n = 2 * m.norm_params + (m.hidden if m.out_bias else 0) + (2 * hd if m.qk_norm else 0)
    if m.mla:
        a = m.mla
        n += d * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
        n += d * a.q_lora_rank + a.q_lora_rank if a.q_lora_rank else 0
    if kind.mlp == "moe":
        n += m.router_params
    elif m.mlp_bias:
        n += d
    return n


CASES = [
    ("llama3.1-8b", dict(tp=2, pp=2)),
    ("qwen3-8b", dict(tp=4, pp=2)),
    ("qwen3-30b-a3b", dict(tp=2, pp=2, ep=2)),
    ("deepseek-v2-lite", dict(tp=2, pp=2, ep=2)),
    ("wan2.1-t2v-14b", dict(tp=4, pp=2)),
    ("hunyuanvideo", dict(tp=2, pp=4)),  # a stage holds both dual- and single-stream blocks
]


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_params_sum_back_under_tp_pp_ep(name, kw):
    """Summed over the pipeline ranks, with each rank's TP shards multiplied back by tp and its routed
    experts by ep·etp, the per-rank parameters give the model's total once the pieces every TP rank holds
    whole are counted once: exactly, with those pieces counted from the architecture here."""
    m = load_model(name)
    video = dict(video=VIDEO) if m.dit else dict(seq_len=1024)
    _, _, plan = shardscope.setup(name, gpu="H100", gpus=16, global_batch=16, **video, **kw)
    assert (plan.tp, plan.pp, plan.ep) == (kw["tp"], kw["pp"], kw.get("ep", 1))
    ranks = [rank_params_local(m, plan, r) for r in range(plan.pp)]
    multiplied = sum(dense * plan.tp + expert * plan.ep * plan.etp for dense, expert in ranks)
    whole = sum(_tp_replicated(m, m.layer_kind(i)) for i in range(m.layers))
    # outside the blocks: DiT embedders and head (plain modules, whole on every TP rank); an LLM's final norm
    whole += m.dit_extra_params() if m.dit else m.norm_params
    assert multiplied - (plan.tp - 1) * whole == pytest.approx(m.params_total, rel=1e-12)


# ----- against diffusers' modules ---------------------------------------------------------------------
def _tp_whole_params(torch, module) -> int:
    """Parameters of a diffusers module that a TP rank holds whole: those of its norm layers, the biases of
    its row-parallel linears, and parameters outside any layer (modulation tables)."""
    from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm

    norms = (torch.nn.LayerNorm, torch.nn.RMSNorm, DiffusersRMSNorm)
    n = sum(p.numel() for p in module.parameters(recurse=False))
    for name, sub in module.named_modules():
        if isinstance(sub, norms):
            n += sum(p.numel() for p in sub.parameters(recurse=False))
        elif isinstance(sub, torch.nn.Linear) and name.endswith(ROW_PARALLEL) and sub.bias is not None:
            n += sub.bias.numel()
    return n


def _diffusers_blocks(torch, name: str) -> dict[str, object]:
    """One block of each kind of the catalog model, built by diffusers on the meta device."""
    transformers = pytest.importorskip("diffusers.models.transformers")
    m = load_model(name)
    with torch.device("meta"):
        if m.dit.family == "wan":
            block = transformers.transformer_wan.WanTransformerBlock(
                m.hidden, m.ffn_hidden, m.heads, "rms_norm_across_heads", m.dit.cross_attn_norm, 1e-6
            )
            return {"dit": block}
        hv = transformers.transformer_hunyuan_video
        ratio = m.ffn_hidden / m.hidden
        return {
            "dit-double": hv.HunyuanVideoTransformerBlock(m.heads, m.head_dim, ratio, "rms_norm"),
            "dit-single": hv.HunyuanVideoSingleTransformerBlock(m.heads, m.head_dim, ratio, "rms_norm"),
        }


@pytest.mark.parametrize("name", ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "hunyuanvideo"])
def test_dit_blocks_params_match_diffusers(name):
    """Wan's block and HunyuanVideo's dual- and single-stream blocks as diffusers builds them from the
    catalog config: the spec's count of each, exactly, and a GPU's share of it under TP (the whole pieces
    as diffusers' module types say, the rest split)."""
    torch = pytest.importorskip("torch")
    m = load_model(name)
    for kind, block in _diffusers_blocks(torch, name).items():
        k = LayerKind("full", kind)
        total = sum(p.numel() for p in block.parameters())
        whole = _tp_whole_params(torch, block)
        assert m.layer_params_of(k) == total
        assert m.dit_block_replicated_params(k) == whole
        for tp in (1, 2, 4):
            assert dense_params_local(m, tp, k) == pytest.approx((total - whole) / tp + whole, rel=1e-12)


@pytest.mark.parametrize("name", ["wan2.1-t2v-14b", "hunyuanvideo"])
def test_dit_embedders_and_head_match_diffusers(name):
    """The whole diffusers transformer (meta device) has `params.total` parameters; outside its blocks, its
    output head (final norm/modulation, projection) is what the last stage holds and the rest (patch,
    time and text embedders, token refiner) what the first stage holds."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("diffusers.models.transformers")
    config = json.loads((CATALOG / f"{name}.json").read_text())
    with torch.device("meta"):
        module = getattr(transformers, config["_class_name"])(**{k: v for k, v in config.items() if k[0] != "_"})
    m = load_model(name)
    e, _ = _tp1(name)
    assert sum(p.numel() for p in module.parameters()) == e.params.total == m.params_total
    blocks = ("blocks", "transformer_blocks", "single_transformer_blocks")
    head = ("norm_out", "proj_out", "scale_shift_table")
    counts = {"head": 0, "embedders": 0}
    for pname, p in module.named_parameters():
        top = pname.split(".")[0]
        if top not in blocks:
            counts["head" if top in head else "embedders"] += p.numel()
    assert counts == {"head": m.dit_head_params(), "embedders": m.dit_embedder_params()}
    # at PP 2 the first stage holds the embedders, the last the head
    _, _, plan = shardscope.setup(name, gpu="H100", gpus=2, pp=2, global_batch=2, video=VIDEO)
    first, last = (plan.rank_layers(m.layers)[r] for r in (0, 1))
    assert rank_params_local(m, plan, 0)[0] == sum(m.layer_params_of(m.layer_kind(i)) for i in first) + (
        m.dit_embedder_params()
    )
    assert rank_params_local(m, plan, 1)[0] == sum(m.layer_params_of(m.layer_kind(i)) for i in last) + (
        m.dit_head_params()
    )


@pytest.mark.parametrize("name", ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b"])
def test_wan_block_memory_matches_fake_tensor(name):
    """diffusers' WanTransformerBlock from the catalog config at full width, 4,096 video and 512 text
    tokens, forward and backward under FakeTensorMode: the activations autograd keeps for backward equal
    what the graph prices for one block as diffusers runs it (no `--fused-activation`), to 0.1% (the rest
    is the adaLN vectors and fp32 copies of norm2's weight). Its fp32 chains keep fp32 copies of the block
    input, the residuals and the FFN output and the fp32 normalised tensors: 8 bf16 [tokens, d] tensors'
    worth more than Megatron-DFM's fused block, which the graph priced for both (21.6% short at 1.3B,
    26.0% at 14B). The q/k RMSNorms keep what CUDA's fused `F.rms_norm` keeps (input and fp32 1/rms), as
    `torch_reference.RMSNorm` does; on CPU the op decomposes into fp32 steps. The block's parameters are
    the graph's layer's and the spec's."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch_reference import RMSNorm, bf16_module, saved_activation_bytes

    m = load_model(name)
    s, text, d = 4096, m.dit.text_len, m.hidden

    def build() -> torch.nn.Module:
        block = WanTransformerBlock(d, m.ffn_hidden, m.heads, "rms_norm_across_heads", m.dit.cross_attn_norm, 1e-6)
        for attn in (block.attn1, block.attn2):
            attn.norm_q, attn.norm_k = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
        return block

    with FakeTensorMode():
        block = bf16_module(build)
        x, context = (torch.randn(1, n, d, dtype=torch.bfloat16, requires_grad=True) for n in (s, text))
        temb = torch.randn(1, 6, d, dtype=torch.bfloat16, requires_grad=True)
        rope = tuple(torch.randn(1, s, 1, m.head_dim) for _ in range(2))  # fp32 cos, sin tables
        out = block(x, context, temb, rope)
        measured, _ = saved_activation_bytes(out, [*block.parameters(), context, *rope])
        out.backward(torch.randn_like(out))
        assert x.grad.shape == x.shape and block.ffn.net[2].weight.grad is not None
        params = sum(p.numel() for p in block.parameters())
    plan = make_plan(m, make_cluster("H100", 1), global_batch=1, seq_len=s)
    assert not plan.fused_swiglu
    layer = build_stage_graph(m, plan).layer
    assert layer.saved_bytes("none") == pytest.approx(measured, rel=1e-3)
    assert params == dense_params_local(m, 1, m.layer_kind(0)) == m.layer_params
