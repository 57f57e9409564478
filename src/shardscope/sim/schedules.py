"""Pipeline schedules as per-rank orders of actions: F (forward), B (backward; with zero-bubble
schedules only the input-gradient part) and W (weight-gradient part) of (micro-batch, model chunk).

  gpipe        all forwards, then all backwards (Huang et al. 2019).
  1f1b         p - r - 1 warm-up forwards, then one-forward-one-backward (Narayanan et al. 2021).
  interleaved  1F1B over v model chunks per rank (Narayanan et al. 2021, §2.2), micro-batches in groups
               of p per chunk.
  zb-h1        1F1B with B split into B (input gradient) and W (weight gradient); W fills what would be
               bubble, with no more W deferred than keeps 1F1B's activation memory (Qi et al. 2024).
  dualpipe     two pipelines fed from both ends (DeepSeek-V3 report, §3.2.1): rank r holds stage r of
               the downward pipeline and stage p-1-r of the upward one (two weight copies); half the
               micro-batches enter at each end. The per-rank order is the published one
               (deepseek-ai/DualPipe `DualPipe.step`, its steps 1-8): warm-up forwards, then
               overlapped forward-backward pairs of the two directions, with zero-bubble B/W splits
               only where DualPipe enables them (`dualpipe_units`).

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


def _gpipe(pp: int, m: int) -> list[list[list[Action]]]:
    return [[[Action("F", i, r) for i in range(m)] + [Action("B", i, r) for i in range(m)]] for r in range(pp)]


def _one_f_one_b_order(r: int, pp: int, m: int, chunk: int, mbs: list[int]) -> list[Action]:
    """1F1B on pipeline position r of pp: r' = pp - r - 1 warm-up forwards, then alternate."""
    warm = min(pp - r - 1, len(mbs))
    seq = [Action("F", mbs[i], chunk) for i in range(warm)]
    for j in range(len(mbs)):
        if warm + j < len(mbs):
            seq.append(Action("F", mbs[warm + j], chunk))
        seq.append(Action("B", mbs[j], chunk))
    return seq


def _one_f_one_b(pp: int, m: int) -> list[list[list[Action]]]:
    return [[_one_f_one_b_order(r, pp, m, r, list(range(m)))] for r in range(pp)]


def _interleaved(pp: int, vpp: int, m: int) -> list[list[list[Action]]]:
    """Megatron's interleaved 1F1B: virtual micro-batch k on rank r runs chunk (k // pp) % vpp of
    micro-batch (k // (pp·vpp))·pp + k % pp, forwards in that order and backwards in reverse chunk order."""
    total = m * vpp

    def fwd(k: int) -> tuple[int, int]:
        group, within = divmod(k, pp * vpp)
        local, slot = divmod(within, pp)
        return group * pp + slot, local

    out = []
    for r in range(pp):
        warm = min((pp - r - 1) * 2 + (vpp - 1) * pp, total)
        seq = []
        for k in range(warm):
            mb, local = fwd(k)
            seq.append(Action("F", mb, chunk_of(r, local, pp)))
        for k in range(total):
            if warm + k < total:
                mb, local = fwd(warm + k)
                seq.append(Action("F", mb, chunk_of(r, local, pp)))
            mb, local = fwd(k)
            seq.append(Action("B", mb, chunk_of(r, vpp - 1 - local, pp)))
        out.append([seq])
    return out


@dataclass(frozen=True, slots=True)
class Unit:
    """One step of a rank's DualPipe order: a single action, or a forward and a backward chunk of two
    micro-batches run as one (`_forward_backward_chunk`: it receives both inputs, computes, then sends
    both outputs). `overlapped`: the pair runs DualPipe's overlapped F&B, each chunk's all-to-alls under
    the other's compute (Fig. 4); the middle ranks' first pair of the steady phase runs them one after
    the other ("we don't overlap these two chunks to further reduce bubble size")."""

    actions: tuple[Action, ...]
    overlapped: bool = False


