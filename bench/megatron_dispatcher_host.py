"""Host time of Megatron-Core's all-to-all token dispatcher, its own Python and ATen calls, run on CPU.

Megatron-Core's `MoEAlltoAllTokenDispatcher` (`--moe-token-dispatcher-type alltoall`, shardscope's
`--ep-dispatch flat`) is plain Python over PyTorch: it counts tokens per expert, all-gathers the counts,
copies them to the host, works out the all-to-all splits, calls the all-to-alls and sorts the received
chunks by local expert. None of that needs a GPU, so it runs here as released, in one process that stands
in for one rank of an EP group:

* torch.distributed's "fake" backend gives the process an EP group of `--ep` ranks; the collectives are
  called as Megatron calls them and then filled as a force-balanced run fills them (every rank sends the
  same token counts), so the splits and sizes are those of a real rank;
* CUDA streams and events are stand-ins that do nothing, and the device-to-host copy of the counts is a CPU
  copy (`to_host`): the host work of the GPU path, less the CUDA calls themselves;
* the tokens are few and narrow (`--tokens`, hidden 64), so the CPU kernels cost next to nothing and what
  is timed is the host's work per call, as a GPU rank's host does it (at the 16 tokens of the recorded
  runs about 5% of the forward is CPU kernel work: 64 tokens take 15% longer).

Setup (not a shardscope dependency): `pip install --no-deps --target /tmp/mcore megatron-core==0.15.0`, then
`PYTHONPATH=/tmp/mcore python bench/megatron_dispatcher_host.py [--ep 8 --experts 128 --topk 8] [--json OUT]`.
It prints each stage's host time in reference ops (the fastest of interleaved blocks over the time of one
op of the autograd chain that bench/device/h100_kernels.py times on the H100 hosts, run between the blocks),
the kernel-launching ATen calls of each stage, and `torch.add(out=)`, which the H100 hosts timed too.
The recipes run `moe_permute_fusion`, whose Transformer Engine kernels need a GPU: each fused call is stood
in for by one autograd call (`_Rows`); `--unfused` runs Megatron's unfused permutes and sorts instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from host_param_hooks import cpu_name, per_call_s  # bench/ is the script's directory
from torch.utils._python_dispatch import TorchDispatchMode


class _Event:
    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass


class _Stream:
    def wait_stream(self, other) -> None:
        pass

    def record_event(self, event=None) -> _Event:
        return _Event()

    def synchronize(self) -> None:
        pass


def _cpu_stand_ins() -> None:
    """What Megatron asks of CUDA, done on the CPU (or not at all)."""
    stream = _Stream()
    torch.cuda.Stream = lambda *a, **k: _Stream()
    torch.cuda.current_stream = lambda *a, **k: stream
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.Event = lambda *a, **k: _Event()
    torch.cuda.current_device = lambda: "cpu"


def _balanced_collectives(mappings) -> None:
    """Call each collective on the fake group as Megatron does, then fill its output the way a
    force-balanced run would: every rank's counts alike, so each rank receives what it sends."""
    all_to_all_single, all_gather_into_tensor = dist.all_to_all_single, dist.all_gather_into_tensor

    def a2a(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
        output.copy_(input)

    def all_gather(output, input, group=None, async_op=False):
        all_gather_into_tensor(output, input, group=group, async_op=async_op)
        output.view(-1, *input.shape)[:] = input

    dist.all_to_all_single = a2a
    mappings.dist_all_gather_func = all_gather


def _to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
    """`maybe_move_tensor_to_cpu` for a GPU tensor: a copy to the host, as numpy when asked."""
    if torch.is_tensor(tensor):
        tensor = tensor.to("cpu", copy=True)
        if as_numpy:
            tensor = tensor.numpy()
    return tensor


class _Rows(torch.autograd.Function):
    """Stand-in for one of Transformer Engine's fused permute kernels (`moe_permute_with_probs`,
    `moe_sort_chunks_by_index*`, `moe_unpermute`): one autograd function, one row gather forward and one
    row scatter-add backward (`scatter` swaps the two). TE's own calls do more host work than this."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, rows: int, scatter: bool) -> torch.Tensor:
        ctx.index, ctx.rows, ctx.scatter, ctx.in_rows = index, rows, scatter, x.shape[0]
        if scatter:
            return x.new_zeros((rows, *x.shape[1:])).index_add_(0, index, x)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.scatter:
            return grad.index_select(0, ctx.index), None, None, None
        return grad.new_zeros((ctx.in_rows, *grad.shape[1:])).index_add_(0, ctx.index, grad), None, None, None


def _fused_stand_ins(td) -> None:
    """`moe_permute_fusion` without Transformer Engine: each fused call becomes one `_Rows` call, its row
    index worked out once by Megatron's unfused code on the bench's fixed routing (kept per call site)."""
    permute, sort_chunks = td.permute, td.sort_chunks_by_idxs
    cache: dict = {}

    def fused_permute(tokens, routing_map, probs=None, num_out_tokens=None, fused=False, drop_and_pad=False):
        key = ("permute", tokens.shape, probs is None)
        if key not in cache:
            rows = torch.arange(tokens.shape[0], dtype=tokens.dtype).unsqueeze(1)
            flat = None if probs is None else torch.arange(probs.numel(), dtype=probs.dtype).view(probs.shape)
            _, flat_out, sorted_indices = permute(rows, routing_map, flat, num_out_tokens)
            cache[key] = (sorted_indices, None if flat_out is None else flat_out.long())
        sorted_indices, prob_index = cache[key]
        out = _Rows.apply(tokens, sorted_indices, 0, False)
        out_probs = None if probs is None else _Rows.apply(probs.reshape(-1), prob_index, 0, False)
        return out, out_probs, sorted_indices

    def fused_unpermute(
        permuted, sorted_indices, restore_shape, probs=None, routing_map=None, fused=False, drop_and_pad=False
    ):
        return _Rows.apply(permuted, sorted_indices, restore_shape[0], True)

    def fused_sort(input, split_sizes, sorted_idxs, probs=None, fused=False):
        key = ("sort", id(sorted_idxs), input.shape[0])
        if key not in cache:
            rows = torch.arange(input.shape[0]).unsqueeze(1)
            cache[key] = sort_chunks(rows, split_sizes, sorted_idxs)[0].squeeze(1)
        index = cache[key]
        out_probs = None if probs is None else _Rows.apply(probs, index, 0, False)
        return _Rows.apply(input, index, 0, False), out_probs

    td.permute, td.unpermute, td.sort_chunks_by_idxs = fused_permute, fused_unpermute, fused_sort


# ATen ops that only make a new view of a tensor (no kernel on a GPU)
VIEW_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "alias",
    "t",
    "transpose",
    "permute",
    "expand",
    "as_strided",
    "slice",
    "select",
    "split",
    "split_with_sizes",
    "unsqueeze",
    "squeeze",
    "detach",
    "unbind",
    "chunk",
    "narrow",
    "view_as",
    "numpy_T",
    "lift_fresh",
    "_reshape_alias",
    "unflatten",
    "flatten",
    "sym_size",
    "sym_stride",
}


class KernelCount(TorchDispatchMode):
    """Counts the ATen calls that would launch a GPU kernel (not views), per stage name in `stage`."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = ""
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] not in VIEW_OPS:
            self.counts[self.stage] = self.counts.get(self.stage, 0) + 1
        return func(*args, **(kwargs or {}))


