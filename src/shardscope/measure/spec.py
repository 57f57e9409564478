"""A measurement record (`measure.meta.measure_config`, or its cached JSON) as a ModelSpec.

No torch here: a cached record becomes a spec without importing it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shardscope.errors import ShardscopeError
from shardscope.models.spec import MeasuredBlock, ModelSpec, MoESpec


def spec_from_measurement(record: dict[str, Any], name: str) -> ModelSpec:
    """The ModelSpec of the measured fields, its parameter count made exact: what a block holds beyond
    the standard fields' count (Gemma-2's extra norms; Falcon's one norm where two are assumed: negative)
    goes to `extra_layer_params`, the rest outside the blocks (BLOOM's embedding norm) to `extra_params`."""
    try:
        fields = dict(record["structure"])
        fields["attention_pattern"] = tuple(fields.get("attention_pattern") or ())
        if fields.get("moe"):
            fields["moe"] = MoESpec(**fields["moe"])
        measured = f"transformers {record['transformers']} {record['architecture']}"
        blocks = tuple(_block(kind, part) for kind, part in record["kinds"].items())
        spec = ModelSpec(name=name, measured=measured, measured_blocks=blocks, **fields)
        per_layer = [int(n) for n in record["layer_params"]]
        total = int(record["params_total"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ShardscopeError(f"malformed measurement record for {name}: {exc!r}") from None
    # The standard blocks' excess where every one holds the same; blocks that differ leave theirs outside.
    # Blocks priced wholly from their measurement hold their exact count already.
    std = [i for i, kind in enumerate(spec.layer_kinds()) if kind.mlp != "measured"]
    counts = {per_layer[i] for i in std}
    extra_layer = per_layer[std[0]] - spec.layer_params_of(spec.layer_kind(std[0])) if len(counts) == 1 else 0
    spec = replace(spec, extra_layer_params=extra_layer)
    return replace(spec, extra_params=total - spec.params_total)


def _block(kind: str, part: dict[str, Any]) -> MeasuredBlock:
    """One attention kind's measured block (the record's lists as the spec's hashable tuples)."""

    def pair(key: str) -> tuple[float, float]:
        a, b = part[key]
        return float(a), float(b)

    def shapes(key: str) -> tuple[tuple[float, int, int, int], ...]:
        # (rows per token, N, K, calls per pass): a projection has one row per token
        return tuple(sorted((float(m), int(n), int(k), int(c)) for m, n, k, c in part.get(key, ())))

    block = MeasuredBlock(kind, pair("flops_fwd"), pair("flops_bwd"), pair("saved_bytes"), shapes("gemms"))  # type: ignore[arg-type]
    if not part.get("whole"):
        return block
    return replace(
        block,
        whole=True,
        ssm=bool(part["ssm"]),
        params=int(part["params"]),
        io_bytes=pair("io_bytes"),
        expert_gemms=shapes("expert_gemms"),
        experts=int(part["experts"]),
        expert_params=int(part["expert_params"]),
        head_dim=int(part["head_dim"]),
        flops_per_sequence=pair("flops_per_sequence") if "flops_per_sequence" in part else (0.0, 0.0),
        attention_flops=float(part["attention_flops"]),
    )


def flops_per_token(record: dict[str, Any], seq_len: int) -> float:
    """Measured forward + backward FLOPs per token of the whole model at `seq_len` (the eager attention's
    score matmuls over the full s x s square, as the measuring pass ran them)."""
    total = 0.0
    parts = [(k["layers"], k) for k in record["kinds"].values()] + [(1, record["other"])]
    for count, part in parts:
        for key in ("flops_fwd", "flops_bwd"):
            a, b = part[key]
            total += count * (a + b * seq_len)
        total += count * sum(part.get("flops_per_sequence", ())) / seq_len
    return total
