"""The MoE token dispatcher against published measurements.

Megatron-Core MoE report (Yan et al. 2026, "Scalable Training of Mixture-of-Experts Models with
Megatron Core", arXiv 2603.07685, Table 7): dispatch and combine latency of one DeepSeek-V3 MoE layer
(hidden 7168, 4096 tokens per GPU, 256 experts, top-8, BF16) with the flat all-to-all dispatcher and
with HybridEP, on H100 (8-GPU NVLink nodes, 400 Gb/s InfiniBand per GPU) and GB200 NVL72, EP 8 to 64.
Our figure is the permute (or un-permute) kernel plus the all-to-all of the dispatcher kind.
"""

from __future__ import annotations

import dataclasses

import pytest

from shardscope.analytic.step import estimate_step
from shardscope.costs.comm import collective_time_s
from shardscope.costs.compute import op_time_s
from shardscope.graph.build import build_stage_graph
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import make_plan
from shardscope.step.core import place_groups

EPS = (8, 16, 32, 64)
# (gpu, dispatcher, step): microseconds at EP 8, 16, 32, 64
TABLE_7_US = {
    ("GB200", "hybridep", "dispatch"): (391, 578, 612, 675),
    ("GB200", "hybridep", "combine"): (353, 527, 646, 744),
    ("GB200", "flat", "dispatch"): (735, 743, 769, 930),
    ("GB200", "flat", "combine"): (741, 765, 758, 827),
    ("H100", "hybridep", "dispatch"): (661, 1485, 3064, 4626),
    ("H100", "hybridep", "combine"): (624, 1688, 3088, 4398),
    ("H100", "flat", "dispatch"): (1265, 5774, 8059, 9164),
    ("H100", "flat", "combine"): (1277, 5628, 7815, 8727),
}
KERNEL = {"dispatch": "permute", "combine": "unpermute + weighted sum"}


def predicted_us(gpu: str, dispatcher: str, step: str, ep: int, model: ModelSpec | None = None) -> float:
    model = model or load_model("deepseek-v3")
    cluster = make_cluster(gpu, ep)
    plan = make_plan(model, cluster, ep=ep, global_batch=ep, seq_len=4096, ep_dispatch=dispatcher)
    layer = next(u for k, u in build_stage_graph(model, plan, cluster.gpu.arch).layers.items() if k.mlp == "moe")
    a2a = next(c for c in layer.comms if c.name == f"ep {step} all-to-all" and c.phase == "fwd")
    kernel = next(op for op in layer.ops if op.name == KERNEL[step])
    seconds = collective_time_s(cluster, a2a.kind, a2a.bytes, place_groups(cluster, plan).ep, a2a.fanout)
    return 1e6 * (seconds + op_time_s(cluster.gpu, kernel, False, plan))


def _errors() -> dict[tuple[str, str, str, int], float]:
    return {
        (*key, ep): predicted_us(*key, ep) / measured - 1
        for key, row in TABLE_7_US.items()
        for ep, measured in zip(EPS, row, strict=True)
    }


def test_dispatcher_latency_matches_megatron_core_table_7():
    """All 32 measurements within 15%, their mean absolute error under 6% (all-to-all traffic on GB200 at
    72% of NVLink 5 for both dispatchers, `A2A_SCALEUP_EFFICIENCY`; at the ring collectives' 80% the flat
    one was 22% fast at EP 64, HybridEP 14% fast at EP 16, and the mean 6.8%)."""
    errors = _errors()
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) < 0.15, (worst, errors[worst])
    assert sum(abs(e) for e in errors.values()) / len(errors) < 0.06


def test_hybridep_across_nodes_needs_the_group_limit():
    """On H100 across nodes the dispatcher's traffic is the tokens' copies to other nodes. DeepSeek-V3
    sends each token to at most 4 of 8 expert groups: with that limit the model lands within 10% at
    EP 32 and 64; without it (any 8 of 256 experts) it overshoots by more than 15%."""
    from dataclasses import replace

    measured = dict(zip(EPS, TABLE_7_US[("H100", "hybridep", "dispatch")], strict=True))
    model = load_model("deepseek-v3")
    unlimited = replace(model, moe=replace(model.moe, groups=1, groups_per_token=1))
    for ep in (32, 64):
        assert predicted_us("H100", "hybridep", "dispatch", ep) == pytest.approx(measured[ep], rel=0.10)
        assert predicted_us("H100", "hybridep", "dispatch", ep, unlimited) > 1.15 * measured[ep]


