"""Predict a weight update's time and its parts for each transfer mechanism.

Mechanisms (`MECHANISMS`):
- `broadcast`: gather every full tensor to one trainer rank (TP all-gather, PP/EP collection or FSDP
  `full_tensor`), NCCL-broadcast it to every rollout rank, which loads it (NeMo-RL's default non-colocated
  refit, verl's NCCL path). The gather streams into the source at the trainer group's ring bandwidth.
- `reshard`: shard-to-shard (NeMo-RL `nccl_reshard_refit`, docs/design-docs/nccl-reshard-refit.md): the FFN
  weights (routed experts and dense MLPs) move as exact shards, each destination region once, striped over
  the trainer's replicas and fanned out among the rollout replicas; one PP stage's communicator per CUDA
  stream (`NRL_REFIT_NUM_STREAMS`, default 2). Everything else rides a packed broadcast of full tensors.
- `ipc`: colocated only: the trainer all-gathers each full tensor on its own GPUs and hands it to the
  engine on the same GPU through a CUDA-IPC buffer (verl, NeMo-RL colocated): no network in the transfer.
- `ckpt-broadcast`: MoonshotAI checkpoint-engine (`ParameterServer._update_per_bucket`): weights sit in
  pinned host memory sharded over the ranks; per round every rank copies one bucket host-to-device, then
  the owners broadcast their buckets in turn into a double-buffered IPC buffer while the engine reloads the
  previous bucket. H2D and broadcast are not overlapped (the README: the three-stage pipeline of the Kimi K2
  report is not implemented).
- `ckpt-p2p`: the same pipeline with each bucket read over RDMA (Mooncake transfer engine) from the owner's
  host memory by a receiving rank instead of the owner's H2D.
- `rdma`: one-sided RDMA reads (NIXL/UCX checkpoint engine): each rollout rank pulls what it needs from the
  trainer ranks' registered shards, in buckets, and loads it.

A Megatron trainer hands its weights over through Megatron-Bridge's HF export (`export_hf_weights` ->
`stream_weights_megatron_to_hf`, used by NeMo-RL's broadcast, CUDA-IPC and NIXL paths and for the reshard's
misc tensors): every rank walks every parameter of the model and builds the full HF tensor, broadcasting
each from the pipeline stage that owns it over the PP group, then all-gathering its TP shards (dense) or
its EP shards (experts) (`_export`). An FSDP trainer all-gathers each parameter over its FSDP group
(`full_tensor`).

Parts (`PARTS`): communicators created inside the update (checkpoint-engine's P2P path), trainer-side
gather/reshard, conversion (BF16->FP8 re-quantization when asked), the
transfer (its link and bytes per rank on that link), bucketing overhead, and the load into the engine.
They run one after another, so the total is their sum (checkpoint-engine's load counts only what the
broadcast of the next bucket does not hide).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from shardscope.costs.comm import GroupPlacement, collective_time_s, place_group
from shardscope.costs.compute import memory_time_s
from shardscope.costs.host import LAUNCH_S
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import GPU, Cluster, make_cluster
from shardscope.models.spec import ModelSpec
from shardscope.rl.engine import NO_GRAD_OP_S, load_cost
from shardscope.rl.layout import FSDP, RolloutLayout, TrainLayout
from shardscope.rl.links import broadcast_time_s, latency_s, link_name, nic_gbps, ring_gbps, spread
from shardscope.rl.weights import BF16_BYTES, FP8_BYTES_PER_PARAM, WeightGroup, WeightInventory, inventory

MECHANISMS = ("broadcast", "reshard", "ipc", "ckpt-broadcast", "ckpt-p2p", "rdma")
PLACEMENTS = ("colocated", "disaggregated")
PARTS = ("setup", "gather", "convert", "transfer", "bucketing", "load")
# NeMo-RL's NRL_REFIT_NUM_STREAMS default (nccl-reshard-refit.md): PP stages resharded at once.
REFIT_STREAMS = 2
# Bucket size of the bucketed mechanisms when none is given. checkpoint-engine sizes its buckets from free
# GPU memory (`_detect_bucket_size`); its README benchmark ran 2.67-8.00 GiB, which this sits inside.
DEFAULT_BUCKET_GIB = 4.0
# Per bucket, the engine is told over a ZeroMQ socket to load it and answers when done (checkpoint-engine
# `socket.send_pyobj` / `socket.recv`; NIXL engines signal completion alike): one request-reply round trip.
# ZeroMQ's own latency test (zeromq.org, "Measuring messaging performance", local_lat/remote_lat) gives
# tens of microseconds per round trip over ipc/tcp on one host; 50 us.
ENGINE_ROUNDTRIP_S = 50e-6
# Building one NCCL communicator of 8-16 ranks: the median of six "Init timings" totals that public NCCL INFO
# logs print for ncclCommInitRank of 8- and 16-rank communicators (0.48, 0.75, 1.58, 1.99, 3.56 and 3.82 s:
# buffer allocation, bootstrap, topology and connection set-up).
NCCL_COMM_INIT_S = 1.8
# The reshard path runs three eager calls per parameter (the `pre` staging hook, `xferdtensor`, the `post`
# copy into the fused parameter; nccl-reshard-refit.md), each an eager launch from Python.
RESHARD_CALLS_PER_PARAM = 3


@dataclass(frozen=True, slots=True)
class SyncPart:
    name: str  # one of PARTS
    time_s: float
    link: str  # what it runs on: NVLink, NIC, PCIe, HBM, host CPU
    bytes_per_rank: float  # bytes the busiest rank moves over `link` in this part


@dataclass(frozen=True, slots=True)
class SyncEstimate:
    mechanism: str
    total_s: float
    parts: tuple[SyncPart, ...]
    bottleneck: str  # the part that takes longest, and its link
    network_bytes_per_rank: float  # bytes the busiest rollout rank receives over NVLink or NICs
    buckets: int
    notes: tuple[str, ...] = field(default=())

    def part(self, name: str) -> SyncPart:
        return next(p for p in self.parts if p.name == name)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SyncSetup:
    """Everything a mechanism needs: the payload, both layouts, where the pools sit."""

    model: ModelSpec
    payload: WeightInventory  # what is sent (after any re-quantization)
    source: WeightInventory  # what the trainer holds
    train: TrainLayout
    rollout: RolloutLayout
    placement: str
    cluster: Cluster
    bucket_bytes: float
    local_experts: bool  # each rollout rank receives only its experts' shards

    @property
    def quantize(self) -> bool:
        return self.payload.precision != self.source.precision

    @property
    def gpu(self) -> GPU:
        return self.cluster.gpu

    # ----- pools and links ----------------------------------------------------------------------------
    @property
    def rollout_offset(self) -> int:
        """Rollout ranks come after the trainer's in a disaggregated cluster, on the same GPUs colocated."""
        return 0 if self.placement == "colocated" else self.train.gpus

    def train_group(self) -> GroupPlacement:
        return spread(self.cluster, self.train.gpus)

    def rollout_group(self) -> GroupPlacement:
        return spread(self.cluster, self.rollout.gpus, self.rollout_offset)

    def all_group(self) -> GroupPlacement:
        """The update's group: every trainer and rollout rank (the rollout pool alone when colocated)."""
        n = self.rollout.gpus if self.placement == "colocated" else self.train.gpus + self.rollout.gpus
        return spread(self.cluster, n)

    def cross_link(self) -> tuple[float, str]:
        """Bandwidth (GB/s) and name of the link between a trainer rank and a rollout rank."""
        # Colocated pools share GPUs, but a shard still crosses a NIC when the layouts span domains.
        if self.all_group().intra:
            return ring_gbps(self.cluster, GroupPlacement(2, 2)), "NVLink"
        return nic_gbps(self.cluster), "NIC"

    # ----- what a rollout rank receives -----------------------------------------------------------------
    def expert_bytes_received(self, local: bool) -> float:
        return self.payload.experts.bytes / self.rollout.tp if local else self.payload.experts.bytes

    def expert_tensors_received(self, local: bool) -> float:
        """Expert tensors handed to the loader: with engine EP only this rank's experts; TP-sharded
        experts arrive as a slice of every expert tensor."""
        if local and self.rollout.ep > 1:
            return self.payload.experts.tensors / self.rollout.ep
        return float(self.payload.experts.tensors)

    def installed_bytes(self) -> float:
        """What a rollout rank keeps: its shard of every weight."""
        return self.payload.bytes / self.rollout.tp

    def load(self, tensors: float, expert_tensors: float, installed: float | None = None) -> SyncPart:
        cost = load_cost(
            self.gpu, tensors, expert_tensors, self.payload.expert_count,
            self.installed_bytes() if installed is None else installed,
        )  # fmt: skip
        return SyncPart("load", cost.total_s, "host CPU + HBM", self.installed_bytes())

    def convert(self, params_per_rank: float) -> SyncPart:
        """BF16->FP8 blockwise re-quantization of `params_per_rank` weights on one rank: a memory-bound
        pass (read BF16, write FP8 + scales; the block amax is reduced on chip)."""
        if not self.quantize:
            return SyncPart("convert", 0.0, "HBM", 0.0)
        nbytes = params_per_rank * (BF16_BYTES + FP8_BYTES_PER_PARAM)
        return SyncPart("convert", memory_time_s(self.gpu, nbytes), "HBM", nbytes)


