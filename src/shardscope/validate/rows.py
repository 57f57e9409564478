"""Turn a validation CSV row into (model, cluster, plan), with documented defaults for blank fields.

Defaults for blank cells (the frameworks' own recipes, never tuned to a row):
  micro_batch   1 (Megatron's default; Narayanan 2021 and Llama 3 do not state it).
  vpp           1 (no interleaving).
  recompute     none (Megatron-Bridge/NeMo perf recipes and Llama 3 train without recompute unless stated).
  zero_or_fsdp  blank: Megatron-Bridge/NeMo recipes use the distributed optimizer (ZeRO-1); Narayanan 2021
                predates it (DDP). `ddp` in Megatron-Bridge tables also runs the distributed optimizer.
  attention     flash-attention 2 for llm-foundry (MosaicML's benchmarks); cuDNN/FA3-class kernels for
                Megatron-Bridge/NeMo on Hopper; none (unfused softmax, materialised scores) for
                Narayanan 2021, which predates FlashAttention; FA3-class on Hopper otherwise.
  causal skip   off for llm-foundry: its triton flash attention takes ALiBi and the causal mask as one
                additive bias, so every block of the score matrix is computed.
  TP overlap    on for Megatron-Bridge/NeMo perf recipes (they enable `tp_comm_overlap`), off otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import Cluster, make_cluster
from shardscope.models.spec import GPT_BLOCK, ModelSpec
from shardscope.plan.plan import Plan, make_plan

MEGATRON_SOURCES = {"MBRIDGE_PERF", "NEMO_2407_PERF"}


class SkipRow(Exception):
    """A row this version cannot predict; the message is the reason shown in the report."""


@dataclass(frozen=True, slots=True)
class RowCase:
    model: ModelSpec
    cluster: Cluster
    plan: Plan


def _int(row: dict[str, str], key: str, default: int | None = None) -> int:
    value = (row.get(key) or "").strip()
    if not value:
        if default is None:
            raise SkipRow(f"no {key} in the row")
        return default
    return int(float(value))


def model_from_row(row: dict[str, str]) -> ModelSpec:
    """The row's architecture columns + the family's structure (norm, MLP, positions, biases)."""
    name = row["model"].lower()
    if row.get("arch") not in ("dense", ""):
        raise SkipRow(f"{row.get('arch')} architecture is modelled in a later release (MoE / DiT)")
    if not (row.get("layers") and row.get("hidden") and row.get("heads")):
        raise SkipRow("architecture columns are blank in the source")
    heads = _int(row, "heads")
    hidden = _int(row, "hidden")
    common = dict(
        name=row["model"],
        hidden=hidden,
        layers=_int(row, "layers"),
        heads=heads,
        kv_heads=_int(row, "kv_heads", heads),
        head_dim=hidden // heads,
        ffn_hidden=_int(row, "ffn_hidden", 4 * hidden),
        vocab=_int(row, "vocab", 51200),
    )
    if name.startswith(("llama", "mistral", "qwen")):
        return ModelSpec(**common, mlp="swiglu", norm="rmsnorm", position="rope")
    if name.startswith("nemotron"):  # squared-ReLU (non-gated) MLP, LayerNorm, RoPE, untied
        return ModelSpec(**common, mlp="gelu", norm="layernorm", position="rope")
    if name.startswith("mpt"):  # llm-foundry benchmark yamls: ALiBi, biases, tied embeddings
        return ModelSpec(**common, **GPT_BLOCK, tied_embeddings=True, position="alibi")
    if name.startswith("gpt"):  # GPT-2/3 style: learned positions, biases, tied embeddings
        return ModelSpec(
            **common, **GPT_BLOCK, tied_embeddings=True, position="learned", pos_embedding_rows=_int(row, "seq_len")
        )
    raise SkipRow(f"unknown model family {row['model']!r}")


def _sharding(row: dict[str, str]) -> dict:
    z = (row.get("zero_or_fsdp") or "").strip().lower()
    megatron = row.get("source") in MEGATRON_SOURCES
    if z.startswith("megatron_fsdp"):
        m = re.search(r"shard_group=(\d+)", z)
        return {"zero": 3, "shard_group": int(m.group(1)) if m else 0}
    if z.startswith("fsdp"):
        if "zero2" in z or "shard_grad_op" in z:
            return {"fsdp": True, "reshard_after_forward": False}
        return {"fsdp": True}
    if z in ("", "ddp"):
        return {"zero": 1 if megatron else 0}
    if z.startswith("zero"):
        return {"zero": int(z[4])}
    raise SkipRow(f"unknown zero_or_fsdp {z!r}")


def _attention_kernel(row: dict[str, str]) -> str:
    source = row.get("source", "")
    if source == "NARAYANAN2021":
        return "unfused"
    if source == "MOSAICML_LLMFOUNDRY":
        return "fa2"
    return "auto"


def fp8_recipe(row: dict[str, str]) -> str:
    """The FP8 variant named in the row's notes (SOURCES.md): FP8-MX/MXFP8 is MX block scaling on
    Blackwell and 128x128 / 1x128 block scaling on Hopper; FP8-CS is per-tensor current scaling;
    NeMo 24.07 and llm-foundry's amp_fp8 used Transformer Engine's delayed scaling."""
    notes = row.get("notes", "")
    if "FP8-MX variant" in notes or re.search(r"precision as listed: (FP8-MX|MXFP8)\b", notes):
        return "mxfp8" if row.get("gpu", "").upper() in ("B200", "GB200") else "blockwise"
    if row.get("source") in ("NEMO_2407_PERF", "MOSAICML_LLMFOUNDRY"):
        return "delayed"
    return "tensorwise"


def case_from_row(row: dict[str, str]) -> RowCase:
    precision = (row.get("precision") or "bf16").strip().lower()
    model = model_from_row(row)
    cluster = make_cluster(row["gpu"], _int(row, "num_gpus"))
    recompute = (row.get("recompute") or "none").strip().lower()
    if recompute.startswith("selective"):
        recompute = "selective"
    try:
        plan = make_plan(
            model,
            cluster,
            tp=_int(row, "tp", 1),
            pp=_int(row, "pp", 1),
            vpp=_int(row, "vpp", 1),
            cp=_int(row, "cp", 1),
            dp=_int(row, "dp", 0) or None,
            micro_batch=_int(row, "micro_batch", 1),
            global_batch=_int(row, "global_batch"),
            seq_len=_int(row, "seq_len"),
            recompute=recompute,
            precision="fp8" if precision == "fp8" else "bf16",
            fp8_recipe=fp8_recipe(row) if precision == "fp8" else "tensorwise",
            attention_kernel=_attention_kernel(row),
            tp_comm_overlap=row.get("source") in MEGATRON_SOURCES,
            causal_block_skip=row.get("source") != "MOSAICML_LLMFOUNDRY",
            **_sharding(row),
        )
    except ShardscopeError as exc:
        raise SkipRow(f"plan rejected: {exc}") from None
    return RowCase(model, cluster, plan)
