"""Build the shipped profiles from the measurements the project holds (`validation/*_h100.json`).

`python -m shardscope.hardware.profile.shipped validation/kernels_measured_h100.json
validation/eager_regions_h100.json --name H100 --out src/shardscope/hardware/profiles/H100.sql` writes the
profile as SQL text (`db.dump_sql`), which `load_profile("H100")` reads into an in-memory database. Text,
not a binary .db, so that a change to a shipped profile is a readable diff and the file can be checked to
be exactly what this code builds from the JSON (tests/test_profile.py).

What is taken from `kernels_measured_h100.json` (made by `bench/device/h100_kernels.py`):
  * GEMMs: the dense 8192^3 BF16 / FP8 references; every expert GEMM's forward and dgrad, and FP8 wgrad,
    as CUDA-graph replays of Transformer Engine's four-stream issue (`multistream_graph_ms`); BF16 weight
    gradients in Transformer Engine's own layout (`wgrad_nt`), not the TN layout (which TE uses for FP8
    only, and where an unaligned token count makes cuBLAS several times slower);
  * attention: cuDNN and FlashAttention-2 through SDPA (`sdpa`, `sdpa_heads`, `sdpa_grid`), and cuDNN
    with a sliding window and learned sinks (`cudnn_window`, `cudnn_sinks`), forward and backward;
  * streaming: the contiguous residual add of `eager_elementwise` (its bytes: two bf16 reads and one write
    of 4096 x micro-batch tokens of width 2880, as the bench allocates them); the strided eager ops of
    that section are left out, their bytes being a property of how each op is written;
  * host: per-launch and per-allocation host times (`host_runs`, `cpp_launch_runs`).
From `eager_regions_h100.json`: the dense `F.linear` forwards (MxNxK in the region's name).
Clocks, power limit, driver and NCCL were not recorded by those runs and stay empty.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from shardscope.hardware.profile.db import Conditions, Point, dump_sql, write_profile

# `eager_elementwise`'s residual add: x + r over (4096 x micro-batch, 2880) bf16 tensors
_RESIDUAL_TOKENS, _RESIDUAL_WIDTH, _BF16 = 4096, 2880, 2


def kernels_points(data: dict) -> list[Point]:
    """Points of a `kernels_measured_*.json`."""
    pts: list[Point] = []
    for dtype, rec in sorted(data.get("dense_gemm", {}).items()):
        m, n, k = rec["mnk"]
        pts.append(Point("gemm", rec["ms"] / 1e3, dtype=dtype, variant="dense", m=m, n=n, k=k, groups=1))
    for e in data.get("expert_gemms", []):
        phases = ("fwd", "dgrad", "wgrad") if e["precision"] == "fp8" else ("fwd", "dgrad")
        for phase in phases:
            rec = e.get(phase, {})
            if "multistream_graph_ms" not in rec:
                continue
            m, n, k = rec["mnk"]
            sec = rec["multistream_graph_ms"] / 1e3
            pts.append(Point("gemm", sec, dtype=e["precision"], variant=phase, m=m, n=n, k=k, groups=e["groups"]))
    for e in data.get("wgrad_nt", []):
        if "multistream_graph_ms" in e:  # wgrad of (M, N, K) per expert: the (K, N, M) GEMM
            sec = e["multistream_graph_ms"] / 1e3
            pts.append(
                Point("gemm", sec, dtype="bf16", variant="wgrad", m=e["k"], n=e["n"], k=e["m"], groups=e["groups"])
            )
    for section in ("sdpa", "sdpa_heads", "sdpa_grid", "cudnn_window", "cudnn_sinks"):
        for e in data.get(section, []):
            shape = dict(
                dtype="bf16",
                variant=section,
                batch=e["b"],
                heads=e["h"],
                seq=e["s"],
                head_dim=e["d"],
                head_dim_v=e.get("dv", e["d"]),
                causal=e.get("causal", True) or bool(e.get("window")),
                window=e.get("window", 0),
                sinks=e.get("sink", False),
                backend=e.get("backend", "cudnn"),
            )
            for phase in ("fwd", "bwd"):
                if f"{phase}_ms" in e:
                    pts.append(Point(f"attention_{phase}", e[f"{phase}_ms"] / 1e3, **shape))
    for e in data.get("eager_elementwise", []):
        if "residual_fwd_ms" in e:
            nbytes = 3 * _BF16 * _RESIDUAL_TOKENS * e["micro_batch"] * _RESIDUAL_WIDTH
            pts.append(Point("elementwise", e["residual_fwd_ms"] / 1e3, variant="contiguous", nbytes=nbytes))
    for e in data.get("host_runs", []):
        pts.append(Point("host_launch", e["launch_add_us"] / 1e6, variant="python torch.add"))
        pts.append(Point("host_alloc", e["torch_empty_us"] / 1e6, variant="python torch.empty"))
    for e in data.get("cpp_launch_runs", []):
        pts.append(Point("host_launch", e["launch_us"] / 1e6, variant="c++ launch"))
        pts.append(Point("host_alloc", e["empty_us"] / 1e6, variant="c++ empty"))
    return _unique(pts)


def regions_points(data: dict) -> list[Point]:
    """The dense GEMM forwards of an `eager_regions_*.json` (regions named `F.linear ... (MxNxK)`)."""
    pts = []
    for r in data.get("regions", []):
        found = re.search(r"F\.linear .*\((\d+)x(\d+)x(\d+)\)", r["name"])
        if found and r.get("fwd_ms"):
            m, n, k = (int(v) for v in found.groups())
            pts.append(Point("gemm", r["fwd_ms"] / 1e3, dtype="bf16", variant="fwd", m=m, n=n, k=k, groups=1))
    return pts


def _unique(pts: list[Point]) -> list[Point]:
    """One point per shape and time: the bench reuses one timing for phases of the same shape."""
    seen: set = set()
    out = []
    for p in pts:
        key = (p.op, p.dtype, p.m, p.n, p.k, p.groups, p.seconds)
        if p.op != "gemm" or key not in seen:
            out.append(p)
            seen.add(key)
    return out


def _conditions(data: dict, source: str) -> Conditions:
    cudnn = data.get("cudnn")
    return Conditions(
        source=source,
        gpu_name=data.get("device") or data.get("gpu") or "",
        sms=data.get("sms"),
        cuda=data.get("cuda"),
        torch=data.get("torch"),
        cudnn=str(cudnn) if cudnn is not None else None,
        date=data.get("date"),
    )


def build_sql(paths: list[Path], name: str, gpu: str) -> str:
    """The shipped profile built from the JSON files `paths`, as SQL text."""
    sessions = []
    for path in paths:
        data = json.loads(path.read_text())
        pts = regions_points(data) if "regions" in data else kernels_points(data)
        sessions.append((_conditions(data, f"validation/{path.name}"), pts))
    con = write_profile(None, name, gpu, sessions, notes="built by shardscope.hardware.profile.shipped")
    try:
        return dump_sql(con)
    finally:
        con.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--gpu", help="catalog GPU (default: the name)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.write_text(build_sql(args.json, args.name, args.gpu or args.name))


if __name__ == "__main__":
    main()