def _estimate(
    mechanism: str, parts: list[SyncPart], buckets: int, received: float, notes: tuple = (), setup_s: float = 0.0
) -> SyncEstimate:
    """The estimate of `parts` (every part but setup) behind `setup_s` of communicator creation."""
    parts = [SyncPart("setup", setup_s, "NCCL init" if setup_s else "-", 0.0), *parts]
    slowest = max(parts, key=lambda p: p.time_s)
    return SyncEstimate(
        mechanism=mechanism,
        total_s=sum(p.time_s for p in parts),
        parts=tuple(parts),
        bottleneck=f"{slowest.name} ({slowest.link})",
        network_bytes_per_rank=received,
        buckets=buckets,
        notes=tuple(notes),
    )


def _exposed_load(load: SyncPart, hidden_by_s: float, buckets: int) -> SyncPart:
    """`load` (the engine installing all `buckets`) as far as it shows: the engine loads bucket k while the
    sender moves or prepares a later one (`hidden_by_s` over the update: checkpoint-engine's broadcast, the
    trainer's export), so only each bucket's excess over its share of that, and the last bucket's load, add
    to the update."""
    per_bucket = load.time_s / buckets
    exposed = (buckets - 1) * max(0.0, per_bucket - hidden_by_s / buckets) + per_bucket
    return SyncPart("load", exposed, load.link, load.bytes_per_rank)


