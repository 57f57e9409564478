"""`shardscope calibrate`: measure the GPU this runs on and write a profile (`db` schema).

Measured, in this order, until the time budget is spent (a coarse pass over every kind first, so a short
budget still covers each kind sparsely, then the grids are filled in):
  * dense GEMMs (BF16; FP8 per-tensor `torch._scaled_mm` where the GPU has FP8 tensor cores) over tokens x
    widths from 512 to 32k, decode-sized ones (1 to 256 rows, where reading the weight is the cost), and
    grouped GEMMs (MoE experts: 2-32 problems issued round-robin over four
    streams, as Transformer Engine issues them), each as a CUDA-graph replay: GPU time without host cost;
  * flash attention through PyTorch SDPA, each back end present (cuDNN, FlashAttention-2), forward and
    backward, causal and not, head dims 64 / 128 / 192+128 (MLA), 1k to 32k queries, 8 to 128 heads;
  * streaming bandwidth: a contiguous bf16 add and an eager op over a strided view (ATen's slower path),
    1 MiB to 4 GiB;
  * host cost of a kernel launch and of a `torch.empty`;
  * with 2+ GPUs, NCCL all-reduce, all-gather, reduce-scatter, all-to-all and send/recv over message sizes
    (under `torchrun`, over the job's ranks, across nodes if it spans them; else over this node's GPUs).
The conditions recorded: the GPU's name, SMs, memory, max SM / memory clocks, power limit and driver
(nvidia-smi), CUDA, torch, cuDNN and NCCL versions, host and date.

torch is imported only in here, and only by `shardscope calibrate`.
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.hardware.profile.db import Conditions, Point, attention_flops, write_profile

STREAMS = 4  # Transformer Engine's compute streams for grouped GEMMs (see costs.compute.TE_COMPUTE_STREAMS)
MAX_GEMM_FLOPS = 4e12  # larger GEMMs add time, not information (a few ms each at full rate)
MAX_ATTENTION_FLOPS = 4e13
GEMM_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768)  # tokens and widths, a factor of 2 apart
UNALIGNED_K = (1040, 2064, 4112, 8208)  # token counts not a multiple of 128 (wgrad depth): other kernels
DECODE_ROWS = (1, 4, 16, 64, 256)  # a serving engine's decode batch: GEMMs that read weights, not compute
GROUPS = (2, 4, 8, 16, 32)
EXPERT_ROWS = (256, 512, 1024, 2048, 4096, 8192, 16384)
EXPERT_WIDTHS = (512, 1024, 2048, 4096, 8192)
ATTENTION_SEQ = (1024, 2048, 4096, 8192, 16384, 32768)
ATTENTION_HEADS = (8, 16, 32, 64, 128)
ATTENTION_DIMS = ((64, 64), (128, 128), (192, 128))
STREAM_BYTES = tuple(1 << e for e in range(20, 33))  # 1 MiB to 4 GiB per operand
COLLECTIVE_BYTES = tuple(1 << e for e in range(16, 31, 2))  # 64 KiB to 1 GiB


def no_gpu_reason() -> str | None:
    """Why calibrate cannot run here (one line), or None when a CUDA GPU is present."""
    try:
        import torch
    except ImportError:
        return "calibrate measures a GPU through PyTorch, which is not installed (pip install 'shardscope[torch]')"
    if not torch.cuda.is_available():
        return "no GPU on this machine: calibrate measures the GPU it runs on"
    return None


# --- timing -------------------------------------------------------------------------------------------


def graph_time_s(torch: Any, fn: Callable[[], object], reps: int = 10) -> float:
    """GPU time of one call of `fn` without host launch cost: captured once in a CUDA graph, replays timed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return events_time_s(torch, graph.replay, reps)