# DeepEP `hybrid-ep` branch, docs/README_Hybrid-EP.md ("Performance Results", kernel-only columns):
# HybridEP's own benchmark (tests/test_hybrid_ep.py), 4096 tokens of hidden 7168 per rank, top-8 of
# 8 local experts per rank under uniform random routing, BF16, 16 SMs (Megatron-Core's default
# `moe_hybridep_num_sms`). GB/s over the benchmark's byte count: on H100 across nodes the tokens each
# rank sends to every node its experts live on, its own node included (`count_rdma_send_from_routing_map`);
# within an NVLink domain the tokens each rank receives (`dispatched_hidden`).
HYBRIDEP_KERNEL_GBPS = {  # (gpu, ranks): (dispatch, combine)
    ("H100", 16): (71.71, 62.95),
    ("H100", 32): (57.69, 57.46),
    ("H100", 64): (49.97, 49.77),
    ("B200", 8): (734.95, 673.84),
    ("GB200", 8): (750.15, 684.27),
    ("GB200", 16): (661.93, 600.75),
    ("GB200", 24): (637.80, 565.53),
    ("GB200", 32): (629.79, 547.25),
    ("GB200", 36): (612.85, 543.27),
}


def _hybridep_errors() -> dict[tuple[str, int, str], float]:
    from shardscope.costs.comm import place_group
    from shardscope.graph.ops import TokenFanout
    from shardscope.graph.routing import bin_hit_probability

    tokens, hidden, top_k, local = 4096, 7168, 8, 8
    errors = {}
    for (gpu, ranks), gbps in HYBRIDEP_KERNEL_GBPS.items():
        cluster = make_cluster(gpu, max(ranks, 8))
        fanout = TokenFanout(local * ranks, top_k)
        group = place_group(cluster, ranks, 1)
        token_bytes = 2 * hidden
        if group.intra:
            counted = ranks * bin_hit_probability(fanout, ranks) * tokens * token_bytes
        else:
            nodes = group.domains
            counted = nodes * bin_hit_probability(fanout, nodes) * tokens * token_bytes
        predicted = collective_time_s(cluster, "all_to_all", tokens * top_k * token_bytes, group, fanout)
        for step, rate in zip(("dispatch", "combine"), gbps, strict=True):
            errors[(gpu, ranks, step)] = predicted / (counted / (rate * 1e9)) - 1
    return errors


def test_hierarchical_dispatch_against_hybridep_kernel_benchmarks():
    """HybridEP's kernel-only times against the model: 3-4% longer across 4 and 8 H100 nodes, 20-30%
    across 2 (where the NVLink fan-out is as long as the InfiniBand transfer), and -2..+18% inside
    Blackwell NVLink domains, where the model prices all-to-all traffic at 72% of NVLink 5 for both
    dispatchers (`A2A_SCALEUP_EFFICIENCY`; at the ring collectives' 80% every one was 8-26% longer).
    Within 32% of all 18 and 10% on average; the model is never more than 5% slower than a kernel."""
    errors = _hybridep_errors()
    assert all(-0.32 < e < 0.05 for e in errors.values()), errors
    assert sum(abs(e) for e in errors.values()) / len(errors) < 0.10
    assert max(abs(errors[("H100", n, s)]) for n in (32, 64) for s in ("dispatch", "combine")) < 0.05
    assert all(e > -0.20 for (gpu, _, _), e in errors.items() if gpu != "H100")


def _dispatcher_comms(dispatch: str) -> dict[tuple[str, str], float]:
    from published_runs import published_case

    case = published_case("QA-002")
    plan = dataclasses.replace(case.plan, ep_dispatch=dispatch)
    layer = next(
        u for k, u in build_stage_graph(case.model, plan, case.cluster.gpu.arch).layers.items() if k.mlp == "moe"
    )
    groups = place_groups(case.cluster, plan)
    return {
        (c.name, c.phase): collective_time_s(case.cluster, c.kind, c.bytes, getattr(groups, c.group), c.fanout)
        for c in layer.comms
    }


def test_each_dispatcher_issues_its_own_metadata_collectives():
    """Megatron's all-to-all dispatcher all-gathers the token counts and sends the routing weights by an
    all-to-all of their own (forward and backward); HybridEP all-gathers the boolean routing map; DeepEP
    sends the weights with the tokens. On the Qwen3-30B-A3B A/B (16 H100, EP 16 over 2 nodes) the routing-
    map all-gather (8.4 MB) must fit in the measured HybridEP metadata-preprocess NVTX range with the
    overlap on, 0.670 s over 3,072 forward calls = 0.218 ms, which also holds its kernel and the host's
    wait for the token counts (Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md)."""
    flat, deepep, hybridep = (_dispatcher_comms(d) for d in ("flat", "deepep", "hybridep"))
    a2as = {("ep dispatch all-to-all", p) for p in ("fwd", "bwd")} | {
        ("ep combine all-to-all", p) for p in ("fwd", "bwd")
    }
    assert set(deepep) == a2as
    assert set(flat) == a2as | {
        ("ep token-count all-gather", "fwd"),
        ("ep routing-weight all-to-all", "fwd"),
        ("ep routing-weight all-to-all", "bwd"),
    }
    assert set(hybridep) == a2as | {("ep routing-map all-gather", "fwd")}
    assert 0.05e-3 < hybridep[("ep routing-map all-gather", "fwd")] < 0.670 / 3072
    # the weights (4 bytes per token-expert pair) cost less than a tenth of the tokens (2 x 2048 bytes)
    assert flat[("ep routing-weight all-to-all", "fwd")] < 0.1 * flat[("ep dispatch all-to-all", "fwd")]