def _calls_time_s(cluster: Cluster, kind: str, nbytes: float, group: GroupPlacement, calls: float) -> float:
    """`calls` collectives of `kind` moving `nbytes` in all over `group`: the bandwidth term once, a ring's
    hop latencies per call."""
    if group.size <= 1 or nbytes <= 0:
        return 0.0
    if kind == "broadcast":
        once = broadcast_time_s(cluster, nbytes, group)
    else:
        once = collective_time_s(cluster, kind, nbytes, group)
    return once + max(0.0, calls - 1) * latency_s(cluster, group)


def _export(s: SyncSetup, groups: tuple[WeightGroup, ...]) -> tuple[float, float]:
    """Time and bytes received per trainer rank to build every full tensor of `groups` on every rank.

    Megatron (Megatron-Bridge `stream_weights_megatron_to_hf`, one parameter at a time on every rank):
    `broadcast_from_pp_rank` sends the owning stage's local shard over the PP group (stride tp x dp in
    Megatron's rank order), then `gather_from_tp_ranks` all-gathers a dense weight over TP and
    `gather_from_ep_ranks` an expert weight over EP (consecutive ranks with expert TP 1; one all-gather per
    local expert and HF projection: gate and up apart). Megatron holds a fused gate/up (and qkv) where the
    HF checkpoint has two (three) tensors: its broadcasts are counted at two per FFN. FSDP: `full_tensor`
    all-gathers each parameter over the FSDP group (and TP)."""
    t = s.train
    cluster = s.cluster
    experts = sum(g.bytes for g in groups if g is s.source.experts)
    rest = sum(g.bytes for g in groups if g is not s.source.experts)
    expert_tensors = sum(g.tensors for g in groups if g is s.source.experts)
    rest_tensors = sum(g.tensors for g in groups if g is not s.source.experts)
    tp_group = place_group(cluster, t.tp, 1)
    if t.stack == FSDP:
        shard_group = place_group(cluster, t.fsdp, t.tp)
        total = experts + rest
        tensors = expert_tensors + rest_tensors
        time_s = _calls_time_s(cluster, "all_gather", total, shard_group, tensors)
        time_s += _calls_time_s(cluster, "all_gather", rest, tp_group, rest_tensors)
        return time_s, total * (1 - 1 / s.train.gpus)
    mats = 3 if s.model.mlp == "swiglu" else 2
    ep_group = place_group(cluster, t.ep, 1)
    pp_group = place_group(cluster, t.pp, t.tp * t.dp)
    local = experts / t.ep + rest / t.tp  # one stage's shard of each parameter, summed over the stages
    broadcasts = expert_tensors / t.ep * 2 / mats + rest_tensors
    time_s = _calls_time_s(cluster, "broadcast", local, pp_group, broadcasts)
    time_s += _calls_time_s(cluster, "all_gather", experts, ep_group, expert_tensors / t.ep)
    time_s += _calls_time_s(cluster, "all_gather", rest, tp_group, rest_tensors)
    received = local * (1 - 1 / t.pp) + experts * (1 - 1 / t.ep) + rest * (1 - 1 / t.tp)
    return time_s, received


