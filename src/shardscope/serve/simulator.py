"""Discrete-event simulation of one engine replica: continuous batching with chunked prefill under a token
budget, paged KV blocks and preemption by recompute, as vLLM V1's scheduler does (`vllm/v1/core/sched/
scheduler.py`): running requests first, in order, each taking what it still needs (one token when decoding)
out of `max_num_batched_tokens`; when a request cannot get its KV blocks the last running request is
preempted (blocks freed, recomputed later from its prompt and the tokens it had generated); waiting
requests join FCFS only in iterations without preemption, up to `max_num_seqs`.

Events are iteration ends and request arrivals. Stretches of decode-only iterations in which no request
arrives, finishes, joins, or runs out of blocks are stepped in a scalar loop over the aggregate context
length (every sequence gains one token per step), so the cost per iteration does not grow with the batch.

KV blocks are counted per layer where the engine frees what a windowed layer no longer reads (vLLM's hybrid
KV cache manager: `SlidingWindowManager` drops the blocks before the window, `ChunkedLocalAttentionManager`
those before the current chunk): a request holding c tokens then takes a block of every full layer per
`block_size` tokens and of each windowed layer only for the blocks its window or chunk still covers.

Shared prompts are cached where the engine caches prefixes (`Engine.prefix_caching`, vLLM's and SGLang's
default): a prefix every request shares (`prefix`, a system prompt) and the whole prompt the samples of one
prompt share (`Request.group`, vLLM's `n`). Once a request has computed a shared prefix's full blocks, they
become one shared copy; requests that start later begin from the longest cached one (at least one prompt
token is always computed) and hold only their own blocks. Requests already running keep their own copies,
as the engines do. A shared copy is freed when the last request that shares it finishes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shardscope.serve.cost import Batch, IterationCost
from shardscope.serve.engine import Engine
from shardscope.serve.workload import Request


@dataclass(slots=True)
class _Seq:
    idx: int  # index into the replica's requests
    prompt: int
    out_total: int
    generated: int = 0
    computed: int = 0  # tokens whose KV is in the cache
    blocks: int = 0  # blocks of its own (beyond a cached prefix it shares)
    last_token_s: float = 0.0
    base: int = 0  # tokens of the shared cached prefix it started from


@dataclass(slots=True)
class ReplicaRun:
    """What one replica did, per request (indices of its own request list) and in aggregate."""

    arrival_s: list[float]
    first_token_s: list[float]
    finish_s: list[float]
    itl: list[tuple[float, int]]  # (inter-token gap, how many tokens had it)
    occupancy_s: float  # integral over time of requests in the system (arrived, not finished)
    max_kv_blocks: int
    kv_blocks: int
    preemptions: int
    iterations: int
    end_s: float = 0.0
    kv_usage: list[tuple[float, float]] = field(default_factory=list)  # (time, used fraction) samples
    # with `trace`: every iteration as (start s, duration s, prefill tokens, decode sequences)
    timeline: list[tuple[float, float, int, int]] | None = None


def window_keys(c: int, n: int, w: int) -> float:
    """Keys seen by queries at positions c .. c+n−1 (position p sees p+1 keys), each capped at a sliding
    window of w keys (w = 0: no window)."""
    if w <= 0:
        return n * c + n * (n + 1) / 2
    a = max(0, min(n, w - c))  # queries whose whole causal prefix fits the window
    return a * c + a * (a + 1) / 2 + (n - a) * w


def _block_phases(contexts: list[int], block_size: int) -> list[int]:
    """How many sequences are r steps from needing their next block, for r = 0 .. block_size−1: a sequence
    holding c tokens in full blocks of `block_size` fills its last block after (−c mod block_size) more."""
    phases = [0] * block_size
    for c in contexts:
        phases[-c % block_size] += 1
    return phases


def _new_blocks(phases: list[int], steps: int, block_size: int) -> int:
    """Blocks the sequences counted in `phases` need to grow by `steps` tokens each: one at step r+1, then
    every `block_size` steps (O(block_size), not O(sequences))."""
    return sum(count * ((steps - 1 - r) // block_size + 1) for r, count in enumerate(phases) if count and steps > r)


class _Growth:
    """New blocks the running sequences (their `contexts`) need to grow by `steps` tokens each: from their
    block phases (O(block_size)), or sequence by sequence where blocks are counted per layer (windowed
    layers stop growing past their window)."""

    __slots__ = ("bs", "contexts", "held", "phases", "units")

    def __init__(self, contexts: list[int], units: Callable[[int], int], bs: int, per_layer: bool) -> None:
        self.bs, self.units = bs, units
        self.contexts = contexts if per_layer else []
        self.held = sum(map(units, contexts)) if per_layer else 0
        self.phases = None if per_layer else _block_phases(contexts, bs)

    def __call__(self, steps: int) -> int:
        if self.phases is not None:
            return _new_blocks(self.phases, steps, self.bs)
        return sum(self.units(c + steps) for c in self.contexts) - self.held


def kv_block_units(cost: IterationCost, engine: Engine) -> tuple[Callable[[int], int], int]:
    """(blocks a request holding c tokens takes, blocks per all-layer block): all-layer blocks, or where the
    engine frees windowed layers' blocks (`Engine.kv_window_freed`) one layer's blocks, each windowed layer
    keeping those its sliding window (the last `w` keys) or its chunk still covers."""
    bs, kinds = engine.block_size, cost.d.model.layer_kinds()
    w = cost.d.model.attention_window
    windowed = sum(k.attention == "window" for k in kinds)
    chunked = sum(k.attention == "chunk" for k in kinds)
    if not (engine.kv_window_freed and w and (windowed or chunked)):
        return (lambda c: -(-c // bs)), 1
    full = len(kinds) - windowed - chunked

    def units(c: int) -> int:
        blocks = -(-c // bs)
        kept_window = blocks - max(0, (c - w + 1) // bs)  # vLLM: blocks wholly before the window are freed
        kept_chunk = blocks - (c // w) * w // bs  # and those wholly before the current chunk
        return full * blocks + windowed * kept_window + chunked * kept_chunk

    return units, len(kinds)


def _head_fits(s: _Seq, budget: int, free: int, units: Callable[[int], int], engine: Engine) -> bool:
    """Whether the first waiting request would join now, by the general iteration's rule, after the running
    decodes took their tokens. While decodes only grow, the answer stays no until a request finishes."""
    need = s.prompt + s.generated - s.computed
    take = min(need, budget)
    if take <= 0 or (take < need and not engine.chunked_prefill):
        return False
    held = s.prompt + s.out_total if engine.kv_admission == "reserve_full" else s.computed + take
    return units(held) - units(s.base) - s.blocks <= free


class _SharedPrefixes:
    """The prompt prefixes requests share, each keyed: ("all",) every request's `prefix`, ("group", g) the
    whole prompt of group g's samples; in full blocks, at most a request's prompt less one token."""

    def __init__(self, requests: list[Request], prefix: int, block_size: int) -> None:
        self.block_size = bs = block_size
        self.levels: list[list[tuple[tuple, int]]] = []  # per request: (key, tokens), shortest first
        self.refs: dict[tuple, int] = {}  # requests not finished that share the key
        for r in requests:
            own = []
            if prefix >= bs:
                own.append((("all",), prefix // bs * bs))
            if r.group >= 0 and (r.input_len - 1) // bs * bs > (own[-1][1] if own else 0):
                own.append((("group", r.group), (r.input_len - 1) // bs * bs))
            self.levels.append(own)
            for key, _ in own:
                self.refs[key] = self.refs.get(key, 0) + 1
        self.tokens: dict[tuple, int] = {}  # cached keys: their tokens
        self.held: dict[tuple, int] = {}  # cached keys: the blocks of their shared copy
        self.pending = len(self.refs)  # keys not cached yet

    def cached_tokens(self, idx: int, prompt: int) -> int:
        """Tokens a request not yet started skips: its longest cached prefix (at least one token computed)."""
        best = max((self.tokens[key] for key, _ in self.levels[idx] if key in self.tokens), default=0)
        return min(best, (prompt - 1) // self.block_size * self.block_size) if best else 0

    def uncached(self, idx: int) -> list[tuple[tuple, int]]:
        return [(key, tokens) for key, tokens in self.levels[idx] if key not in self.tokens and self.refs[key]]

    def cache(self, key: tuple, tokens: int, blocks: int) -> None:
        self.tokens[key], self.held[key] = tokens, blocks
        self.pending -= 1

    def release(self, idx: int) -> int:
        """A request finished: the blocks of the shared copies no request needs any more."""
        freed = 0
        for key, _ in self.levels[idx]:
            self.refs[key] -= 1
            if self.refs[key]:
                continue
            if key in self.held:
                freed += self.held.pop(key)
            elif key not in self.tokens:
                self.pending -= 1  # no request left to cache it
        return freed


def simulate_replica(
    requests: list[Request],
    cost: IterationCost,
    engine: Engine,
    kv_blocks: int,
    concurrency: int = 0,
    trace: bool = False,
    prefilled: bool = False,
    prefix: int = 0,
) -> ReplicaRun:
    """Run `requests` (in arrival order) through one replica. `concurrency` > 0: a closed loop, the first
    `concurrency` requests sent at t = 0 and each later one when a request finishes. `trace`: record every
    iteration in `timeline`. `prefilled`: requests arrive with their prompt's KV and first token (the
    decode instance of a disaggregated deployment); their first token time is left to the caller.
    `prefix`: prompt tokens every request shares, cached where the engine caches prefixes."""
    n = len(requests)
    bs, budget_max, seqs_max = engine.block_size, engine.max_num_batched_tokens, engine.max_num_seqs
    window = cost.d.model.attention_window if cost.window_layers else 0
    units, per_block = kv_block_units(cost, engine)
    layer_blocks = per_block > 1  # blocks counted per layer (windowed layers free theirs)
    pool = kv_blocks * per_block
    arrival = [r.arrival_s for r in requests]
    released = n
    if concurrency > 0:
        released = min(concurrency, n)
        arrival = [0.0 if i < released else math.nan for i in range(n)]
    first = [math.nan] * n
    finish = [math.nan] * n
    run = ReplicaRun(arrival, first, finish, [], 0.0, 0, kv_blocks, 0, 0)
    timeline = run.timeline = [] if trace else None
    waiting: deque[_Seq] = deque()
    running: list[_Seq] = []
    free, t, nxt, done = pool, 0.0, 0, 0
    # TRT-LLM's GUARANTEED_NO_EVICT: a request joins only with blocks for its prompt and whole output, so
    # nothing is ever preempted; vLLM and SGLang allocate as tokens come and preempt when the pool is full.
    reserve = engine.kv_admission == "reserve_full"
    shares = _SharedPrefixes(requests, prefix, bs) if engine.prefix_caching and not prefilled else None
    if shares is not None and not shares.pending:
        shares = None  # nothing shared

    def hit(s: _Seq) -> None:
        """A request not yet started begins from the longest cached prefix it shares."""
        if shares is not None and s.computed == 0:
            s.computed = s.base = shares.cached_tokens(s.idx, s.prompt)

    def cache_prefixes(s: _Seq, reached: int) -> None:
        """A request whose KV reaches a shared prefix's full blocks turns them into the shared copy (still
        held, now by the prefix); requests waiting to start begin from it."""
        new = False
        for key, tokens in shares.uncached(s.idx):
            if reached >= tokens > s.base:
                give = units(tokens) - units(s.base)
                s.blocks -= give
                s.base = tokens
                shares.cache(key, tokens, give)
                new = True
        if new:
            for w in waiting:
                hit(w)

    # vLLM caches the full blocks a step is about to compute when it schedules them, so a request scheduled
    # later in the same step already starts from them; SGLang inserts a prefix into its radix tree after
    # the forward that computed it
    at_schedule = shares is not None and engine.prefix_cached_at_schedule

    def finish_seq(s: _Seq) -> None:
        nonlocal free, done, released
        finish[s.idx] = t
        free += s.blocks
        s.blocks = 0
        done += 1
        if shares is not None:
            free += shares.release(s.idx)
        if released < n and concurrency > 0:  # the client sends its next request
            arrival[released] = t
            released += 1

    while done < n:
        while nxt < released and arrival[nxt] <= t:  # arrivals up to now join the queue
            r = requests[nxt]
            run.occupancy_s += t - arrival[nxt]
            if prefilled:
                waiting.append(_Seq(nxt, r.input_len, r.output_len, 1, r.input_len, 0, arrival[nxt]))
            else:
                waiting.append(_Seq(nxt, r.input_len, r.output_len))
                hit(waiting[-1])
            nxt += 1
        if not running and not waiting:
            t = max(t, arrival[nxt])  # idle until the next arrival
            continue
        run.iterations += 1
        used = pool - free
        run.max_kv_blocks = max(run.max_kv_blocks, used)

        # ---- fast path: a stretch of decode-only iterations --------------------------------------------
        nrun = len(running)
        admissible = (
            bool(waiting) and nrun < seqs_max and _head_fits(waiting[0], budget_max - nrun, free, units, engine)
        )
        if (
            nrun
            and not admissible
            and nrun <= budget_max
            and all(s.generated and s.computed == s.prompt + s.generated - 1 for s in running)
        ):
            k = min(s.out_total - s.generated for s in running)
            below = [s.computed for s in running if s.computed < window] if window else []
            if below:  # keep every sequence on one side of the window during the stretch
                k = min(k, min(window - c for c in below))
            grow = _Growth([] if reserve else [s.computed for s in running], units, bs, layer_blocks)
            if grow(k) > free:  # largest k whose new blocks fit
                lo, hi = 0, k
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if grow(mid) <= free else (lo, mid - 1)
                k = lo
            if k >= 1:
                total = sum(s.computed for s in running)
                sum_below, n_below = sum(below), len(below)
                next_a = arrival[nxt] if nxt < released else math.inf
                steps, in_sys = 0, nrun + len(waiting)
                for j in range(1, k + 1):
                    kv = total + nrun * j
                    kvw = sum_below + n_below * j + (nrun - n_below) * window if window else kv
                    dt = cost.decode_time_s(nrun, kv, kvw)
                    if timeline is not None:
                        timeline.append((t, dt, 0, nrun))
                    run.occupancy_s += in_sys * dt
                    t += dt
                    run.itl.append((dt, nrun))
                    steps = j
                    if t >= next_a:
                        break
                run.iterations += steps - 1
                free -= grow(steps)
                for s in running:
                    s.computed += steps
                    s.generated += steps
                    if not reserve:
                        s.blocks = units(s.computed) - units(s.base)
                    s.last_token_s = t
                run.max_kv_blocks = max(run.max_kv_blocks, pool - free)
                if steps == k:
                    still = []
                    for s in running:
                        if s.generated == s.out_total:
                            finish_seq(s)
                        else:
                            still.append(s)
                    running = still
                run.kv_usage.append((t, (pool - free) / pool))
                continue

        # ---- one general iteration -----------------------------------------------------------------------
        budget = budget_max
        scheduled: list[tuple[_Seq, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            take = min(s.prompt + s.generated - s.computed, budget)
            want = max(0, units(s.computed + take) - units(s.base) - s.blocks)
            self_preempted = False
            while want > free:  # preempt from the back of the running list until it fits
                victim = running.pop()
                free += victim.blocks
                victim.blocks = victim.computed = victim.base = 0
                hit(victim)
                waiting.appendleft(victim)
                run.preemptions += 1
                preempted = True
                if victim is s:
                    self_preempted = True
                    break
            if self_preempted:
                break
            free -= want
            s.blocks += want
            scheduled.append((s, take))
            budget -= take
            i += 1
            if at_schedule and shares.pending:
                cache_prefixes(s, s.computed + take)
        if not preempted:
            while waiting and budget > 0 and len(running) < seqs_max:
                s = waiting[0]
                need = s.prompt + s.generated - s.computed
                take = min(need, budget)
                if take < need and not engine.chunked_prefill:
                    break
                held = s.prompt + s.out_total if reserve else s.computed + take
                want = max(0, units(held) - units(s.base) - s.blocks)
                if want > free:
                    break
                waiting.popleft()
                running.append(s)
                free -= want
                s.blocks += want
                scheduled.append((s, take))
                budget -= take
                if at_schedule and shares.pending:
                    cache_prefixes(s, s.computed + take)
        run.max_kv_blocks = max(run.max_kv_blocks, pool - free)

        pt, pairs, pairs_w, dseq, dkv, dkvw, sampled = 0, 0.0, 0.0, 0, 0, 0, 0
        for s, take in scheduled:
            c = s.computed
            if take == 1 and s.generated and c == s.prompt + s.generated - 1:
                dseq += 1
                dkv += c + 1
                dkvw += min(c + 1, window) if window else c + 1
            else:
                pt += take
                pairs += window_keys(c, take, 0)
                pairs_w += window_keys(c, take, window)
            if c + take == s.prompt + s.generated:
                sampled += 1
        b = Batch(pt, pairs, pairs_w, dseq, dkv, dkvw, sampled)
        dt = cost.time_s(b)
        if timeline is not None:
            timeline.append((t, dt, pt, dseq))
        run.occupancy_s += (len(running) + len(waiting)) * dt
        t_prev, t = t, t + dt
        regular = 0
        finished = False
        for s, take in scheduled:
            s.computed += take
            if s.computed != s.prompt + s.generated:
                continue  # a prefill chunk that does not reach the end samples nothing
            s.generated += 1
            if s.generated == 1:
                first[s.idx] = t
            elif s.last_token_s == t_prev:
                regular += 1
            else:  # resumed after a preemption: its gap spans the wait
                run.itl.append((t - s.last_token_s, 1))
            s.last_token_s = t
            if s.generated == s.out_total:
                finish_seq(s)
                finished = True
        if shares is not None and shares.pending and not at_schedule:
            for s in running:
                if math.isnan(finish[s.idx]):
                    cache_prefixes(s, s.computed)
        if regular:
            run.itl.append((dt, regular))
        if finished:
            running = [s for s in running if math.isnan(finish[s.idx])]
        run.kv_usage.append((t, (pool - free) / pool))
    run.end_s = t
    run.max_kv_blocks = -(-run.max_kv_blocks // per_block)  # in the pool's all-layer blocks
    return run
