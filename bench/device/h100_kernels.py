# ruff: noqa: B023  (closures timed inside the loop that defines them)
"""Measure, on one CUDA GPU, the kernels the cost model prices for eager MoE training steps.

Run on the device machine (not in CI): `python bench/device/h100_kernels.py OUT_DIR`. Writes
`OUT_DIR/kernels_measured.json` and prints a summary. Sections, each independent (a failure is
recorded, the rest runs):
  * expert GEMMs of every MoE validation row (`moe_expert_gemms.json`, made by `moe_expert_gemms.py`):
    forward (M, N, K), dgrad (M, K, N) and wgrad (K, N, M) per expert, issued as Transformer Engine's
    eager grouped GEMM issues them (one cuBLAS GEMM per expert, round-robin over four streams), timed as
    a CUDA-graph replay (GPU time, no host launch cost), plus the same math as one grouped kernel
    (`torch._grouped_mm`, BF16) for comparison;
  * dense reference GEMMs (8192^3 BF16 and FP8 per-tensor);
  * flash attention through PyTorch SDPA (cuDNN and FlashAttention-2 back ends), forward and backward;
  * sliding-window attention through cuDNN's frontend (the kernel Transformer Engine calls), if the
    `cudnn` frontend package is importable;
  * host costs of eager PyTorch: a kernel launch, a `torch.empty`, a small `F.linear`, a `.item()`;
  * the learnable sink's cost (`cudnn_sinks`), BF16 weight gradients in Transformer Engine's layout
    (`wgrad_nt`), cuDNN SDPA throughput against batch x heads (`sdpa_heads`) and over other lengths, no
    mask and MLA's head shape (`sdpa_grid`), and GPT-OSS's eager elementwise ops with the host ahead
    (`eager_elementwise`); host time per op under autograd, forward and backward (`host_autograd`), and
    per kernel launch and allocation from C++ (`cpp_launch`, an extension built on the spot); one Wan 2.1
    14B block as diffusers runs it (`wan_block`).
`python bench/device/h100_kernels.py OUT_DIR cudnn_sinks,wgrad_nt` runs only the sections named.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

STREAMS = 4
DEV = "cuda"


def events_time_ms(fn, reps: int, warmup: int = 2) -> float:
    """Median of `reps` timings of fn() with CUDA events (each timing one call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_time_ms(fn, reps: int = 20) -> float:
    """GPU time of fn's kernels without host launch cost: capture once, time replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return events_time_ms(g.replay, reps)


def fp8(t: torch.Tensor) -> torch.Tensor:
    return (t * 0.5).to(torch.float8_e4m3fn)


class ExpertGemms:
    """`groups` independent (M, N, K) GEMMs, A (M, K) row-major times B (N, K) row-major transposed
    (the TN layout cuBLASLt needs for FP8), issued round-robin over `STREAMS` streams."""

    def __init__(self, groups: int, m: int, n: int, k: int, precision: str):
        self.groups, self.m, self.n, self.k, self.precision = groups, m, n, k, precision
        self.a = [torch.randn(m, k, device=DEV, dtype=torch.bfloat16) for _ in range(groups)]
        self.b = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) for _ in range(groups)]
        if precision == "fp8":
            self.a = [fp8(x) for x in self.a]
            self.b = [fp8(x) for x in self.b]
            self.scale = torch.tensor(1.0, device=DEV)
        self.streams = [torch.cuda.Stream() for _ in range(STREAMS)]

    def one(self, i: int) -> torch.Tensor:
        if self.precision == "fp8":
            return torch._scaled_mm(
                self.a[i], self.b[i].t(), scale_a=self.scale, scale_b=self.scale, out_dtype=torch.bfloat16
            )
        return torch.mm(self.a[i], self.b[i].t())

    def multistream(self) -> None:
        cur = torch.cuda.current_stream()
        for s in self.streams:
            s.wait_stream(cur)
        for i in range(self.groups):
            with torch.cuda.stream(self.streams[i % STREAMS]):
                self.one(i)
        for s in self.streams:
            cur.wait_stream(s)

    def serial(self) -> None:
        for i in range(self.groups):
            self.one(i)

    def grouped(self):
        """One grouped kernel over all experts (BF16 `torch._grouped_mm`); None where unsupported."""
        if self.precision != "bf16" or not hasattr(torch, "_grouped_mm"):
            return None
        a = torch.cat(self.a)
        b = torch.stack(self.b).transpose(-2, -1)  # (G, K, N), column-major per group
        offs = torch.arange(1, self.groups + 1, device=DEV, dtype=torch.int32) * self.m
        return lambda: torch._grouped_mm(a, b, offs=offs, out_dtype=torch.bfloat16)

    def free(self) -> None:
        del self.a, self.b


def expert_gemm_section(shapes: list[dict]) -> list[dict]:
    results = []
    done: dict[tuple, dict] = {}
    for shape in shapes:
        g, m, n, k, prec = shape["groups"], shape["m"], shape["n"], shape["k"], shape["precision"]
        if prec == "fp8":  # TE pads each expert's rows to 16 for FP8 GEMMs (Fp8Padding)
            m = 16 * math.ceil(m / 16)
        entry = {**{key: shape[key] for key in ("groups", "m", "n", "k", "precision")}, "m_run": m}
        for phase, (mm, nn, kk) in {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (k, n, m)}.items():
            key = (g, mm, nn, kk, prec)
            if key not in done:
                rec: dict = {}
                try:
                    eg = ExpertGemms(g, mm, nn, kk, prec)
                    reps = 10 if 2.0 * g * mm * nn * kk > 5e12 else 20
                    rec["multistream_graph_ms"] = graph_time_ms(eg.multistream, reps)
                    rec["serial_graph_ms"] = graph_time_ms(eg.serial, reps)
                    rec["multistream_eager_ms"] = events_time_ms(eg.multistream, reps)
                    grouped = eg.grouped()
                    if grouped is not None:
                        try:
                            rec["grouped_kernel_ms"] = events_time_ms(grouped, reps)
                        except Exception as exc:  # noqa: BLE001
                            rec["grouped_error"] = repr(exc)[:200]
                    eg.free()
                except Exception as exc:  # noqa: BLE001
                    rec["error"] = repr(exc)[:300]
                torch.cuda.empty_cache()
                done[key] = rec
            entry[phase] = {"mnk": [mm, nn, kk], **done[key]}
        results.append(entry)
    return results


def wgrad_nt_section(shapes: list[dict]) -> list[dict]:
    """BF16 weight gradients as Transformer Engine computes them, X^T (K x M) times dY (M x N) with X and dY
    row-major per expert (no alignment needed on the token count M), four streams, graph replay."""
    out = []
    seen = set()
    for shape in shapes:
        g, m, n, k, prec = shape["groups"], shape["m"], shape["n"], shape["k"], shape["precision"]
        if prec != "bf16" or (g, m, n, k) in seen:
            continue
        seen.add((g, m, n, k))
        rec = {"groups": g, "m": m, "n": n, "k": k}
        try:
            xs = [torch.randn(m, k, device=DEV, dtype=torch.bfloat16) for _ in range(g)]
            dys = [torch.randn(m, n, device=DEV, dtype=torch.bfloat16) for _ in range(g)]
            streams = [torch.cuda.Stream() for _ in range(STREAMS)]

            def run():
                cur = torch.cuda.current_stream()
                for st in streams:
                    st.wait_stream(cur)
                for i in range(g):
                    with torch.cuda.stream(streams[i % STREAMS]):
                        torch.mm(xs[i].t(), dys[i])
                for st in streams:
                    cur.wait_stream(st)

            rec["multistream_graph_ms"] = graph_time_ms(run, 10)
        except Exception as exc:  # noqa: BLE001
            rec["error"] = repr(exc)[:300]
        torch.cuda.empty_cache()
        out.append(rec)
    return out


def time_sdpa(backend: str, b: int, h: int, s: int, d: int, causal: bool, dv: int = 0) -> dict:
    """Forward and backward of PyTorch SDPA on `backend` ("cudnn" or "fa2") for b sequences of s queries,
    h heads of query-key dim d and value dim dv (default d): times and TFLOPS (backward 2.5x forward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dv = dv or d
    kernel = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}[backend]
    rec: dict = {}
    try:
        q, k = (torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        v = torch.randn(b, h, s, dv, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(b, h, s, dv, device=DEV, dtype=torch.bfloat16)
        with sdpa_kernel([kernel]):
            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
            rec["fwd_ms"] = events_time_ms(fwd, 10)
            o = fwd()
            rec["bwd_ms"] = events_time_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), 10)
        flops = 2.0 * b * h * s * s * (d + dv) / (2 if causal else 1)
        rec["fwd_tflops"], rec["bwd_tflops"] = flops / rec["fwd_ms"] / 1e9, 2.5 * flops / rec["bwd_ms"] / 1e9
    except Exception as exc:  # noqa: BLE001
        rec["error"] = repr(exc)[:300]
    torch.cuda.empty_cache()
    return rec


def sdpa_heads_section() -> list[dict]:
    """cuDNN SDPA at 4096 causal, head dim 128: how batch x heads (thread blocks) moves throughput."""
    out = []
    for b, h in ((1, 8), (1, 16), (1, 32), (2, 32), (1, 64), (2, 64), (4, 64)):
        out.append({"b": b, "h": h, "s": 4096, "d": 128, **time_sdpa("cudnn", b, h, 4096, 128, True)})
    return out


GRID_CASES = [  # b, h, s, d, causal: the grid-fill form (tiles = b x h x s / 128) at other lengths and masks
    (1, 8, 8192, 128, True),
    (1, 16, 8192, 128, True),
    (1, 32, 8192, 128, True),
    (1, 64, 8192, 128, True),
    (1, 16, 2048, 128, True),
    (1, 64, 2048, 128, True),
    (4, 64, 2048, 128, True),
    (1, 8, 4096, 128, False),
    (1, 32, 4096, 128, False),
    (2, 64, 4096, 128, False),
]


def sdpa_grid_section() -> list[dict]:
    """cuDNN SDPA over grids of other sequence lengths and without a mask, forward and backward; and MLA's
    head shape (query-key 192, value 128) at 4096 causal queries."""
    out = []
    cases = [(*c, c[3]) for c in GRID_CASES] + [(1, 32, 4096, 192, True, 128), (2, 128, 4096, 192, True, 128)]
    for b, h, s, d, causal, dv in cases:
        times = time_sdpa("cudnn", b, h, s, d, causal, dv)
        out.append({"b": b, "h": h, "s": s, "d": d, "dv": dv, "causal": causal, **times})
    return out


def eager_gpu_ms(fn, inputs: list[torch.Tensor], reps: int = 10) -> tuple[float, float]:
    """GPU time of fn()'s forward and of its backward as eager PyTorch runs them with the host ahead: a
    sleep kernel holds the stream while the host queues both, so the kernels run back to back with only
    the GPU's own gaps between them. Medians over `reps`."""
    for _ in range(3):
        y = fn()
        torch.autograd.grad(y, inputs, torch.ones_like(y))
    grad = torch.randn_like(fn())
    fwd, bwd = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # ~50 ms at the boost clock
        a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        a.record()
        y = fn()
        b.record()
        torch.autograd.grad(y, inputs, grad)
        c.record()
        c.synchronize()
        fwd.append(a.elapsed_time(b))
        bwd.append(b.elapsed_time(c))
    return statistics.median(fwd), statistics.median(bwd)


def megatron_rope(t: torch.Tensor, freqs: torch.Tensor, mscale: float) -> torch.Tensor:
    """Megatron-Core's unfused RoPE (`_apply_rotary_pos_emb_bshd`, core_v0.16.0), as tests/test_moe.py."""
    rot = freqs.shape[-1]
    t, t_pass = t[..., :rot], t[..., rot:]
    cos, sin = ((f(freqs) * mscale).to(t.dtype) for f in (torch.cos, torch.sin))
    x1, x2 = torch.chunk(t, 2, dim=-1)
    return torch.cat(((t * cos) + (torch.cat((-x2, x1), dim=-1) * sin), t_pass), dim=-1)


def eager_elementwise_section() -> list[dict]:
    """GPT-OSS's eager elementwise ops at its H100 rows' shapes (EP 8: 16 local experts, top-4, hidden and
    expert width 2880, 64 query and 8 key-value heads of 64, 4096 tokens a sequence), written as
    tests/test_moe.py writes them: the experts' fp32 down-projection bias (`_apply_bias`), the gate/up clamp,
    the unfused YaRN RoPE of q and k; micro-batches of 1 and 4."""
    out = []
    h, ffn, experts, top_k, s = 2880, 2880, 16, 4, 4096
    for mbs in (1, 4):
        rows = s * mbs * top_k // experts  # rows per local expert at the mean load
        rec: dict = {"micro_batch": mbs, "rows_per_expert": rows}
        try:
            y = torch.randn(experts * rows, h, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            biases = [torch.randn(h, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(experts)]
            probs = torch.rand(experts * rows, 1, device=DEV, requires_grad=True)

            def bias():
                chunks = zip(torch.split(y, rows), biases, torch.split(probs, rows), strict=True)
                return torch.cat([t + b * p for t, b, p in chunks]).to(torch.bfloat16)

            rec["bias_fwd_ms"], rec["bias_bwd_ms"] = eager_gpu_ms(bias, [y, *biases, probs])
            gu = torch.randn(s * mbs * top_k, 2 * ffn, device=DEV, dtype=torch.bfloat16, requires_grad=True)

            def clamp():
                gate, up = gu.chunk(2, -1)
                return torch.cat((gate.clamp(max=7.0), up.clamp(-7.0, 7.0)), -1)

            rec["clamp_fwd_ms"], rec["clamp_bwd_ms"] = eager_gpu_ms(clamp, [gu])
            freqs = torch.randn(s, 1, 1, 64, device=DEV)
            q = torch.randn(s, mbs, 64, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(s, mbs, 8, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            fq, bq = eager_gpu_ms(lambda: megatron_rope(q, freqs, 1.35), [q])
            fk, bk = eager_gpu_ms(lambda: megatron_rope(k, freqs, 1.35), [k])
            rec["rope_fwd_ms"], rec["rope_bwd_ms"] = fq + fk, bq + bk
            x = torch.randn(s * mbs, h, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            r = torch.randn(s * mbs, h, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            rec["residual_fwd_ms"], rec["residual_bwd_ms"] = eager_gpu_ms(lambda: x + r, [x, r])
        except Exception as exc:  # noqa: BLE001
            rec["error"] = repr(exc)[:300]
            rec["trace"] = traceback.format_exc()[-800:]
        torch.cuda.empty_cache()
        out.append(rec)
    return out


def dense_section() -> dict:
    out = {}
    for prec in ("bf16", "fp8"):
        eg = ExpertGemms(1, 8192, 8192, 8192, prec)
        ms = events_time_ms(eg.serial, 20, warmup=5)
        out[prec] = {"mnk": [8192, 8192, 8192], "ms": ms, "tflops": 2 * 8192**3 / ms / 1e9}
        eg.free()
    return out


def attention_flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    full = 4.0 * b * h * s * s * d
    return full / 2 if causal else full


def sdpa_section() -> list[dict]:
    """cuDNN and FlashAttention-2 through PyTorch SDPA at four training shapes."""
    cases = [
        ("gpt-oss (hd 64)", 1, 64, 4096, 64, True),
        ("qwen3 (hd 128)", 1, 32, 4096, 128, True),
        ("llama-70b 8k", 1, 64, 8192, 128, True),
        ("dit 32k non-causal", 1, 40, 32768, 128, False),
    ]
    return [
        {"case": name, "b": b, "h": h, "s": s, "d": d, "causal": causal, "backend": backend,
         **time_sdpa(backend, b, h, s, d, causal)}
        for name, b, h, s, d, causal in cases
        for backend in ("cudnn", "fa2")
    ]  # fmt: skip


WINDOW_CASES = [  # b, h, s, d, window (0: causal over the whole sequence), sink
    (1, 64, 4096, 64, 0, False),
    (1, 64, 4096, 64, 128, False),
    (1, 64, 4096, 64, 128, True),
]
SINK_CASES = [
    (1, 64, 4096, 64, 0, False),
    (1, 64, 4096, 64, 0, True),
    (1, 64, 4096, 64, 128, False),
    (1, 64, 4096, 64, 128, True),
    (2, 64, 4096, 64, 128, False),
    (2, 64, 4096, 64, 128, True),
    (1, 64, 8192, 64, 128, False),
    (1, 64, 8192, 64, 128, True),
    (1, 8, 4096, 64, 128, False),
    (1, 8, 4096, 64, 128, True),
    (4, 8, 4096, 64, 128, False),
    (4, 8, 4096, 64, 128, True),
    (4, 8, 4096, 64, 0, False),
    (4, 8, 4096, 64, 0, True),
]


def cudnn_window_section(cases: list[tuple] = WINDOW_CASES) -> list[dict]:
    """GPT-OSS's attention shapes through cuDNN's frontend (the kernels Transformer Engine runs): causal,
    causal within a sliding window, with or without a learnable sink logit per head."""
    import cudnn

    out = []
    handle = cudnn.create_handle()
    for b, h, s, d, window, sink in cases:
        name = ("causal" if not window else f"window {window}") + (" + sink" if sink else "")
        rec = {
            "case": name,
            "b": b,
            "h": h,
            "s": s,
            "d": d,
            "window": window,
            "sink": sink,
            "cudnn_version": cudnn.backend_version(),
        }
        try:
            q, k, v, o, do, dq, dk, dv = (torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16) for _ in range(8))
            stats = torch.empty(b, h, s, 1, device=DEV, dtype=torch.float32)
            sinks = torch.randn(1, h, 1, 1, device=DEV, dtype=torch.float32)
            dsinks = torch.zeros_like(sinks)
            bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
            mask = {"use_causal_mask": True}
            if window:
                mask = {
                    "diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT,
                    "diagonal_band_right_bound": 0,
                    "diagonal_band_left_bound": window,
                }

            def build(backward: bool):
                g = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
                tq, tk, tv = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
                extra = {}
                tsink = None
                if sink:
                    tsink = g.tensor_like(sinks)
                    extra["sink_token"] = tsink
                if not backward:
                    to, tst = g.sdpa(
                        name="sdpa", q=tq, k=tk, v=tv, is_inference=False, attn_scale=1 / math.sqrt(d), **mask, **extra
                    )
                    to.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride()))
                    tst.set_output(True).set_data_type(f32)
                    binds = {tq: q, tk: k, tv: v, to: o, tst: stats}
                else:
                    to, tdo, tst = g.tensor_like(o), g.tensor_like(do), g.tensor_like(stats)
                    tdsink = None
                    if sink:
                        tdsink = g.tensor_like(dsinks)
                        extra["dSink_token"] = tdsink
                    tdq, tdk, tdv = g.sdpa_backward(
                        name="sdpa_bwd",
                        q=tq,
                        k=tk,
                        v=tv,
                        o=to,
                        dO=tdo,
                        stats=tst,
                        attn_scale=1 / math.sqrt(d),
                        **mask,
                        **extra,
                    )
                    for t, ref in ((tdq, dq), (tdk, dk), (tdv, dv)):
                        t.set_output(True).set_dim(list(ref.shape)).set_stride(list(ref.stride()))
                    binds = {tq: q, tk: k, tv: v, to: o, tdo: do, tst: stats, tdq: dq, tdk: dk, tdv: dv}
                    if sink:
                        binds[tdsink] = dsinks
                if sink:
                    binds[tsink] = sinks
                g.validate()
                g.build_operation_graph()
                g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                g.check_support()
                g.build_plans()
                ws = torch.empty(g.get_workspace_size(), device=DEV, dtype=torch.uint8)
                return lambda: g.execute(binds, ws, handle=handle)

            full_flops = attention_flops(b, h, s, d, True)
            if sink:
                rec["dsink_abs_sum"] = float(dsinks.abs().sum())
            fwd = build(False)
            rec["fwd_ms"] = events_time_ms(fwd, 10)
            fwd()
            rec["bwd_ms"] = events_time_ms(build(True), 10)
            rec["causal_flops"] = full_flops
        except Exception as exc:  # noqa: BLE001
            rec["error"] = repr(exc)[:400]
            rec["trace"] = traceback.format_exc()[-800:]
        out.append(rec)
    return out


def host_section() -> dict:
    """Host (CPU) time per eager call, measured with the GPU never the bottleneck."""
    x = torch.ones(16, device=DEV)
    y = torch.empty_like(x)
    w = torch.randn(64, 64, device=DEV)
    a = torch.randn(32, 64, device=DEV)
    out = {}

    def per_call_us(fn, n: int = 5000) -> float:
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        return host / n * 1e6

    out["launch_add_us"] = per_call_us(lambda: torch.add(x, 1, out=y))
    out["torch_empty_us"] = per_call_us(lambda: torch.empty(1 << 20, device=DEV, dtype=torch.uint8))
    out["f_linear_us"] = per_call_us(lambda: F.linear(a, w))
    lat = []
    for _ in range(200):
        t = time.perf_counter()
        x.sum().item()
        lat.append(time.perf_counter() - t)
    out["item_roundtrip_us"] = statistics.median(lat) * 1e6
    return out


def host_autograd_section() -> dict:
    """Host time per eager op as a training step runs it: forward ops recorded by autograd, and the
    backward ops the autograd engine launches for them (a chain of 2000 elementwise ops on 16 values, so
    the GPU never holds the host up)."""
    n = 2000
    x = torch.ones(16, device=DEV, requires_grad=True)
    out = {}
    for _ in range(3):
        y = x
        for _ in range(n):
            y = y * 1.0001
        y.sum().backward()
    torch.cuda.synchronize()
    fwd, bwd = [], []
    for _ in range(5):
        t = time.perf_counter()
        y = x
        for _ in range(n):
            y = y * 1.0001
        fwd.append((time.perf_counter() - t) / n)
        loss = y.sum()
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss.backward()
        bwd.append((time.perf_counter() - t) / n)
        torch.cuda.synchronize()
    out["fwd_autograd_op_us"] = statistics.median(fwd) * 1e6
    out["bwd_engine_op_us"] = statistics.median(bwd) * 1e6
    with torch.no_grad():
        t = time.perf_counter()
        y = x
        for _ in range(n):
            y = y * 1.0001
        out["no_grad_op_us"] = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return out


def wan_block_section(
    dim: int = 5120, ffn: int = 13824, heads: int = 40, latent: tuple[int, int, int] = (13, 72, 160), text: int = 512
) -> dict:
    """One Wan 2.1 14B block as NeMo AutoModel trains it (diffusers' `WanTransformerBlock`, eager, BF16,
    attention through PyTorch SDPA) on 37,440 video tokens (a 13 x 72 x 160 latent, 1 x 2 x 2 patches)
    and 512 text tokens: forward and backward times with the host ahead (diffusers carried as a wheel)."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed, WanTransformerBlock

    block = WanTransformerBlock(dim, ffn, heads, qk_norm="rms_norm_across_heads", cross_attn_norm=True, eps=1e-6)
    block = block.to(DEV, torch.bfloat16)
    rope = WanRotaryPosEmbed(dim // heads, (1, 2, 2), 1024).to(DEV)
    f, h, w = latent
    rotary = rope(torch.empty(1, 16, f, h, w, device=DEV))
    tokens = f * (h // 2) * (w // 2)
    x = torch.randn(1, tokens, dim, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    context = torch.randn(1, text, dim, device=DEV, dtype=torch.bfloat16)
    temb = torch.randn(1, 6, dim, device=DEV, dtype=torch.bfloat16)
    params = [p for p in block.parameters() if p.requires_grad]
    out = {"tokens": tokens, "text": text, "dim": dim, "ffn": ffn, "heads": heads}
    out["fwd_ms"], out["bwd_ms"] = eager_gpu_ms(lambda: block(x, context, temb, rotary), [x, *params], reps=5)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def pinned(backend):  # the block with SDPA held to one back end (its backward follows the forward's)
        def run():
            with sdpa_kernel([backend]):
                return block(x, context, temb, rotary)

        return run

    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        try:
            out[f"{name}_fwd_ms"], out[f"{name}_bwd_ms"] = eager_gpu_ms(pinned(backend), [x, *params], reps=5)
        except Exception as exc:  # noqa: BLE001
            out[f"{name}_error"] = repr(exc)[:200]
    return out


CPP_SOURCE = r"""
#include <torch/extension.h>
#include <chrono>
void launch_noop(int n);
double launch_us(int n) {
  launch_noop(8);
  auto t0 = std::chrono::steady_clock::now();
  launch_noop(n);
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}
double empty_us(int n) {
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8);
  for (int i = 0; i < 8; ++i) { auto t = torch::empty({1 << 20}, opts); }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) { auto t = torch::empty({1 << 20}, opts); }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}
"""
CUDA_SOURCE = r"""
__global__ void noop_kernel() {}
void launch_noop(int n) { for (int i = 0; i < n; ++i) noop_kernel<<<1, 32>>>(); }
"""


def cpp_launch_section() -> dict:
    """Host time of a kernel launch and of a caching-allocator allocation issued from C++ (as Transformer
    Engine's quantize and GEMM wrappers issue theirs), without Python: an extension built here."""
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(
        name="launch_probe",
        cpp_sources=CPP_SOURCE,
        cuda_sources=CUDA_SOURCE,
        functions=["launch_us", "empty_us"],
        verbose=False,
        build_directory=None,
    )
    out = {"launch_us": [], "empty_us": [], "wrapper_subclass_us": []}
    for _ in range(5):
        torch.cuda.synchronize()
        out["launch_us"].append(ext.launch_us(500))  # under the launch queue's depth
        torch.cuda.synchronize()
        out["empty_us"].append(ext.empty_us(2000))
        out["wrapper_subclass_us"].append(wrapper_subclass_us(2000))
    return {k: statistics.median(v) for k, v in out.items()}


class QuantizedProbe(torch.Tensor):
    """A tensor subclass made as Transformer Engine makes its FP8 tensors (`_make_wrapper_subclass` around
    the quantized data and its scales)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale_inv: torch.Tensor):
        inst = torch.Tensor._make_wrapper_subclass(
            cls, data.shape, dtype=torch.bfloat16, device=data.device, requires_grad=False
        )
        inst._data, inst._scale_inv = data, scale_inv
        return inst

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # never called by the probe
        raise NotImplementedError(func)


def wrapper_subclass_us(n: int) -> float:
    """Host time to wrap quantized data and scales in a Python tensor subclass, per tensor."""
    data = torch.empty(1024, 1024, device=DEV, dtype=torch.uint8)
    scale = torch.empty(1, device=DEV)
    for _ in range(50):
        QuantizedProbe(data, scale)
    t = time.perf_counter()
    for _ in range(n):
        QuantizedProbe(data, scale)
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = json.loads((Path(__file__).parent / "moe_expert_gemms.json").read_text())
    props = torch.cuda.get_device_properties(0)
    result: dict = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    sections = {
        "host": host_section,
        "dense_gemm": dense_section,
        "expert_gemms": lambda: expert_gemm_section(shapes),
        "sdpa": sdpa_section,
        "cudnn_window": cudnn_window_section,
        "cudnn_sinks": lambda: cudnn_window_section(SINK_CASES),
        "wgrad_nt": lambda: wgrad_nt_section(shapes),
        "sdpa_heads": sdpa_heads_section,
        "sdpa_grid": sdpa_grid_section,
        "eager_elementwise": eager_elementwise_section,
        "host_autograd": host_autograd_section,
        "cpp_launch": cpp_launch_section,
        "wan_block": wan_block_section,
    }
    chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else list(sections)
    sections = {k: v for k, v in sections.items() if k in chosen}
    for name, fn in sections.items():
        t = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001
            result[name] = {"error": repr(exc)[:400], "trace": traceback.format_exc()[-1200:]}
        print(f"[{name}] {time.perf_counter() - t:.1f} s", flush=True)
        (out_dir / "kernels_measured.json").write_text(json.dumps(result, indent=1))
    keys = ("device", "torch", "cudnn", "host", "dense_gemm", "host_autograd", "cpp_launch", "wan_block")
    print(json.dumps({k: result[k] for k in keys if k in result}))
    for name in ("sdpa", "cudnn_window", "cudnn_sinks", "wgrad_nt", "sdpa_heads", "sdpa_grid", "eager_elementwise"):
        recs = result.get(name, [])
        for rec in recs if isinstance(recs, list) else [recs]:
            print(name, {k: v for k, v in rec.items() if k != "trace"})
            if "trace" in rec:
                print(rec["trace"])
    eg = result.get("expert_gemms")
    if isinstance(eg, list):
        for e in eg[:80]:
            f = e["fwd"]
            print(
                e["groups"],
                e["m"],
                e["n"],
                e["k"],
                e["precision"],
                {p: round(e[p].get("multistream_graph_ms", -1), 3) for p in ("fwd", "dgrad", "wgrad")},
                "grouped fwd",
                round(f.get("grouped_kernel_ms", -1), 3),
                f.get("error", ""),
            )


if __name__ == "__main__":
    main()