def _gather(s: SyncSetup, groups: tuple[WeightGroup, ...] | None = None) -> SyncPart:
    """The trainer-side export of `groups` (default: the whole checkpoint) as a part."""
    time_s, received = _export(s, s.source.groups if groups is None else groups)
    link = link_name(s.train_group()) if received else "-"
    return SyncPart("gather", time_s, link, received)


def _broadcast(s: SyncSetup) -> SyncEstimate:
    gather = _gather(s)
    convert = s.convert(s.source.quantizable_params)  # the one source rank converts everything
    # The broadcast communicator spans every trainer and rollout rank (NeMo-RL's `model_update_group`), so
    # its rings cross each domain on all of the domain's NICs.
    group = s.all_group()
    nbytes = s.payload.bytes
    transfer = SyncPart("transfer", broadcast_time_s(s.cluster, nbytes, group), link_name(group), nbytes)
    buckets = max(1, math.ceil(nbytes / s.bucket_bytes))
    bucketing = SyncPart("bucketing", buckets * (latency_s(s.cluster, group) + LAUNCH_S), "-", 0.0)
    # Every rank is handed every full tensor. NeMo-RL's consumer loads pack k while the producer exports
    # pack k+1 (two buffers, `packed_broadcast_producer`); the export and the broadcast share the trainer's
    # NICs, so they add.
    load = _exposed_load(s.load(s.payload.tensors, s.payload.experts.tensors), gather.time_s, buckets)
    return _estimate("broadcast", [gather, convert, transfer, bucketing, load], buckets, nbytes)


