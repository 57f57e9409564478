"""Ground truth from PyTorch: saved activations and model-state bytes of real modules at full size,
on CPU under FakeTensorMode (no real memory), against the op graph's numbers."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402
from torch_reference import (  # noqa: E402
    GPTLayer,
    LiveBytes,
    LlamaLayer,
    LossHead,
    bf16_module,
    saved_activation_bytes,
)

from shardscope.costs.memory import (  # noqa: E402
    buffer_bytes,
    layer_params_local,
    layers_saved_bytes,
    model_state_bytes,
)
from shardscope.graph.build import build_stage_graph  # noqa: E402
from shardscope.hardware.catalog import make_cluster  # noqa: E402
from shardscope.models.catalog import load_model  # noqa: E402
from shardscope.plan.plan import make_plan  # noqa: E402

# PyTorch op-level selective checkpointing, the policy shardscope's "selective" models: keep the
# outputs of GEMMs and attention, recompute everything else.
SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _sac_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class _MustSaveRecorder(TorchDispatchMode):
    """Records the storages SAC caches: the outputs of MUST_SAVE ops."""

    def __init__(self):
        super().__init__()
        self.saved: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in SAVE_OPS:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.saved.setdefault(t.untyped_storage()._cdata, t.untyped_storage().nbytes())
        return out


def _measure(model_name: str, policy: str, batch: int, seq: int, fused: bool = False) -> tuple[int, int]:
    """(bytes PyTorch keeps for backward, bytes shardscope predicts) for one layer; `fused`: Megatron's
    fused SwiGLU in the reference and `fused_activation` in the plan."""
    m = load_model(model_name)
    llama = m.mlp == "swiglu"
    with FakeTensorMode():
        ref_policy = "none" if policy == "selective" else policy
        if llama:
            layer = bf16_module(
                lambda: LlamaLayer(
                    m.hidden,
                    m.heads,
                    m.kv_heads,
                    m.head_dim,
                    m.ffn_hidden,
                    qk_norm=m.qk_norm,
                    policy=ref_policy,
                    fused_act=fused,
                )
            )
            cos = torch.randn(seq, m.head_dim, dtype=torch.bfloat16)
            sin = torch.randn(seq, m.head_dim, dtype=torch.bfloat16)
            extra, args = [cos, sin], (cos, sin)
        else:
            layer = bf16_module(lambda: GPTLayer(m.hidden, m.heads, m.ffn_hidden, policy=ref_policy))
            extra, args = [], ()
        x = torch.randn(batch, seq, m.hidden, dtype=torch.bfloat16, requires_grad=True)
        if policy == "selective":
            rec = _MustSaveRecorder()
            with rec:
                checkpoint(
                    layer,
                    x,
                    *args,
                    use_reentrant=False,
                    context_fn=functools.partial(create_selective_checkpoint_contexts, _sac_policy),
                )
            measured = sum(rec.saved.values()) + x.untyped_storage().nbytes()  # + the region's input
        else:
            y = layer(x, *args)
            measured, _ = saved_activation_bytes(y, list(layer.parameters()) + extra)
    plan = make_plan(
        m,
        make_cluster("H100", 1),
        micro_batch=batch,
        global_batch=batch,
        seq_len=seq,
        recompute=policy,
        fused_activation=fused,
    )
    return measured, build_stage_graph(m, plan).layer.saved_bytes(policy)


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
@pytest.mark.parametrize("model_name", ["llama3.1-8b", "qwen3-8b", "mpt-7b"])
def test_saved_activations_match_pytorch(model_name, policy):
    measured, predicted = _measure(model_name, policy, batch=2, seq=4096)
    assert predicted == pytest.approx(measured, rel=0.02), (measured, predicted)


def test_saved_activations_70b_layer_exact_without_recompute():
    measured, predicted = _measure("llama3.1-70b", "none", batch=1, seq=8192)
    assert predicted == measured


@pytest.mark.parametrize("policy", ["none", "selective"])
def test_fused_swiglu_keeps_only_its_input(policy):
    """Megatron's fused SwiGLU keeps gate and up but not silu(gate): exact without recompute, and a layer
    saves less than the unfused one by that tensor."""
    measured, predicted = _measure("llama3.1-8b", policy, batch=1, seq=4096, fused=True)
    assert predicted == pytest.approx(measured, rel=0.02 if policy == "selective" else 0), (measured, predicted)
    unfused, _ = _measure("llama3.1-8b", policy, batch=1, seq=4096)
    silu_bytes = 2 * 4096 * load_model("llama3.1-8b").ffn_hidden
    assert unfused - measured == (silu_bytes if policy == "none" else 0)


@pytest.mark.parametrize("fused", [False, True])
def test_loss_head_saved_bytes_match_pytorch(fused):
    """The last stage's norm, output projection and loss: unfused, autograd keeps the fp32 log-softmax of
    the upcast logits; a fused cross-entropy keeps the bf16 logits and the fp32 log-sum-exp. The int64
    targets (8 bytes a token) are not activations of the graph, nor is the loss's scalar total weight."""
    m, tokens = load_model("llama3.1-8b"), 8192
    with FakeTensorMode():
        head = bf16_module(lambda: LossHead(m.hidden, m.vocab, fused=fused))
        x = torch.randn(tokens, m.hidden, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.zeros(tokens, dtype=torch.long)
        measured, _ = saved_activation_bytes(head(x, targets), [*head.parameters(), targets])
    plan = make_plan(m, make_cluster("H100", 1), global_batch=2, micro_batch=2, seq_len=4096, fused_cross_entropy=fused)
    assert build_stage_graph(m, plan).head.saved_bytes("none") == pytest.approx(measured, abs=4)


def test_cpu_rms_norm_decomposition_saves_fp32_copies():
    """The documented CPU difference: F.rms_norm decomposes on CPU and keeps fp32 tensors, which the
    fused CUDA kernel (modelled) does not."""
    h, t = 4096, 4096
    with FakeTensorMode():
        x = torch.randn(1, t, h, dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(h, dtype=torch.bfloat16, requires_grad=True)
        y = torch.nn.functional.rms_norm(x, (h,), w, 1e-5)
        measured, _ = saved_activation_bytes(y, [w])
    fused = 2 * t * h + 4 * t  # bf16 input + fp32 rstd
    assert measured >= 2 * fused  # fp32 input copy (4 B) + fp32 normalised (4 B) + rstd


@pytest.mark.parametrize("model_name", ["llama3.1-8b", "qwen3-8b", "mpt-7b", "qwen2.5-7b"])
def test_layer_parameter_bytes_match_module(model_name):
    m = load_model(model_name)
    with FakeTensorMode():
        if m.mlp == "swiglu":
            layer = LlamaLayer(m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden, qk_norm=m.qk_norm)
            n = sum(p.numel() for p in layer.parameters())
            n += (m.q_dim + 2 * m.kv_dim) if m.qkv_bias else 0  # Qwen2 q/k/v biases
        else:
            layer = GPTLayer(m.hidden, m.heads, m.ffn_hidden)
            # MPT has no biases: drop the reference's bias vectors
            n = sum(p.numel() for name, p in layer.named_parameters() if "bias" not in name or m.mlp_bias)
    assert layer_params_local(m, tp=1) == n


@pytest.mark.parametrize("zero,fsdp,bytes_per_param", [(0, False, 18), (1, False, 6 + 12 / 8), (3, True, 16 / 8)])
def test_model_state_bytes_match_pytorch_optimizer(zero, fsdp, bytes_per_param):
    """Adam in PyTorch allocates exactly two fp32 moments per parameter (exp_avg, exp_avg_sq)."""
    with FakeTensorMode():
        p = torch.nn.Parameter(torch.zeros(1024, 1024))
        opt = torch.optim.AdamW([p], fused=False)
        p.grad = torch.zeros_like(p)
        opt.step()
        moments = sum(v.untyped_storage().nbytes() for s in opt.state.values() for k, v in s.items() if k != "step")
    assert moments == 8 * p.numel()
    m = load_model("llama3.1-8b")
    plan = make_plan(m, make_cluster("H100", 8), zero=zero, fsdp=fsdp, global_batch=8, seq_len=1024)
    st = model_state_bytes(1.0, plan)
    assert st.params + st.grads + st.optimizer == pytest.approx(bytes_per_param)


def test_torchtitan_op_sac_keeps_every_other_matmul_output():
    """torchtitan's op-level SAC (`_custom_policy`): the outputs of its save-list ops are kept except every
    second `aten.mm` of the block, which re-runs in backward with what it feeds. Measured on a full-size
    Llama-3.1-8B layer under FakeTensorMode with that policy, against the plan with
    `recompute_alternate_mm` (which keeps neither wk's nor w3's output, nor wo's that the residual rebuilds)."""
    m = load_model("llama3.1-8b")
    batch, seq = 1, 4096
    with FakeTensorMode():
        layer = bf16_module(lambda: LlamaLayer(m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden))
        cos = torch.randn(seq, m.head_dim, dtype=torch.bfloat16)
        sin = torch.randn(seq, m.head_dim, dtype=torch.bfloat16)
        x = torch.randn(batch, seq, m.hidden, dtype=torch.bfloat16, requires_grad=True)
        kept: dict[int, int] = {}
        count = {"mm": 0}

        def policy(ctx, op, *args, **kwargs):
            if op == torch.ops.aten.mm.default and not ctx.is_recompute:
                count["mm"] += 1
                if count["mm"] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

        class Recorder(TorchDispatchMode):  # the forward's save-list outputs but every second matmul's
            mm = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func == torch.ops.aten.mm.default:
                    self.mm += 1
                if func in SAVE_OPS and not (func == torch.ops.aten.mm.default and self.mm % 2 == 0):
                    for t in tree_flatten(out)[0]:
                        if isinstance(t, torch.Tensor):
                            kept.setdefault(t.untyped_storage()._cdata, t.untyped_storage().nbytes())
                return out

        with Recorder():
            checkpoint(
                layer,
                x,
                cos,
                sin,
                use_reentrant=False,
                context_fn=functools.partial(create_selective_checkpoint_contexts, policy),
            )
        measured = sum(kept.values()) + x.untyped_storage().nbytes()
    kw = dict(micro_batch=batch, global_batch=batch, seq_len=seq, recompute="selective")
    cluster = make_cluster("H100", 1)
    plan = make_plan(m, cluster, recompute_alternate_mm=True, **kw)
    graph = build_stage_graph(m, plan)
    predicted = layers_saved_bytes(m, plan, graph, (0,), 0)
    assert predicted == measured, (measured / seq, predicted / seq)
    every = make_plan(m, cluster, **kw)  # every matmul's output kept: 39 KB per token more
    assert layers_saved_bytes(m, every, graph, (0,), 0) - predicted == 2 * seq * (
        m.kv_heads * m.head_dim + m.hidden + m.ffn_hidden
    )


def test_unfused_loss_backward_peak_matches_pytorch():
    """The unfused loss at its backward: the kept fp32 log-softmax, nll_loss's fp32 gradient and
    log_softmax's fp32 gradient are alive at once (torchtitan frees the bf16 logits before the backward).
    Peak of live bytes over the loss's forward and backward on a full-size Llama-3.1-8B head under
    FakeTensorMode, against the saved logits plus the loss's transient buffers of the plan."""
    m, tokens = load_model("llama3.1-8b"), 8192
    with FakeTensorMode():
        logits = torch.randn(tokens, m.vocab, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.zeros(tokens, dtype=torch.long)
        with LiveBytes() as live:
            torch.nn.functional.cross_entropy(logits.float(), targets).backward()
    plan = make_plan(m, make_cluster("H100", 1), global_batch=1, micro_batch=1, seq_len=tokens)
    graph = build_stage_graph(m, plan)
    kept = next(s.bytes for s in graph.head.saved if s.name == "fp32 logits (softmax)")
    predicted = kept + buffer_bytes(m, plan, graph, 0)
    assert predicted == pytest.approx(live.peak, rel=1e-3), (live.peak / logits.numel(), predicted / logits.numel())


def test_megatron_loss_backward_peak_matches_megatron_core(monkeypatch: pytest.MonkeyPatch):
    """Megatron-Core's own unfused loss (`vocab_parallel_cross_entropy`, TP 1: its all-reduces over one rank
    are the identity) keeps the fp32 softmax it computed in place and turns it into the gradient in place;
    autograd's bf16 cast of that gradient is the one new buffer. Peak of live bytes over its forward and
    backward (real CPU tensors at Llama-3.1-8B's vocabulary: the in-place ops need real values), against
    the kept softmax plus the loss's transient buffers of a plan with `vocab_parallel_loss`."""
    ce = pytest.importorskip("megatron.core.tensor_parallel.cross_entropy")
    monkeypatch.setattr(ce, "get_tensor_model_parallel_group", lambda: None)
    monkeypatch.setattr(ce, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(ce, "get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(ce.torch.distributed, "all_reduce", lambda *args, **kwargs: None)
    m, tokens = load_model("llama3.1-8b"), 128
    logits = torch.randn(tokens, 1, m.vocab, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, m.vocab, (tokens, 1))
    with LiveBytes() as live:
        ce.vocab_parallel_cross_entropy(logits, targets).sum().backward()
    plan = make_plan(
        m, make_cluster("H100", 1), global_batch=1, micro_batch=1, seq_len=tokens, vocab_parallel_loss=True
    )
    graph = build_stage_graph(m, plan)
    kept = next(s.bytes for s in graph.head.saved if s.name == "fp32 logits (softmax)")
    predicted = kept + buffer_bytes(m, plan, graph, 0)
    assert predicted == pytest.approx(live.peak, rel=1e-3), (live.peak / logits.numel(), predicted / logits.numel())
    unfused = make_plan(m, make_cluster("H100", 1), global_batch=1, micro_batch=1, seq_len=tokens)
    assert buffer_bytes(m, unfused, build_stage_graph(m, unfused), 0) == 4 * buffer_bytes(m, plan, graph, 0)


def test_loss_parallel_backward_peak_matches_dtensor(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """torchtitan's loss over TP-sharded logits: DTensor's `loss_parallel` (torchtitan 0.0-0.2; 0.3's own
    `_LossParallelCrossEntropy` does the same arithmetic) keeps the fp32 log-softmax and, at its backward,
    holds a zeros-built gradient, exp(log-softmax) and their sum at once: 16 bytes a logit where ATen's fused
    kernels hold 12. Measured on a one-rank gloo mesh (the handlers' collectives run over it), counting the
    ops inside the handlers too; against the kept log-softmax plus the loss's buffers of a TP2 plan, per logit."""
    import torch.distributed as dist
    import torch.distributed.tensor.parallel.loss as lp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    live = LiveBytes()

    def counted(fn):
        def run(*args, **kwargs):
            with live.inner():
                return fn(*args, **kwargs)

        return run

    for name in ("_log_softmax", "_nll_loss_forward", "_nll_loss_and_log_softmax_backward"):
        monkeypatch.setattr(lp, name, counted(getattr(lp, name)))
    m, tokens = load_model("llama3.1-8b"), 128
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        logits = distribute_tensor(torch.randn(tokens, m.vocab, dtype=torch.bfloat16), mesh, [Shard(1)])
        logits.requires_grad_()
        targets = torch.randint(0, m.vocab, (tokens,))
        with live, loss_parallel():
            torch.nn.functional.cross_entropy(logits.float(), targets).backward()
    finally:
        dist.destroy_process_group()
    plan = make_plan(
        m, make_cluster("H100", 2), tp=2, global_batch=1, micro_batch=1, seq_len=tokens, loss_parallel=True
    )
    graph = build_stage_graph(m, plan)
    kept = next(s.bytes for s in graph.head.saved if s.name == "fp32 logits (softmax)")
    per_logit = (kept + buffer_bytes(m, plan, graph, 0)) / (graph.tokens * m.vocab / plan.tp)
    assert per_logit == pytest.approx(live.peak / (tokens * m.vocab), rel=1e-3)
