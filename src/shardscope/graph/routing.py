"""Expert routing load: how many tokens the hottest expert-parallel rank receives.

Balanced routing (what benchmarks force, e.g. Megatron-Bridge's force-balanced perf runs) gives every
EP rank top_k·tokens/ep. Real routers are skewed: `moe_skew` models expert popularity as a Zipf law
p_e ∝ 1/r^α over experts placed on ranks in a seeded random order (contiguous blocks of experts/ep per
rank, as Megatron places them); `moe_imbalance` sets the hottest rank's factor directly. A capacity
factor c caps each expert at c·(mean tokens per expert) and drops the rest (Fedus et al. 2021, Switch
Transformer §2.2); 0 means dropless. Capped experts are padded to their capacity by default, as
static-shape token dropping does (GShard's dispatch tensors; Megatron-Core's
`moe_pad_expert_input_to_capacity`, which Megatron-Bridge's `apply_moe_token_drop` sets and which lets the
dispatcher skip the host sync): every rank computes and exchanges c times the mean, whatever the routing.
Unpadded (`pad_to_capacity` off) a rank computes the tokens its experts keep, at most c times the mean.

Even balanced routing is balanced only on average: each micro-batch's tokens draw their experts anew,
so the ranks' loads scatter around the mean and the busiest rank of each layer sets its time (the
combine waits for it). Megatron-Core forces balance by routing on random normal logits (`RandomSTE`,
core_v0.16 `moe_utils.py`, seeded per EP rank): every token picks k distinct experts uniformly at
random. A rank holding n of E experts then gets a hypergeometric count per token, mean k·n/E and variance
k·(n/E)(1 − n/E)(E − k)/(E − 1); over the T tokens the EP group routes, its load has relative standard
deviation σ = sqrt(var / (T·mean²)). The ranks' loads sum to T·k, so they are the deviations of ep iid
normals of σ/sqrt(1 − 1/ep) from their mean, and the busiest is 1 + σ·E[max of ep standard
normals]/sqrt(1 − 1/ep) times the mean (dropless routing; a capacity cap bounds it instead).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import Plan

if TYPE_CHECKING:
    from shardscope.graph.ops import TokenFanout


@dataclass(frozen=True, slots=True)
class RoutingLoad:
    hot_rank_factor: float  # tokens on the hottest EP rank / the mean over ranks
    dropped_fraction: float  # token-expert assignments dropped by the capacity limit


def expert_popularity(experts: int, skew: float, seed: int = 0) -> list[float]:
    """Zipf(α) popularity of each expert, in a seeded random placement order; α = 0 is uniform."""
    return list(_popularity(experts, skew, seed))


@lru_cache(maxsize=256)
def _popularity(experts: int, skew: float, seed: int = 0) -> tuple[float, ...]:
    """`expert_popularity`, kept (a pure function of its arguments: every op graph of a model asks it again)."""
    weights = [1.0 / (r + 1) ** skew for r in range(experts)]
    random.Random(seed).shuffle(weights)
    total = sum(weights)
    return tuple(w / total for w in weights)


@lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals]: ∫ x·n·φ(x)·Φ(x)^(n−1) dx, by the midpoint rule."""
    if n <= 1:
        return 0.0
    steps, lo, hi = 4000, -10.0, 10.0
    dx = (hi - lo) / steps
    total = 0.0
    for i in range(steps):
        x = lo + (i + 0.5) * dx
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * pdf * cdf ** (n - 1)
    return total * dx


def sampling_excess(experts: int, top_k: int, per_rank: int, ep: int, tokens: float) -> float:
    """Expected relative excess of the busiest of `ep` ranks (each holding `per_rank` of `experts`) over
    the mean load when `tokens` tokens each pick `top_k` distinct experts uniformly (module docstring)."""
    if ep <= 1 or tokens <= 0 or top_k >= experts:
        return 0.0
    p = per_rank / experts
    mean = top_k * p
    var = top_k * p * (1 - p) * (experts - top_k) / (experts - 1)
    return math.sqrt(var / (tokens * mean * mean) / (1 - 1 / ep)) * expected_max_normal(ep)


