"""Chrome-trace JSON (Perfetto, chrome://tracing) of a step, simulated or the closed form laid out in time.

One process per simulated rank (one per pipeline stage), one thread per stream (compute, TP/CP/EP
comm, DP/FSDP comm, PP send/recv), complete events named after the work ("layer 12 fwd attn", "fsdp
all-gather layer 13"), flow arrows from each pipeline send to its receive, and a counter track of
allocated memory. Times are microseconds from the start of the step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.sim.step import SimResult

COMPUTE, COMM, DP, PP = 1, 2, 3, 4
THREADS = {COMPUTE: "compute", COMM: "TP/CP/EP comm", DP: "DP/FSDP comm", PP: "PP send/recv"}
PHASE = {"F": "fwd", "B": "bwd", "W": "wgrad"}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def complete_event(
    pid: int, tid: int, start: float, dur: float, name: str, cat: str | None = None, **args: Any
) -> dict[str, Any]:
    """A complete ("X") event: `start` and `dur` in seconds, written in microseconds; `cat` its category."""
    ev = {"ph": "X", "pid": pid, "tid": tid, "ts": _us(start), "dur": _us(max(dur, 0.0)), "name": name}
    if cat is not None:
        ev["cat"] = cat
    if args:
        ev["args"] = args
    return ev


_x = complete_event


def name_events(pid: int, process: str, threads: dict[int, str]) -> list[dict[str, Any]]:
    """Metadata ("M") events naming a process (sorted by its pid) and its threads."""
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
    ]
    ev += [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": n}} for tid, n in threads.items()
    ]
    return ev


def counter_event(pid: int, name: str, start: float, **values: float) -> dict[str, Any]:
    """A counter ("C") sample at `start` seconds."""
    return {"ph": "C", "pid": pid, "name": name, "ts": _us(start), "args": values}


def write_chrome_trace(path: Path, events: list[dict[str, Any]], metadata: dict[str, Any]) -> None:
    """The Chrome-trace JSON document (Perfetto, chrome://tracing) of `events`, times in microseconds."""
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata}
    try:
        Path(path).write_text(json.dumps(doc))
    except OSError as exc:
        raise ShardscopeError(f"cannot write {path}: {exc.strerror}") from None


def _draw_action(ev: list, result: SimResult, r: int, t) -> None:
    """An action as its layers in order: each layer's compute as an attention and an MLP slice, its
    exposed communication after it on the comm thread, and its FSDP gathers on the DP thread, scaled so
    the layers fill the action (which also holds embedding/head work and straggler slowdown)."""
    a = t.action
    layers = result.chunks[a.chunk].layers
    dur = t.end_s - t.start_s
    if not layers:
        ev.append(_x(r, COMPUTE, t.start_s, dur, f"{PHASE[a.kind]} embedding/head", micro_batch=a.mb))
        return
    details = [result.layer_detail[i] for i in layers]
    if a.kind == "F":
        parts = [(d.fwd_compute_s, d.fwd_exposed_s, d.attn_share_fwd) for d in details]
    elif a.kind == "B":
        parts = [(d.bwd_compute_s, d.bwd_exposed_s, d.attn_share_bwd) for d in details]
    else:
        parts = [(1.0, 0.0, 0.5) for _ in details]
    total = sum(c + e for c, e, _ in parts) or 1.0
    scale = dur / total
    ts = t.start_s
    order = list(zip(layers, details, parts, strict=True))
    if a.kind != "F":
        order.reverse()
    for layer, d, (compute, exposed, share) in order:
        if d.gather_s and a.kind in ("F", "B"):
            ev.append(
                _x(
                    r,
                    DP,
                    max(ts - d.gather_s, t.start_s - d.gather_s),
                    d.gather_s,
                    f"fsdp all-gather layer {layer}",
                    micro_batch=a.mb,
                )
            )
        for part, frac in (("attn", share), ("mlp", 1 - share)):
            ev.append(
                _x(
                    r,
                    COMPUTE,
                    ts,
                    compute * scale * frac,
                    f"layer {layer} {PHASE[a.kind]} {part}",
                    micro_batch=a.mb,
                    chunk=a.chunk,
                )
            )
            ts += compute * scale * frac
        if d.reduce_s and a.kind == "B":
            ev.append(_x(r, DP, ts, d.reduce_s, f"fsdp reduce-scatter layer {layer}", micro_batch=a.mb))
        if exposed:
            ev.append(_x(r, COMM, ts, exposed * scale, f"layer {layer} {PHASE[a.kind]} TP/CP/EP comm (exposed)"))
            ts += exposed * scale