def events_time_s(torch: Any, fn: Callable[[], object], reps: int = 10, warmup: int = 2) -> float:
    """Median GPU time of one call of `fn` between CUDA events, the host ahead (a sleep kernel holds the
    stream while the calls are queued, so host launch cost does not show)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(2_000_000)  # ~1 ms at boost clock: the host queues the call behind it
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


# --- cases: each a label and a function returning the points it measured ---------------------------------

Case = tuple[str, Callable[[], list[Point]]]


def _gemm_case(torch: Any, dtype: str, groups: int, m: int, n: int, k: int) -> Case:
    def run() -> list[Point]:
        dev = "cuda"
        a = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(groups)]
        b = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(groups)]
        if dtype == "fp8":  # per-tensor scaled FP8, TN layout (what cuBLASLt takes)
            a = [(x * 0.5).to(torch.float8_e4m3fn) for x in a]
            b = [(x * 0.5).to(torch.float8_e4m3fn) for x in b]
            scale = torch.tensor(1.0, device=dev)

            def one(i: int) -> object:
                return torch._scaled_mm(a[i], b[i].t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
        else:

            def one(i: int) -> object:
                return torch.mm(a[i], b[i].t())

        streams = [torch.cuda.Stream() for _ in range(min(STREAMS, groups))]

        def issue() -> None:  # round-robin over the streams, as Transformer Engine's grouped GEMM
            if groups == 1:
                one(0)
                return
            cur = torch.cuda.current_stream()
            for s in streams:
                s.wait_stream(cur)
            for i in range(groups):
                with torch.cuda.stream(streams[i % len(streams)]):
                    one(i)
            for s in streams:
                cur.wait_stream(s)

        sec = graph_time_s(torch, issue)
        return [Point("gemm", sec, dtype=dtype, variant="calibrate", m=m, n=n, k=k, groups=groups)]

    return f"gemm {dtype} {groups}x{m}x{n}x{k}", run


def _attention_case(torch: Any, backend: str, b: int, h: int, s: int, d: int, dv: int, causal: bool) -> Case:
    def run() -> list[Point]:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        kernel = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}[backend]
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        kk = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, h, s, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        with sdpa_kernel([kernel]):
            fwd = events_time_s(torch, lambda: sdpa(q, kk, v, is_causal=causal), reps=5)
            out = sdpa(q, kk, v, is_causal=causal)
            grad = torch.randn_like(out)
            bwd = events_time_s(torch, lambda: torch.autograd.grad(out, (q, kk, v), grad, retain_graph=True), reps=5)
        shape = dict(
            dtype="bf16", variant="sdpa", batch=b, heads=h, seq=s, head_dim=d, head_dim_v=dv, causal=causal,
            window=0, sinks=False, backend=backend,
        )  # fmt: skip
        return [Point("attention_fwd", fwd, **shape), Point("attention_bwd", bwd, **shape)]

    mask = "causal" if causal else "full"
    return f"attention {backend} {b}x{h}x{s} hd{d}/{dv} {mask}", run


def _stream_case(torch: Any, nbytes: int, strided: bool) -> Case:
    def run() -> list[Point]:
        elems = nbytes // 2
        if strided:  # ATen over a strided view: the first half of each row of a (rows, 2 x 4096) tensor
            x = torch.randn(max(1, elems // 4096), 2 * 4096, device="cuda", dtype=torch.bfloat16)
            half = x.chunk(2, -1)[0]
            moved = 2 * 2 * half.numel()  # read the view, write a contiguous result

            def fn() -> object:
                return half.clamp(max=7.0)
        else:
            x = torch.randn(elems, device="cuda", dtype=torch.bfloat16)
            y = torch.randn(elems, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(x)
            moved = 3 * 2 * elems  # two reads, one write

            def fn() -> object:
                return torch.add(x, y, out=out)

        sec = events_time_s(torch, fn, reps=10)
        return [Point("elementwise", sec, variant="aten" if strided else "contiguous", nbytes=float(moved))]

    return f"stream {'strided' if strided else 'contiguous'} {nbytes >> 20} MiB", run


def _host_case(torch: Any) -> Case:
    def run() -> list[Point]:
        x = torch.ones(16, device="cuda")
        y = torch.empty_like(x)

        def per_call_s(fn: Callable[[], object], n: int = 5000) -> float:
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            dt = (time.perf_counter() - t) / n
            torch.cuda.synchronize()
            return dt

        return [
            Point("host_launch", per_call_s(lambda: torch.add(x, 1, out=y)), variant="python torch.add"),
            Point("host_alloc", per_call_s(lambda: torch.empty(1 << 20, device="cuda")), variant="python torch.empty"),
        ]

    return "host launch and allocation", run


def _factor4(values: tuple[int, ...]) -> set[int]:
    """Every other value of a factor-2 ladder: the coarse pass."""
    return set(values[::2])


def gemm_cases(torch: Any, fp8: bool, coarse: bool) -> Iterator[Case]:
    dtypes = ("bf16", "fp8") if fp8 else ("bf16",)
    sizes = tuple(sorted(_factor4(GEMM_SIZES))) if coarse else GEMM_SIZES
    rows = tuple(sorted(_factor4(EXPERT_ROWS))) if coarse else EXPERT_ROWS
    for dtype in dtypes:
        for m in sizes:
            for n in sizes:
                for k in (*sizes, *(() if coarse else UNALIGNED_K)):
                    if 2.0 * m * n * k <= MAX_GEMM_FLOPS:
                        yield _gemm_case(torch, dtype, 1, m, n, k)
        for m in DECODE_ROWS[::2] if coarse else DECODE_ROWS[1::2]:
            for n in sizes:
                for k in sizes:
                    if n >= 1024 and k >= 1024:
                        yield _gemm_case(torch, dtype, 1, m, n, k)
        for g in GROUPS if not coarse else (4, 16):
            for m in rows:
                for n in EXPERT_WIDTHS:
                    for k in (*EXPERT_WIDTHS, *(() if coarse else UNALIGNED_K)):
                        if 2.0 * g * m * n * k <= MAX_GEMM_FLOPS:
                            yield _gemm_case(torch, dtype, g, m, n, k)


def attention_cases(torch: Any, backends: list[str], coarse: bool) -> Iterator[Case]:
    seqs = tuple(sorted(_factor4(ATTENTION_SEQ))) if coarse else ATTENTION_SEQ
    heads = tuple(sorted(_factor4(ATTENTION_HEADS))) if coarse else ATTENTION_HEADS
    for backend in backends:
        for d, dv in ATTENTION_DIMS:
            for causal in (True, False):
                for s in seqs:
                    for h in heads:
                        for b in (1, 2, 4) if not coarse else (1,):
                            fl = attention_flops(b, h, s, d, dv, causal, 0, True)
                            if fl <= MAX_ATTENTION_FLOPS and (backend != "fa2" or d == dv):
                                yield _attention_case(torch, backend, b, h, s, d, dv, causal)


def stream_cases(torch: Any, coarse: bool) -> Iterator[Case]:
    sizes = STREAM_BYTES[::2] if coarse else STREAM_BYTES[1::2]
    for nbytes in sizes:
        for strided in (False, True):
            yield _stream_case(torch, nbytes, strided)


def sdpa_backends(torch: Any) -> list[str]:
    """SDPA back ends that run a small causal problem here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    found = []
    q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    for name, kernel in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([kernel]):
                sdpa(q, q, q, is_causal=True)
            found.append(name)
        except RuntimeError:
            pass
    return found


