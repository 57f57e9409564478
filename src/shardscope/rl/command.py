"""`shardscope rl-sync` as a function: parse the user's layouts, predict each mechanism, one result."""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.models.catalog import load_model
from shardscope.rl.layout import parse_rollout, parse_train
from shardscope.rl.sync import DEFAULT_BUCKET_GIB, SyncEstimate, predict_sync, setup


@dataclass(frozen=True, slots=True)
class RLSyncResult:
    model: str
    gpu: str
    gpus: int
    train: str
    rollout: str
    placement: str
    precision: str  # of the weights the trainer holds
    payload_precision: str  # of the weights sent (fp8 with --quantize fp8)
    payload_gib: float  # the whole model in the payload precision
    local_experts: bool
    estimates: tuple[SyncEstimate, ...]

    @property
    def fastest(self) -> SyncEstimate:
        return min(self.estimates, key=lambda e: e.total_s)

    def to_dict(self) -> dict:
        return {
            "model": self.model, "gpu": self.gpu, "gpus": self.gpus, "train": self.train, "rollout": self.rollout,
            "placement": self.placement, "precision": self.precision, "payload_precision": self.payload_precision,
            "payload_gib": self.payload_gib, "local_experts": self.local_experts, "fastest": self.fastest.mechanism,
            "mechanisms": [e.to_dict() for e in self.estimates],
        }  # fmt: skip


def rl_sync(
    model: str,
    gpu: str = "H100",
    train: str = "megatron",
    rollout: str = "vllm",
    placement: str = "disaggregated",
    gpus: int | None = None,
    mechanism: str | None = None,
    precision: str = "bf16",
    quantize: str | None = None,
    bucket_gib: float = DEFAULT_BUCKET_GIB,
    local_experts: bool = True,
) -> RLSyncResult:
    spec = load_model(model)
    placement = placement.lower()
    # Colocated pools share the GPUs, so either layout may leave its DP size to --gpus.
    share = gpus if placement == "colocated" else None
    train_layout = parse_train(train, share)
    rollout_layout = parse_rollout(rollout, share)
    s = setup(
        spec, gpu, train_layout, rollout_layout, placement, gpus=gpus, precision=precision, quantize=quantize,
        bucket_gib=bucket_gib, local_experts=local_experts,
    )  # fmt: skip
    estimates = tuple(predict_sync(s, mechanism))
    return RLSyncResult(
        model=spec.name, gpu=s.gpu.name, gpus=s.cluster.gpus, train=train_layout.label(),
        rollout=rollout_layout.label(), placement=placement, precision=s.source.precision,
        payload_precision=s.payload.precision, payload_gib=s.payload.bytes / 2**30, local_experts=local_experts,
        estimates=estimates,
    )  # fmt: skip
