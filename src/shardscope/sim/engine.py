"""Discrete-event execution of pipeline schedules over per-rank compute streams.

Each rank holds one or more lanes (ordered lists of F/B actions; DualPipe has one per direction) and,
for zero-bubble schedules, a pool of weight-gradient (W) actions that become available after their B.
Ranks are advanced in global time order: a rank starts the earliest-ready head of its lanes; if that
would leave it idle and a W is pending, it runs the W first (zero-bubble filling). Cross-rank inputs
arrive after the producing action plus a send/recv: F(m, c) needs F(m, prev(c)), B(m, c) needs
B(m, next(c)) (or its own F at the loss), W(m, c) needs B(m, c).
"""

from __future__ import annotations

from collections import deque
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


def input_ready_s(
    a: Action, rank: int, done: dict[tuple[str, int, int], float], layout: Layout, transfer_s: float
) -> float | None:
    """When `a`'s input is on `rank` (None: not produced yet), from the end times in `done`: F(m, c) after
    F(m, prev(c)), B(m, c) after B(m, next(c)) (or its own F at the loss), W(m, c) after B(m, c), plus a
    send/recv where the producer is on another rank."""

    def after(kind: str, chunk: int) -> float | None:
        t = done.get((kind, a.mb, chunk))
        if t is None:
            return None
        return t + (transfer_s if layout.rank_of(chunk) != rank else 0.0)

    if a.kind == "W":
        return after("B", a.chunk)
    if a.kind == "F":
        p = layout.prev(a.chunk)
        return 0.0 if p is None else after("F", p)
    nxt = layout.next(a.chunk)
    return after("F", a.chunk) if nxt is None else after("B", nxt)


def run_schedule(
    lanes: list[list[list[Action]]],
    layout: Layout,
    duration_s: Callable[[int, Action], float],
    transfer_s: float,
    split_w: bool = False,
    max_pending_w: Callable[[int], int] | None = None,
) -> list[list[Timed]]:
    """Start and end times of every action; raises if the orders deadlock (a schedule bug)."""
    n = len(lanes)
    queues = [[deque(lane) for lane in rank_lanes] for rank_lanes in lanes]
    pending_w: list[deque[Action]] = [deque() for _ in range(n)]
    free = [0.0] * n
    done: dict[tuple[str, int, int], float] = {}
    out: list[list[Timed]] = [[] for _ in range(n)]

    def ready_time(a: Action, rank: int) -> float | None:
        return input_ready_s(a, rank, done, layout, transfer_s)

    def execute(r: int, a: Action, start: float) -> None:
        end = start + duration_s(r, a)
        done[(a.kind, a.mb, a.chunk)] = end
        out[r].append(Timed(a, r, start, end))
        free[r] = end
        if split_w and a.kind == "B":
            pending_w[r].append(Action("W", a.mb, a.chunk))

    def has_work(r: int) -> bool:
        return any(queues[r]) or bool(pending_w[r])

    while any(has_work(r) for r in range(n)):
        progressed = False
        for r in sorted((r for r in range(n) if has_work(r)), key=free.__getitem__):
            heads = [(ready_time(q[0], r), i) for i, q in enumerate(queues[r]) if q]
            known = [(max(t, free[r]), 0 if queues[r][i][0].kind == "B" else 1, i) for t, i in heads if t is not None]
            cap = max_pending_w(r) if max_pending_w else len(pending_w[r]) + 1
            if pending_w[r] and (len(pending_w[r]) > cap or not known or min(known)[0] > free[r]):
                execute(r, pending_w[r].popleft(), free[r])
            elif known:
                start, _, i = min(known)
                execute(r, queues[r][i].popleft(), start)
            else:
                continue
            progressed = True
            break
        if not progressed:
            stuck = {r: [q[0] for q in queues[r] if q] for r in range(n) if any(queues[r])}
            raise RuntimeError(f"pipeline schedule deadlocks at {stuck}")
    return out