# --- collectives ------------------------------------------------------------------------------------------


def _collective_ops(dist: Any, buf: Any, part: Any, rank: int, world: int) -> dict[str, Callable[[], object]]:
    """One call of each collective over the default group: `buf` the full buffer, `part` one rank's share."""

    def send_recv() -> None:  # pairs (0, 1), (2, 3), ...: each sends its buffer to its peer
        peer = rank ^ 1
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, buf.clone(), peer)])
        for r in reqs:
            r.wait()

    ops: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(buf),
        "all_gather": lambda: dist.all_gather_into_tensor(buf, part),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, buf),
        "all_to_all": lambda: dist.all_to_all_single(buf, buf.clone()),
    }
    if world % 2 == 0:
        ops["send_recv"] = send_recv
    return ops


def collective_points(torch: Any, rank: int, world: int, local: int, deadline: float) -> list[Point]:
    """NCCL collectives over the initialised default group, each message size until `deadline`: the
    slowest rank's median time (the collective's time), on rank 0."""
    import torch.distributed as dist

    variant = "intra-node" if world <= local else "inter-node"
    dev = torch.device("cuda", torch.cuda.current_device())
    points = []
    for nbytes in COLLECTIVE_BYTES:
        if time.time() > deadline:
            break
        elems = nbytes // 2
        per = max(1, elems // world)
        buf = torch.randn(per * world, device=dev, dtype=torch.bfloat16)
        part = torch.randn(per, device=dev, dtype=torch.bfloat16)
        ops = _collective_ops(dist, buf, part, rank, world)
        for kind, fn in ops.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(10):
                dist.barrier()
                torch.cuda.synchronize()
                t = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            sec = torch.tensor([statistics.median(times)], device=dev)
            dist.all_reduce(sec, op=dist.ReduceOp.MAX)
            points.append(Point(kind, float(sec.item()), variant=variant, nbytes=float(2 * per * world), ranks=world))
    return points


def _spawned_collectives(rank: int, world: int, init: str, deadline: float, out: str) -> None:
    """A worker of `local_collectives` (module level: torch.multiprocessing pickles it by name)."""
    import json

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        points = collective_points(torch, rank, world, world, deadline)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        fields = ("op", "seconds", "variant", "nbytes", "ranks")
        Path(out).write_text(json.dumps([[getattr(p, f) for f in fields] for p in points]))


def local_collectives(torch: Any, gpus: int, deadline: float) -> list[Point]:
    """Collectives over this node's `gpus` GPUs, one spawned process each (no torchrun needed)."""
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init, out = os.path.join(tmp, "init"), os.path.join(tmp, "points.json")
        mp.spawn(_spawned_collectives, args=(gpus, init, deadline, out), nprocs=gpus, join=True)
        rows = json.loads(Path(out).read_text()) if os.path.exists(out) else []
    return [Point(op, sec, variant=variant, nbytes=nbytes, ranks=ranks) for op, sec, variant, nbytes, ranks in rows]


# --- conditions -------------------------------------------------------------------------------------------


def _nvidia_smi(index: int) -> dict[str, str]:
    """Driver, max clocks and power limit of GPU `index` from nvidia-smi (empty where it is not there)."""
    keys = ("driver_version", "clocks.max.sm", "clocks.max.mem", "power.limit")
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(keys)}", "--format=csv,noheader,nounits", "-i", str(index)],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.strip().split(",")]
    return dict(zip(keys, values, strict=False)) if len(values) == len(keys) else {}


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def conditions(torch: Any) -> Conditions:
    """What this machine measures under (GPU 0 of this process)."""
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    smi = _nvidia_smi(index)
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a build without NCCL
        nccl = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return Conditions(
        source="calibrate",
        gpu_name=props.name,
        sms=props.multi_processor_count,
        sm_clock_mhz=_number(smi.get("clocks.max.sm")),
        mem_clock_mhz=_number(smi.get("clocks.max.mem")),
        power_limit_w=_number(smi.get("power.limit")),
        memory_gib=round(props.total_memory / 2**30, 2),
        driver=smi.get("driver_version"),
        cuda=torch.version.cuda,
        torch=torch.__version__,
        cudnn=str(cudnn) if cudnn is not None else None,
        nccl=nccl,
        host=socket.gethostname(),
        date=datetime.date.today().isoformat(),
    )


