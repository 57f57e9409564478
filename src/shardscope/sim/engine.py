"""List scheduling of per-rank action orders with cross-rank dependencies (the pipeline engine).

Each rank runs its actions in order on its compute stream; an action starts when the stream is free
and its inputs have arrived: F(m, c) needs F(m, c-1) from the previous chunk's rank plus the send/recv
time, B(m, c) needs B(m, c+1) likewise (or its own F at the last chunk), W(m, c) needs B(m, c).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shardscope.sim.schedules import Action


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the model chunks live: chunk ids, their rank and their neighbours in the data flow."""

    rank_of: Callable[[int], int]
    prev: Callable[[int], int | None]  # the chunk feeding this one in forward (None at the start)
    next: Callable[[int], int | None]  # the chunk it feeds (None at the loss)


@dataclass(frozen=True, slots=True)
class Timed:
    action: Action
    rank: int
    start_s: float
    end_s: float


def run_schedule(
    orders: list[list[Action]],
    layout: Layout,
    duration_s: Callable[[int, Action], float],
    transfer_s: float,
) -> list[list[Timed]]:
    """Start and end times of every action; raises if the orders deadlock (a schedule bug)."""
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * len(orders)
    pos = [0] * len(orders)
    out: list[list[Timed]] = [[] for _ in orders]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r, order in enumerate(orders):
            while pos[r] < len(order):
                a = order[pos[r]]
                ready = _ready_time(a, r, layout, done, transfer_s)
                if ready is None:
                    break
                start = max(free[r], ready)
                end = start + duration_s(r, a)
                done[(a.kind, a.mb, a.chunk)] = end
                out[r].append(Timed(a, r, start, end))
                free[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: orders[r][pos[r]] for r in range(len(orders)) if pos[r] < len(orders[r])}
            raise RuntimeError(f"pipeline schedule deadlocks at {stuck}")
    return out


def _ready_time(a: Action, rank: int, layout: Layout, done: dict, transfer_s: float) -> float | None:
    def after(kind: str, chunk: int) -> float | None:
        t = done.get((kind, a.mb, chunk))
        if t is None:
            return None
        return t + (transfer_s if layout.rank_of(chunk) != rank else 0.0)

    if a.kind == "F":
        p = layout.prev(a.chunk)
        return 0.0 if p is None else after("F", p)
    if a.kind == "B":
        n = layout.next(a.chunk)
        return after("F", a.chunk) if n is None else after("B", n)
    return after("B", a.chunk)  # W