@lru_cache(maxsize=256)
def expected_pad_rows(tokens: int, share: float, align: int) -> float:
    """Expected rows that padding one expert's count up to a multiple of `align` adds, E[(-c) mod align],
    where c ~ Binomial(tokens, share) (each of `tokens` tokens picks the expert with probability `share`,
    as under force-balanced routing), summed exactly over c within 10 standard deviations of the mean."""
    if align <= 1 or tokens <= 0 or not 0 < share < 1:
        return 0.0
    mean, sd = tokens * share, math.sqrt(tokens * share * (1 - share))
    lo, hi = max(0, int(mean - 10 * sd)), min(tokens, int(mean + 10 * sd) + 1)
    log_p, log_q = math.log(share), math.log1p(-share)
    head = math.lgamma(tokens + 1)
    total = 0.0
    for c in range(lo, hi + 1):
        pmf = math.exp(head - math.lgamma(c + 1) - math.lgamma(tokens - c + 1) + c * log_p + (tokens - c) * log_q)
        total += pmf * (-c % align)
    return total


def routing_load(model: ModelSpec, plan: Plan) -> RoutingLoad:
    if model.moe is None:
        return RoutingLoad(1.0, 0.0)
    experts, ep = model.moe.experts, plan.ep
    p = _popularity(experts, plan.moe_skew)
    capped = plan.capacity_factor > 0
    if capped:  # each expert keeps at most capacity_factor times the mean
        cap = plan.capacity_factor / experts
        kept = [min(x, cap) for x in p]
        if plan.pad_to_capacity:  # padded to capacity: fixed shapes on every rank
            return RoutingLoad(plan.capacity_factor, 1.0 - sum(kept))
        p = kept
    per_rank = experts // ep
    rank_share = [sum(p[r * per_rank : (r + 1) * per_rank]) for r in range(ep)]
    routed = plan.micro_batch * plan.seq_len / (plan.cp * plan.tp) * ep  # tokens the EP group routes
    hot = max(rank_share) * ep * (1 + sampling_excess(experts, model.moe.top_k, per_rank, ep, routed))
    hot *= plan.moe_imbalance
    # unpadded, a rank computes the tokens its experts keep: no more than their capacity
    return RoutingLoad(min(hot, plan.capacity_factor), 1.0 - sum(p)) if capped else RoutingLoad(hot, 0.0)


def bin_hit_probability(fanout: TokenFanout, bins: int) -> float:
    """Probability that a token sends at least one of its top-k to a given one of `bins` equal contiguous
    blocks of experts (a GPU's experts, or a node's), under balanced routing: the token draws
    `groups_per_token` of the `groups` expert groups, then k distinct experts among theirs (uniformly)."""
    return _bin_hit(fanout.experts, fanout.top_k, fanout.groups, fanout.groups_per_token, bins)


@lru_cache(maxsize=1024)
def _bin_hit(experts: int, k: int, groups: int, per_token: int, bins: int) -> float:
    if bins <= 1:
        return 1.0
    groups = groups if 1 < groups <= experts and 0 < per_token < groups else 1
    per_token = per_token if groups > 1 else 1
    group_size, bin_size = experts / groups, experts / bins
    touched = max(1, round(bin_size / group_size))  # groups a bin overlaps
    overlap = min(bin_size, group_size)  # of its experts in each
    pool = round(per_token * group_size)  # experts a token chooses from
    miss = 0.0
    for i in range(min(touched, per_token) + 1):  # i of the bin's groups among the token's
        p_groups = math.comb(touched, i) * math.comb(groups - touched, per_token - i) / math.comb(groups, per_token)
        outside = pool - round(i * overlap)
        miss += p_groups * (math.comb(outside, k) / math.comb(pool, k) if outside >= k else 0.0)
    return 1.0 - miss