def _feeder(result: SimResult, kind: str, mb: int, chunk: int) -> tuple[str, int, int] | None:
    """The action whose output this one receives: F from the previous chunk, B from the next."""
    half = len(result.chunks) // 2
    other = chunk - 1 if kind == "F" else chunk + 1
    if other < 0 or other >= len(result.chunks):
        return None
    if result.schedule == "dualpipe" and chunk // half != other // half:
        return None
    return (kind, mb, other)


def trace_events(result: SimResult) -> list[dict[str, Any]]:
    est = result.estimate
    ev: list[dict[str, Any]] = []
    for r in range(len(result.timeline)):
        ev.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"pipeline stage {r}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        for tid, tname in THREADS.items():
            ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": tname}})
    ends = {(t.action.kind, t.action.mb, t.action.chunk): t for tl in result.timeline for t in tl}
    flow = 0
    for r, tl in enumerate(result.timeline):
        if result.gather_s > 0:
            ev.append(_x(r, DP, 0.0, result.gather_s, "weight all-gather (exposed)"))
        for t in tl:
            _draw_action(ev, result, r, t)
            if t.action.kind == "W":
                continue
            src_key = _feeder(result, t.action.kind, t.action.mb, t.action.chunk)
            src = ends.get(src_key) if src_key else None
            # (the closed form packs each rank's work, so a receive may be drawn before its send: no arrow)
            if src is not None and src.rank != r and t.start_s >= src.end_s:
                flow += 1
                ev.append(
                    _x(
                        src.rank,
                        PP,
                        src.end_s,
                        t.start_s - src.end_s,
                        f"send {PHASE[t.action.kind]} mb {t.action.mb} to stage {r}",
                    )
                )
                ev.append(
                    {
                        "ph": "s",
                        "id": flow,
                        "pid": src.rank,
                        "tid": PP,
                        "ts": _us(src.end_s),
                        "name": "pp",
                        "cat": "pipeline",
                    }
                )
                ev.append(
                    {
                        "ph": "f",
                        "id": flow,
                        "pid": r,
                        "tid": COMPUTE,
                        "ts": _us(t.start_s),
                        "name": "pp",
                        "cat": "pipeline",
                        "bp": "e",
                    }
                )
        last = max((t.end_s for t in tl), default=result.gather_s)
        if result.grad_tail_s[r] > 0:
            ev.append(_x(r, DP, last, result.grad_tail_s[r], "gradient reduction (exposed tail)"))
        ev.append(_x(r, COMPUTE, est.step_time_s - result.optimizer_s, result.optimizer_s, "optimizer step"))
        for when, nbytes in result.memory_series[r]:
            ev.append(
                {
                    "ph": "C",
                    "pid": r,
                    "name": "memory",
                    "ts": _us(when),
                    "args": {"allocated_gib": round(nbytes / 2**30, 6)},
                }
            )
    # Prefetched gathers before the first layer and reduce-scatters after the last backward overlap
    # the neighbouring steps; the trace shows one step, so they are clipped to it.
    span = _us(est.step_time_s)
    for e in ev:
        if e["ph"] == "X":
            end = min(e["ts"] + e["dur"], span)
            e["ts"] = min(max(e["ts"], 0.0), span)
            e["dur"] = round(max(end - e["ts"], 0.0), 3)
    return ev


def write_trace(result: SimResult, path: Path) -> None:
    est = result.estimate
    metadata = {
        "model": est.model,
        "gpu": est.gpu,
        "gpus": est.gpus,
        "schedule": result.schedule,
        "step_time_s": est.step_time_s,
        "peak_gib": est.memory.peak_gib,
    }
    write_chrome_trace(path, trace_events(result), metadata)