def add_out_us() -> float:
    """One `torch.add(x, 1, out=y)` from Python, the fastest round: bench/device/h100_kernels.py times the
    same call through CUDA on the H100 hosts (`launch_add_us`), where it also launches a kernel."""
    x = torch.ones(16)
    y = torch.empty_like(x)
    return per_call_s(lambda: torch.add(x, 1, out=y), reps=20000, rounds=15) * 1e6


def autograd_op_chain_s(n: int = 100) -> tuple[float, float]:
    """bench/device/h100_kernels.py `host_autograd_section` on this CPU: seconds per op of a chain of
    elementwise ops on 16 values, forward under autograd and backward from its engine."""
    x = torch.ones(16, requires_grad=True)
    t = time.perf_counter()
    y = x
    for _ in range(n):
        y = y * 1.0001
    fwd = (time.perf_counter() - t) / n
    loss = y.sum()
    t = time.perf_counter()
    loss.backward()
    return fwd, (time.perf_counter() - t) / n


def measure(
    ep: int, experts: int, topk: int, tokens: int, fused: bool = True, steps: int = 40, rounds: int = 15
) -> dict:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ep)
    torch.set_num_threads(1)
    _cpu_stand_ins()
    import megatron.core
    import megatron.core.tensor_parallel.mappings as mappings
    import megatron.core.transformer.moe.token_dispatcher as td
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(expert_model_parallel_size=ep, create_gloo_process_groups=False)
    _balanced_collectives(mappings)
    td.maybe_move_tensor_to_cpu = _to_host
    if fused:
        _fused_stand_ins(td)
    hidden = 64
    config = TransformerConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=4,
        num_moe_experts=experts,
        moe_router_topk=topk,
        moe_token_dispatcher_type="alltoall",
        expert_model_parallel_size=ep,
        moe_permute_fusion=False,  # the config's check wants Transformer Engine; set below
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        add_bias_linear=False,
    )
    local = list(range(experts // ep))
    dispatcher = td.MoEAlltoAllTokenDispatcher(
        num_local_experts=len(local),
        local_expert_indices=local,
        config=config,
        pg_collection=get_default_pg_collection(),
    )
    config.moe_permute_fusion = fused  # after __init__, which would put its index tensors on CUDA
    times: dict[str, list[float]] = {}

    counter: list[KernelCount] = []

    def timed(name, fn, *args, **kwargs):
        if counter:
            outer, counter[0].stage = counter[0].stage, name
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        if counter:
            counter[0].stage = outer
        times.setdefault(name, []).append(time.perf_counter() - t0)
        return result

    for name in ("permute", "unpermute", "sort_chunks_by_idxs"):  # the calls moe_permute_fusion fuses
        inner = getattr(td, name)
        setattr(td, name, lambda *a, _f=inner, _n=name, **k: timed(_n, _f, *a, **k))
    # every rank routes its tokens to `topk` experts round-robin: each expert gets tokens * topk / experts
    index = (torch.arange(tokens).unsqueeze(1) * topk + torch.arange(topk)) % experts
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, index, True)
    probs = torch.zeros(tokens, experts).scatter_(1, index, 1.0 / topk)
    x = torch.randn(tokens, 1, hidden, requires_grad=True)

    def forward() -> torch.Tensor:
        h, p = timed("dispatch_preprocess", dispatcher.dispatch_preprocess, x, routing_map, probs)
        h, p = timed("token_dispatch", dispatcher.token_dispatch, h, p)
        h, _, p = timed("dispatch_postprocess", dispatcher.dispatch_postprocess, h, p)
        out = h * p.unsqueeze(-1)  # stands in for the experts
        out = timed("combine_preprocess", dispatcher.combine_preprocess, out)
        out = timed("token_combine", dispatcher.token_combine, out)
        return timed("combine_postprocess", dispatcher.combine_postprocess, out)

    for _ in range(30):
        forward().sum().backward()
    count = KernelCount()
    counter.append(count)
    with count:
        count.stage = "forward"
        out = forward()
        count.stage = "backward"
        out.sum().backward()
    counter.clear()
    # Blocks of `steps` steps, each followed by the reference op chain; every figure is the fastest block's
    # mean, so that other processes' interruptions drop out, and is then put in reference ops.
    blocks: list[dict[str, float]] = []
    for _ in range(rounds):
        times.clear()
        fwd = bwd = 0.0
        for _ in range(steps):
            t1 = time.perf_counter()
            out = forward()
            t2 = time.perf_counter()
            out.sum().backward()
            fwd += t2 - t1
            bwd += time.perf_counter() - t2
        block = {name: sum(v) / steps for name, v in times.items()}
        block["forward"], block["backward"] = fwd / steps, bwd / steps
        block["ref_fwd"], block["ref_bwd"] = autograd_op_chain_s(2000)
        blocks.append(block)
    best = {name: min(b[name] for b in blocks) for name in blocks[0]}
    ref_fwd, ref_bwd = best.pop("ref_fwd"), best.pop("ref_bwd")
    op = {name: t / (ref_bwd if name == "backward" else ref_fwd) for name, t in best.items()}
    fused_away = op["permute"] + op["sort_chunks_by_idxs"] + op["unpermute"]  # sort: both calls of a step
    result = {
        "megatron_core": megatron.core.__version__,
        "ep": ep,
        "experts": experts,
        "topk": topk,
        "tokens": tokens,
        "permute_fusion": "stand-ins" if fused else "off",
        "add_out_us": add_out_us(),
        "fwd_autograd_op_us": ref_fwd * 1e6,
        "bwd_engine_op_us": ref_bwd * 1e6,
        # every figure below in reference ops: a forward stage's host time over one eager op's under
        # autograd, the backward's over one op's from the autograd engine
        "stages_ops": {k: round(v, 1) for k, v in op.items()},
        # kernel-launching ATen calls in each stage alone (forward: those outside the stages)
        "stage_kernels": count.counts,
        # forward without the permutes and sorts that moe_permute_fusion replaces
        "forward_glue_ops": op["forward"] - fused_away,
        # before the sync ("before_ep_alltoall"): counting, gathering and copying the counts
        "before_sync_ops": op["dispatch_preprocess"] - op["permute"],
        # after it: the all-to-alls, the chunk sorts' glue and the un-permute's
        "after_sync_ops": op["token_dispatch"]
        + op["dispatch_postprocess"]
        + op["combine_preprocess"]
        - op["sort_chunks_by_idxs"]
        + op["token_combine"]
        + op["combine_postprocess"]
        - op["unpermute"],
    }
    dist.destroy_process_group()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--unfused", action="store_true", help="Megatron's unfused permutes and sorts")
    parser.add_argument("--steps", type=int, default=40, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=15, help="timed blocks (the fastest is kept)")
    parser.add_argument("--json", type=Path, help="append this run to the file's 'runs'")
    args = parser.parse_args()
    run = measure(args.ep, args.experts, args.topk, args.tokens, not args.unfused, args.steps, args.rounds)
    print(json.dumps(run, indent=1))
    if args.json:
        data = json.loads(args.json.read_text()) if args.json.exists() else {"runs": []}
        data["torch"] = torch.__version__
        data["cpu"] = cpu_name()
        data["runs"].append({k: round(v, 2) if isinstance(v, float) else v for k, v in run.items()})
        args.json.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
