"""Convert a prediction into a row's metric, using the source's own FLOP definition (`flops_def`).

Definitions (see shared/validation/SOURCES.md):
  megatron2021_eq3  F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per step (counts the recompute forward).
  mosaic_6n_attn    per sequence 6·N·s + 3·l·2·2·d·s² (N = exact NumParams from the row's notes).
  palm              per token 6·N + 12·l·H·Q·T (Chowdhery et al. 2022, App. B).
  megatron_bridge   3x forward FLOPs (Megatron `num_floating_point_operations`): per token
                    12·l·h²·[(1 + g/a + s/h·c)·q/h + (f/h)·(3/2 if gated else 1)] + 6·h·V, where c = 1/2
                    (causal) in Megatron-Bridge containers; NeMo 24.07 counted full attention (c = 1),
                    as the TFLOP/s-to-tokens/s ratio of its rows shows (e.g. Llama-3 70B: 4.81e11 per
                    token = the c = 1 value, vs 4.49e11 for c = 1/2). MoE/MLA models: see below.
MFU rows divide by the source's stated peak; where a source gives none, the GPU's datasheet peak.
"""

from __future__ import annotations

import re

from shardscope.models.spec import ModelSpec
from shardscope.result import Estimate

# Peaks the sources divide by (TFLOP/s): MosaicML states 989 (H100 BF16), 1979 (H100 FP8), 312 (A100);
# Narayanan 2021 312; Llama 3 (PaLM MFU) the H100 BF16 989.
SOURCE_PEAK_TFLOPS = {("H100", "bf16"): 989.0, ("H100", "fp8"): 1979.0, ("A100", "bf16"): 312.0}


def _peak(gpu_name: str, precision: str, fallback: float) -> float:
    family = "A100" if gpu_name.upper().startswith("A100") else gpu_name.upper()
    return SOURCE_PEAK_TFLOPS.get((family, precision or "bf16"), fallback)


def flops_per_step(defn: str, model: ModelSpec, est: Estimate, notes: str, source: str) -> float | None:
    """FLOPs of one optimizer step under the source's definition."""
    s = est.plan["seq_len"]
    b = est.plan["global_batch"]
    tokens = b * s
    n_layers, h, v = model.layers, model.hidden, model.vocab
    if defn == "megatron2021_eq3":
        return 96.0 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (16 * n_layers * h))
    if defn == "mosaic_6n_attn":
        match = re.search(r"NumParams=(\d+)", notes)
        n = int(match.group(1)) if match else model.params_total
        return b * (6.0 * n * s + 3.0 * n_layers * 2 * 2 * h * s * s)
    if defn == "palm":
        return tokens * (6.0 * model.params_total + 12.0 * n_layers * model.heads * model.head_dim * s)
    if defn == "megatron_bridge" and (model.moe or model.mla):
        # Megatron's MoE/MLA count (num_floating_point_operations): 6 x every weight a token multiplies
        # (top-k experts, shared experts, MLA projections, output layer; MTP when trained) + causal
        # attention — the definition of our own model FLOPs, which reproduces the rows' TFLOP/s-to-
        # tokens/s ratios within 0.5% (Qwen3, DeepSeek-V3).
        return est.model_flops_per_step
    if defn == "megatron_bridge":
        causal = 1.0 if source == "NEMO_2407_PERF" else 0.5
        q_ratio = model.q_dim / h
        gated = 1.5 if model.mlp == "swiglu" else 1.0
        per_token = (
            12.0
            * n_layers
            * h
            * h
            * ((1 + model.kv_heads / model.heads + s / h * causal) * q_ratio + model.ffn_hidden / h * gated)
            + 6.0 * h * v
        )
        return tokens * per_token
    return None


def predicted_metric(metric: str, defn: str, model: ModelSpec, est: Estimate, row: dict[str, str]) -> float | None:
    """The prediction expressed as the row's metric, or None when the metric is unknown."""
    if metric == "tokens_per_sec_per_gpu":
        return est.tokens_per_s_per_gpu
    if metric == "step_time_s":
        return est.step_time_s
    if metric == "peak_mem_gib":
        return est.memory.peak_gib
    if metric in ("tflops_per_gpu", "mfu"):
        flops = flops_per_step(defn, model, est, row.get("notes", ""), row.get("source", ""))
        if flops is None:  # "unknown": our own model FLOPs
            flops = est.model_flops_per_step
        tflops = flops / est.step_time_s / est.gpus / 1e12
        if metric == "tflops_per_gpu":
            return tflops
        datasheet = est.model_tflops_per_gpu / est.mfu
        peak = _peak(row.get("gpu", ""), row.get("precision", "") or "bf16", datasheet)
        return 100.0 * tflops / peak
    return None