def dualpipe_units(pp: int, m: int) -> list[list[Unit]]:
    """DualPipe's order on each of `pp` ranks for `m` micro-batches (half per direction), step for step
    as deepseek-ai/DualPipe `DualPipe.step` runs it. Chunk s is stage s of the downward pipeline (on rank
    s), chunk pp + s stage s of the upward one (on rank pp-1-s). On rank r, with h = min(r, pp-1-r),
    "phase 0" is the direction in which r is stage h and "phase 1" the one in which it is stage pp-1-h.
    A backward whose W follows later in the order is split zero-bubble style (input gradient first);
    every other backward computes its weight gradient at once. Peak in flight: 2·(pp/2) - h forwards of
    phase 0 plus h + 1 of phase 1, pp + 1 on every rank (the README's "Activation: PP+1")."""
    if pp % 2 or m % 2 or m < 2 * pp:
        raise ValueError(f"DualPipe needs an even pp and an even count of at least 2·pp micro-batches ({pp}, {m})")
    return [_dualpipe_rank(r, pp, m) for r in range(pp)]


def _dualpipe_rank(r: int, pp: int, m: int) -> list[Unit]:
    """Rank r's units in `dualpipe_units` (DualPipe.step's steps 1-8; 'F0' is a forward of phase 0)."""
    half, ranks, h = m // 2, pp // 2, min(r, pp - 1 - r)
    down, up = (r, list(range(half))), (2 * pp - 1 - r, list(range(half, m)))
    phases = (down, up) if r < ranks else (up, down)
    nf, nb = [0, 0], [0, 0]  # forwards and backwards issued per phase (each in micro-batch order)
    seq: list[Unit] = []
    deferred: list[Action] = []  # W of split backwards, first in first out

    def fwd(p: int) -> Action:
        chunk, mbs = phases[p]
        nf[p] += 1
        return Action("F", mbs[nf[p] - 1], chunk)

    def bwd(p: int, split: bool = False) -> Action:
        chunk, mbs = phases[p]
        nb[p] += 1
        a = Action("B", mbs[nb[p] - 1], chunk)
        if split:
            deferred.append(Action("W", a.mb, a.chunk))
        return a

    def one(a: Action) -> None:
        seq.append(Unit((a,)))

    def pair(p: int, overlapped: bool = True) -> None:  # F of phase p with B of the other phase
        first = fwd(p)
        seq.append(Unit((first, bwd(1 - p)), overlapped))

    for _ in range((ranks - h - 1) * 2):  # step 1: nF0
        one(fwd(0))
    for _ in range(h + 1):  # step 2: nF0F1
        one(fwd(0))
        one(fwd(1))
    for _ in range(ranks - h - 1):  # step 3: nB1W1F1 (zero bubble)
        one(bwd(1, split=True))
        one(deferred.pop(0))
        one(fwd(1))
    for i in range(half - pp + h + 1):  # step 4, the main step: nF0B1F1B0
        pair(0, overlapped=not (i == 0 and h == ranks - 1))
        pair(1)
    for _ in range(ranks - h - 1):  # step 5: nB1F1B0
        one(bwd(1))
        pair(1)
    split = False
    for i in range(h + 1):  # step 6: nB1B0, from its middle on split zero-bubble style
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        one(bwd(1, split))
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        one(bwd(0, split))
    for _ in range(ranks - h - 1):  # step 7: nWB0 (zero bubble)
        one(deferred.pop(0))
        one(bwd(0, split=True))
    for _ in range(h + 1):  # step 8: nW
        one(deferred.pop(0))
    return seq


def _dualpipe(pp: int, m: int) -> list[list[list[Action]]]:
    """DualPipe's published order as one lane per rank, W actions in place (run it with split_w off;
    the simulator runs `dualpipe_units` itself, pairs as one)."""
    return [[[a for unit in rank for a in unit.actions]] for rank in dualpipe_units(pp, m)]


def build_schedule(name: str, pp: int, vpp: int, m: int) -> list[list[list[Action]]]:
    """Per-rank lanes of F/B actions for `m` micro-batches on `pp` ranks (W actions of zero-bubble
    schedules are generated by the engine after each B, except DualPipe's, which its lanes hold)."""
    if name == "gpipe":
        return _gpipe(pp, m)
    if name in ("1f1b", "zb-h1"):
        return _one_f_one_b(pp, m)
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