# Megatron-Bridge PR #5098 (commit 228e9a3e7, skills/nemo-mbridge-perf-moe-dispatcher-selection): a rank-0
# Nsight capture of one eager Qwen3.5-35B-A3B step on 16 H100 (2 nodes, EP 16, HybridEP with fused
# permutation, 16 dispatcher SMs, MBS 1, GBS 1024 = 64 micro-batches; 40 MoE layers and the MTP layer).
# Seconds of GPU-active union per step, and the forward calls they cover: each layer and micro-batch runs
# two dispatch kernels (forward dispatch, backward of the combine) and two combine kernels.
QWEN35_H100_UNION_S = {"dispatch": 2.845, "combine": 3.909}
QWEN35_CALLS = 2 * 64 * 41


@pytest.mark.xfail(
    strict=True,
    reason="known miss: in training across two H100 nodes HybridEP's dispatch and combine run 1.2x and 1.7x "
    "the modelled all-to-all plus (un)permute",
)
def test_hybridep_across_two_h100_nodes_in_training():
    """Measured per call: dispatch (with its fused permute) 2.845 s / 5,248 = 0.542 ms, combine (with its
    fused un-permute) 3.909 s / 5,248 = 0.745 ms, for 4,096 tokens of hidden 2048 per rank, top-8 of 256
    experts. The model gives 0.438 ms for both: the InfiniBand copy of each token to the other node at 90%
    of the NIC (0.37 ms) bounds it, and the NVLink fan-out (0.26 ms) hides under it. The same shortfall
    shows in HybridEP's own kernel benchmark at 16 ranks (`test_hierarchical_dispatch_against_hybridep_kernel_
    benchmarks`: -20% dispatch, -30% combine), but not at 32 or 64 ranks. Across two nodes the NVLink fan-out
    is nearly as long as the InfiniBand copy, which suggests the two stages do not fully overlap; no
    mechanism found yet fits every source, so the model keeps max(InfiniBand, NVLink). Also in that capture, and
    not in the model: 0.968 s of HybridEP support/RDMA kernels (0.37 ms per layer and micro-batch, against
    our routing-map all-gather of 0.10 ms)."""
    model = load_model("qwen3-30b-a3b")
    qwen35_moe = dataclasses.replace(model, moe=dataclasses.replace(model.moe, experts=256))
    for step, union_s in QWEN35_H100_UNION_S.items():
        measured_us = 1e6 * union_s / QWEN35_CALLS
        assert predicted_us("H100", "hybridep", step, 16, qwen35_moe) == pytest.approx(measured_us, rel=0.15)


def test_hybridep_over_deepep_across_an_nvl72_domain():
    """Megatron-LM's DeepSeek-V3 GB200 guide (history table, read at 1d9edcf8c7): on 256 GB200 at EP 32,
    switching the flex dispatcher from DeepEP to HybridEP, all else equal, took 829.93 to 943.56 TFLOPS/GPU
    (x1.137; x1.177 against DeepEP before its SM tuning, a step the guide lists at +28 TFLOPS). DeepEP's
    NVLink kernels serve 8 peers; beyond them its dispatch and combine run at the guide's 400 and 190 GB/s
    (`DEEPEP_MNNVL_GBPS`), HybridEP at 72% of NVLink 5. Model: within 1.10-1.20 (without the DeepEP
    bandwidths the two dispatchers were priced alike, x1.00). Inside 8 GPUs the two are priced alike."""
    from published_runs import published_case

    case = published_case("MG-010")
    step_s = {
        d: estimate_step(case.model, case.cluster, dataclasses.replace(case.plan, ep_dispatch=d)).step_time_s
        for d in ("deepep", "hybridep")
    }
    assert 1.10 < step_s["deepep"] / step_s["hybridep"] < 1.20
    for step in ("dispatch", "combine"):
        assert predicted_us("GB200", "deepep", step, 8) == pytest.approx(predicted_us("GB200", "hybridep", step, 8))
        assert predicted_us("GB200", "deepep", step, 32) > 1.5 * predicted_us("GB200", "hybridep", step, 32)