def _reshard(s: SyncSetup) -> SyncEstimate:
    p = s.payload
    bulk = p.experts.bytes + p.dense_ffn.bytes
    recv = bulk / s.rollout.tp  # each rollout rank's exact shard of the FFN weights
    send = bulk / s.train.gpus  # each region once, striped over the trainer's replicas
    bw, link = s.cross_link()
    pp = s.train.pp
    active = min(pp, REFIT_STREAMS)
    rounds = math.ceil(pp / active)
    per_round = max(send, recv * active / pp) / (bw * 1e9)
    bulk_s = rounds * per_round
    misc_group = s.all_group()
    misc_s = broadcast_time_s(s.cluster, p.other.bytes, misc_group)
    transfer = SyncPart("transfer", bulk_s + misc_s, link, recv + p.other.bytes)
    # Trainer side: grouped experts are stacked into one [local_experts, ...] tensor per refit (a copy);
    # the misc tensors go through the conventional path, the HF export (`_export`), first.
    misc_export_s, misc_received = _export(s, (s.source.other,))
    gather = SyncPart("gather", memory_time_s(s.gpu, 2 * send) + misc_export_s, "HBM", send + misc_received)
    convert = s.convert(s.source.quantizable_params / s.train.gpus)
    params = p.moe_layers * 3 + (p.dense_ffn.tensors if p.precision == "bf16" else p.dense_ffn.tensors // 2)
    bucketing = SyncPart("bucketing", params * RESHARD_CALLS_PER_PARAM * LAUNCH_S, "host CPU", 0.0)
    # Load: the post copy of the bulk shard into fused parameters, and the misc tensors through load_weights.
    misc_installed = p.other.bytes / s.rollout.tp
    load = s.load(p.other.tensors, 0, installed=recv + misc_installed)
    return _estimate("reshard", [gather, convert, transfer, bucketing, load], pp, recv + p.other.bytes)


def _ipc(s: SyncSetup) -> SyncEstimate:
    if s.placement != "colocated":
        raise ShardscopeError("CUDA-IPC needs the trainer and the engine on the same GPUs (--placement colocated)")
    gather = _gather(s)
    convert = s.convert(s.source.quantizable_params)  # every rank converts every full tensor it hands over
    # The gathered tensor is copied into the IPC-shared buffer the engine reads: a device copy per rank.
    transfer = SyncPart("transfer", memory_time_s(s.gpu, 2 * s.payload.bytes), "CUDA IPC (HBM)", 0.0)
    buckets = max(1, math.ceil(s.payload.bytes / s.bucket_bytes))
    bucketing = SyncPart("bucketing", buckets * ENGINE_ROUNDTRIP_S, "host CPU", 0.0)
    load = s.load(s.payload.tensors, s.payload.experts.tensors)
    return _estimate("ipc", [gather, convert, transfer, bucketing, load], buckets, 0.0)


def _checkpoint_engine(s: SyncSetup, p2p: bool) -> SyncEstimate:
    world = s.rollout.gpus  # parameter servers sit with the engines, the checkpoint sharded over them
    nbytes = s.payload.bytes
    bucket = min(s.bucket_bytes, nbytes)
    buckets = max(1, math.ceil(nbytes / bucket))
    rounds = math.ceil(buckets / world)
    if p2p:  # a receiving rank reads the bucket from the owner's host memory: NIC and PCIe in series
        rate, link = min(nic_gbps(s.cluster), s.gpu.pcie_gbps), "RDMA (NIC, PCIe)"
    else:
        rate, link = s.gpu.pcie_gbps, "PCIe H2D"
    gather = SyncPart("gather", rounds * bucket / (rate * 1e9), link, rounds * bucket)
    convert = s.convert(s.source.quantizable_params / world)
    group = s.rollout_group()
    bcast = broadcast_time_s(s.cluster, bucket, group) + memory_time_s(s.gpu, 2 * bucket)  # + owner's D2D
    transfer = SyncPart("transfer", buckets * bcast, link_name(group), nbytes)
    # The engine reloads bucket k while bucket k+1 is broadcast
    load = _exposed_load(s.load(s.payload.tensors, s.payload.experts.tensors), transfer.time_s, buckets)
    bucketing = SyncPart("bucketing", buckets * (latency_s(s.cluster, group) + ENGINE_ROUNDTRIP_S), "-", 0.0)
    name = "ckpt-p2p" if p2p else "ckpt-broadcast"
    # P2P updates a subgroup: `ParameterServer.update(ranks=...)` calls `dist.new_group(ranks)` inside the
    # timed update, and its NCCL communicator is built at the first collective (`_update_per_bucket`)
    setup_s = NCCL_COMM_INIT_S if p2p else 0.0
    return _estimate(name, [gather, convert, transfer, bucketing, load], buckets, nbytes, setup_s=setup_s)


def _rdma(s: SyncSetup) -> SyncEstimate:
    p, local = s.payload, s.local_experts
    recv = s.expert_bytes_received(local) + p.dense_ffn.bytes + p.other.bytes  # non-experts arrive whole
    # each rollout rank reads from the trainer rank paired with it (NIXL: policy rank i serves rollout rank
    # i); with fewer trainer ranks than rollout ranks, each would serve several
    send = recv * max(1.0, s.rollout.gpus / s.train.gpus)
    bw, link = s.cross_link()
    transfer = SyncPart("transfer", max(recv, send) / (bw * 1e9), link, recv)
    # Trainer side: every rank runs the whole HF export (`_export`); the rank paired with a rollout rank
    # (NIXL: policy rank i serves rollout rank i) keeps what that rank loads, each expert tensor narrowed to
    # its slice and made contiguous, and copies every kept tensor into the registered bucket: one eager op
    # each, two for a sliced expert, plus the copy of the bytes.
    export_s, exported = _export(s, s.source.groups)
    experts_in = s.expert_tensors_received(local)
    ops = experts_in * (2 if local else 1) + p.dense_ffn.tensors + p.other.tensors
    staging_s = ops * NO_GRAD_OP_S + memory_time_s(s.gpu, 2 * recv)
    gather = SyncPart("gather", export_s + staging_s, link_name(s.train_group()), exported)
    convert = s.convert(s.source.quantizable_params / s.train.gpus)
    buckets = max(1, math.ceil(recv / s.bucket_bytes))
    bucketing = SyncPart("bucketing", buckets * (ENGINE_ROUNDTRIP_S + LAUNCH_S), "host CPU", 0.0)
    # The rollout rank loads bucket k while the source exports the next (two registered buffers); the export
    # and the RDMA reads share the source's NICs, so they add.
    load = _exposed_load(s.load(experts_in + p.dense_ffn.tensors + p.other.tensors, experts_in), export_s, buckets)
    notes = () if local else ("every rollout rank receives every expert",)
    return _estimate("rdma", [gather, convert, transfer, bucketing, load], buckets, recv, notes)


_RUN = {
    "broadcast": _broadcast,
    "reshard": _reshard,
    "ipc": _ipc,
    "ckpt-broadcast": lambda s: _checkpoint_engine(s, p2p=False),
    "ckpt-p2p": lambda s: _checkpoint_engine(s, p2p=True),
    "rdma": _rdma,
}


def _check(model: ModelSpec, train: TrainLayout, rollout: RolloutLayout) -> None:
    """Layouts that do not divide the model are refused, as the frameworks refuse them."""
    for who, tp in (("--train", train.tp), ("--rollout", rollout.tp)):
        if model.heads % tp:
            raise ShardscopeError(f"{who} tp{tp} does not divide {model.name}'s {model.heads} attention heads")
    if train.pp > model.layers:
        raise ShardscopeError(f"--train pp{train.pp} exceeds {model.name}'s {model.layers} layers")
    experts = model.moe.experts if model.moe else 0
    for who, ep in (("--train", train.ep), ("--rollout", rollout.ep)):
        if ep > 1 and (not experts or experts % ep):
            what = f"{experts} experts" if experts else "no experts"
            raise ShardscopeError(f"{who} ep{ep} does not divide {model.name}'s {what}")
    if train.stack == FSDP and model.params_total < train.fsdp:
        raise ShardscopeError(f"--train fsdp{train.fsdp} has more ranks than {model.name} has weights")


def setup(
    model: ModelSpec,
    gpu: str,
    train: TrainLayout,
    rollout: RolloutLayout,
    placement: str,
    gpus: int | None = None,
    precision: str = "bf16",
    quantize: str | None = None,
    bucket_gib: float = DEFAULT_BUCKET_GIB,
    local_experts: bool = True,
    scaleout_gbps: float | None = None,
) -> SyncSetup:
    if placement not in PLACEMENTS:
        raise ShardscopeError(f"unknown placement {placement!r} (valid: {', '.join(PLACEMENTS)})")
    if quantize not in (None, "fp8"):
        raise ShardscopeError(f"unknown --quantize {quantize!r} (valid: fp8)")
    if bucket_gib <= 0:
        raise ShardscopeError(f"--bucket-gib must be positive, got {bucket_gib:g}")
    _check(model, train, rollout)
    if placement == "colocated":
        if train.gpus != rollout.gpus:
            raise ShardscopeError(
                f"colocated: the trainer ({train.gpus} GPUs) and the rollout ({rollout.gpus}) must share the same GPUs"
            )
        needed = rollout.gpus
    else:
        needed = train.gpus + rollout.gpus
    if gpus is not None and gpus != needed:
        raise ShardscopeError(f"--gpus {gpus} does not match the layouts ({needed} GPUs, {placement})")
    cluster = make_cluster(gpu, needed, scaleout_gbps=scaleout_gbps)
    source = inventory(model, precision)
    payload = inventory(model, quantize) if quantize else source
    return SyncSetup(
        model=model, payload=payload, source=source, train=train, rollout=rollout, placement=placement,
        cluster=cluster, bucket_bytes=bucket_gib * 2**30, local_experts=local_experts,
    )  # fmt: skip


def predict_sync(s: SyncSetup, mechanism: str | None = None) -> list[SyncEstimate]:
    """One mechanism, or every one that applies to the placement (IPC only colocated)."""
    if mechanism is not None:
        if mechanism not in _RUN:
            raise ShardscopeError(f"unknown mechanism {mechanism!r} (valid: {', '.join(MECHANISMS)})")
        return [_RUN[mechanism](s)]
    return [_RUN[m](s) for m in MECHANISMS if m != "ipc" or s.placement == "colocated"]