# --- the run ----------------------------------------------------------------------------------------------


def run_calibration(out: Path, budget_s: float, name: str | None = None) -> int:
    """Measure until `budget_s` is spent and write the profile to `out`; the number of points written.
    Under torchrun every rank measures collectives; rank 0 alone measures its GPU and writes."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from shardscope.hardware.catalog import load_gpu

    start = time.time()
    deadline = start + budget_s
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    points: list[Point] = []
    if world > 1:  # under torchrun: collectives over the job's ranks first (every rank must take part)
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(torch.cuda.device_count())))
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
        try:
            points += collective_points(torch, rank, world, local, start + budget_s * 0.3)
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return 0
    console = Console(stderr=True)
    cond = conditions(torch)
    try:
        catalog = load_gpu(cond.gpu_name).name
    except ShardscopeError:
        catalog = cond.gpu_name
    fp8 = torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "_scaled_mm")
    backends = sdpa_backends(torch)
    console.print(
        f"calibrating {cond.gpu_name} ({cond.sms} SMs, {cond.memory_gib} GiB; FP8 {'yes' if fp8 else 'no'}; "
        f"attention: {', '.join(backends) or 'none'}) for up to {budget_s / 60:.1f} min"
    )
    plan: list[Case] = [_host_case(torch)]
    for coarse in (True, False):
        plan += [
            *gemm_cases(torch, fp8, coarse),
            *attention_cases(torch, backends, coarse),
            *stream_cases(torch, coarse),
        ]
    gpus = torch.cuda.device_count()
    failed: dict[str, str] = {}  # kind of case -> the first reason one could not run here
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("measuring", total=len(plan))
        for label, run in plan:
            if time.time() > deadline - (60 if world == 1 and gpus > 1 else 0):
                break  # the last minute is kept for the collectives, where there are GPUs to run them on
            progress.update(task, description=label)
            try:
                points += run()
            except Exception as e:  # noqa: BLE001 - a shape or back end this GPU cannot run: measure the rest
                failed.setdefault(label.split()[0], f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                failed[label] = ""
            torch.cuda.empty_cache()
            progress.advance(task)
        done = int(progress.tasks[0].completed)
    if world == 1 and gpus > 1:
        console.print(f"NCCL collectives over {gpus} GPUs")
        points += local_collectives(torch, gpus, max(deadline, time.time() + 30))
    write_profile(
        out, name or catalog, catalog, [(cond, points)], notes=f"shardscope calibrate, {done} of {len(plan)} cases"
    )
    minutes = (time.time() - start) / 60
    not_run = sum(1 for reason in failed.values() if not reason)
    console.print(
        f"wrote {out}: {len(points)} points from {done} of {len(plan)} cases ({not_run} not runnable here) in "
        f"{minutes:.1f} min" + ("" if done == len(plan) else " (budget spent; a larger --budget-min measures more)")
    )
    for reason in (r for r in failed.values() if r):
        console.print(f"  not runnable: {reason}")
    return len(points)
