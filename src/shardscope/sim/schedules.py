"""Pipeline schedules as per-rank orders of actions: F (forward), B (backward; with zero-bubble
schedules only the input-gradient part) and W (weight-gradient part) of (micro-batch, model chunk).

  gpipe        all forwards, then all backwards (Huang et al. 2019).
  1f1b         p - r - 1 warm-up forwards, then one-forward-one-backward (Narayanan et al. 2021).
  interleaved  1F1B over v model chunks per rank (Narayanan et al. 2021, §2.2), micro-batches in groups
               of p per chunk.
  zb-h1        1F1B with B split into B and W; W fills what would be bubble (Qi et al. 2024, ZB-H1).
  dualpipe     two pipelines fed from both ends (DeepSeek-V3 report, §3.2.1): rank r holds chunk r and
               chunk 2p-1-r; half the micro-batches enter at each end, and steady-state phases pair a
               forward with a backward of opposite directions.

The dependencies between ranks are implied: F(m, c) needs F(m, c-1) (the previous chunk of the model,
on another rank) and B(m, c) needs B(m, c+1); W(m, c) needs B(m, c) on the same rank.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe")


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  # "F", "B" or "W"
    mb: int
    chunk: int  # model chunk index in model order (0 .. chunks-1)


def chunk_of(rank: int, local: int, pp: int) -> int:
    """Model chunk held by `rank` as its `local`-th virtual stage (interleaved placement)."""
    return rank + local * pp


def _gpipe(pp: int, m: int) -> list[list[Action]]:
    return [[Action("F", i, r) for i in range(m)] + [Action("B", i, r) for i in reversed(range(m))] for r in range(pp)]


def _one_f_one_b(pp: int, m: int, split_w: bool = False) -> list[list[Action]]:
    out = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        seq = [Action("F", i, r) for i in range(warm)]
        f, b = warm, 0
        pending_w: list[int] = []
        while b < m:
            if f < m:
                seq.append(Action("F", f, r))
                f += 1
            seq.append(Action("B", b, r))
            if split_w:
                pending_w.append(b)
                # ZB-H1: defer W while later forwards still have to flow; then drain one W per step.
                if f >= m or len(pending_w) > pp - r - 1:
                    seq.append(Action("W", pending_w.pop(0), r))
            b += 1
        seq += [Action("W", i, r) for i in pending_w]
        out.append(seq)
    return out


def _interleaved(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """Megatron's interleaved 1F1B: virtual micro-batch k on rank r runs chunk (k // pp) % vpp of
    micro-batch (k // (pp·vpp))·pp + k % pp, forwards in that order and backwards in reverse chunk order."""
    total = m * vpp

    def fwd(k: int) -> tuple[int, int]:
        group, within = divmod(k, pp * vpp)
        local, slot = divmod(within, pp)
        return group * pp + slot, local

    def bwd(k: int) -> tuple[int, int]:
        mb, local = fwd(k)
        return mb, vpp - 1 - local

    out = []
    for r in range(pp):
        warm = min((pp - r - 1) * 2 + (vpp - 1) * pp, total)
        seq = []
        for k in range(warm):
            mb, local = fwd(k)
            seq.append(Action("F", mb, chunk_of(r, local, pp)))
        for k in range(total - warm):
            mb, local = fwd(warm + k)
            seq.append(Action("F", mb, chunk_of(r, local, pp)))
            mb, local = bwd(k)
            seq.append(Action("B", mb, chunk_of(r, local, pp)))
        for k in range(total - warm, total):
            mb, local = bwd(k)
            seq.append(Action("B", mb, chunk_of(r, local, pp)))
        out.append(seq)
    return out


def _dualpipe(pp: int, m: int) -> list[list[Action]]:
    """Bidirectional pipeline over 2·pp chunks: micro-batches [0, m/2) flow down (chunks 0..pp-1 on ranks
    0..pp-1), [m/2, m) flow up (chunk pp + i on rank pp-1-i). Each rank warms up with forwards of both
    directions (more from the nearer end), then alternates forward and backward of opposite
    directions, B split into B and W with W deferred to fill the drain."""
    half = m // 2
    out = []
    for r in range(pp):
        down, up = r, 2 * pp - 1 - r  # chunks held: one per direction
        f_down = list(range(half))
        f_up = list(range(half, m))
        seq: list[Action] = []
        warm_down = min(pp - r - 1, half) + 1
        warm_up = min(r, half)
        for i in range(warm_down):
            seq.append(Action("F", f_down[i], down))
        for i in range(warm_up):
            seq.append(Action("F", f_up[i], up))
        nd, nu, bd, bu = warm_down, warm_up, 0, 0
        pending_w: list[Action] = []
        while bd < half or bu < m - half:
            if nu < len(f_up):
                seq.append(Action("F", f_up[nu], up))
                nu += 1
            if bd < half:
                seq.append(Action("B", f_down[bd], down))
                pending_w.append(Action("W", f_down[bd], down))
                bd += 1
            if nd < half:
                seq.append(Action("F", f_down[nd], down))
                nd += 1
            if bu < m - half and bu < nu:
                seq.append(Action("B", f_up[bu], up))
                pending_w.append(Action("W", f_up[bu], up))
                bu += 1
            while len(pending_w) > pp:
                seq.append(pending_w.pop(0))
        seq += pending_w
        out.append(seq)
    return out


def build_schedule(name: str, pp: int, vpp: int, m: int) -> list[list[Action]]:
    """Per-rank action orders for `m` micro-batches on `pp` ranks."""
    if name == "gpipe":
        return _gpipe(pp, m)
    if name == "1f1b":
        return _one_f_one_b(pp, m)
    if name == "zb-h1":
        return _one_f_one_b(pp, m, split_w=True)
    if name == "interleaved":
        return _interleaved(pp, vpp, m)
    if name == "dualpipe":
        return _dualpipe(pp, m)
    raise ValueError(f"unknown schedule {name}")


def chunks_of_schedule(name: str, pp: int, vpp: int) -> int:
    if name == "interleaved":
        return pp * vpp
    if name == "dualpipe":
        return 2 * pp
    return pp
