"""Convert a prediction into a row's metric, using the source's own FLOP definition (`flops_def`).

Definitions (see shared/validation/SOURCES.md):
  megatron2021_eq3  F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per step (counts the recompute forward).
  mosaic_6n_attn    per sequence 6·N·s + 3·l·2·2·d·s² (N = exact NumParams from the row's notes).
  palm              per token 6·N + 12·l·H·Q·T (Chowdhery et al. 2022, App. B).
  megatron_bridge   3x forward FLOPs (Megatron-Bridge `flop_utils.py`, Megatron `num_floating_point_operations`):
                    per token 12·l·h²·[(1 + g/a + k/h)·q/h + (f/h)·m] + 6·h·V, with k the keys a query
                    sees (s/2 causal) and m = 3/2 for a gated MLP (f = top-k x expert size + shared
                    experts on MoE layers). NeMo 24.07 counted full attention (k = s), as the TFLOP/s-to-
                    tokens/s ratio of its rows shows (e.g. Llama-3 70B: 4.81e11 per token = the k = s
                    value, vs 4.49e11 for k = s/2). Before Megatron-Bridge v0.5.0 (commit baa0259bd; the
                    26.06 container) m = 3/2 only for a SiLU gate (GPT-OSS's x·σ(1.702x) gate counted 1)
                    and sliding-window layers counted as full causal ones (k = s/2); from it, every gate
                    counts 3/2 and a window of w keys counts k = w − w(w−1)/(2s). The GPT-OSS rows'
                    TFLOP/s-to-tokens/s ratios show both: 2.72e10 per token up to 26.04.01, 3.26e10 in
                    26.08. MLA models (DeepSeek): see below.
MFU rows divide by the source's stated peak; where a source gives none, the GPU's datasheet peak.
"""

from __future__ import annotations

from shardscope.models.spec import ModelSpec
from shardscope.result import Estimate
from shardscope.stacks import Stack

# Peaks the sources divide by (TFLOP/s): MosaicML states 989 (H100 BF16), 1979 (H100 FP8), 312 (A100);
# Narayanan 2021 312; Llama 3 (PaLM MFU) the H100 BF16 989.
SOURCE_PEAK_TFLOPS = {("H100", "bf16"): 989.0, ("H100", "fp8"): 1979.0, ("A100", "bf16"): 312.0}


def _peak(gpu_name: str, precision: str, fallback: float) -> float:
    family = "A100" if gpu_name.upper().startswith("A100") else gpu_name.upper()
    return SOURCE_PEAK_TFLOPS.get((family, precision or "bf16"), fallback)


def flops_per_step(defn: str, model: ModelSpec, est: Estimate, stack: Stack) -> float | None:
    """FLOPs of one optimizer step under the source's definition, as the stack's own FLOP counter applies
    it (`flops_attention`, `flops_exact_glu_window`)."""
    s = est.plan["seq_len"]
    b = est.plan["global_batch"]
    tokens = b * s
    n_layers, h, v = model.layers, model.hidden, model.vocab
    if defn == "megatron2021_eq3":
        return 96.0 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (16 * n_layers * h))
    if defn == "mosaic_6n_attn":
        n = model.params_total
        return b * (6.0 * n * s + 3.0 * n_layers * 2 * 2 * h * s * s)
    if defn == "palm":
        return tokens * (6.0 * model.params_total + 12.0 * n_layers * model.heads * model.head_dim * s)
    if defn == "megatron_bridge" and model.mla:
        # Megatron's MLA count (6 x every weight a token multiplies: MLA projections, top-k and shared
        # experts, output layer, MTP when trained + causal attention) is the definition of our own model
        # FLOPs, which reproduces the DeepSeek-V3 rows' TFLOP/s-to-tokens/s ratios within 0.5%.
        return est.model_flops_per_step
    if defn == "megatron_bridge":
        full = stack.value("flops_attention", "causal") == "full"
        return tokens * megatron_bridge_flops_per_token(model, s, full, bool(stack.value("flops_exact_glu_window")))
    return None


def megatron_bridge_flops_per_token(model: ModelSpec, s: int, full_attention: bool, exact: bool) -> float:
    """Megatron-Bridge's FLOPs per token of a non-MLA model (see the module docstring): `full_attention`
    as NeMo 24.07 counted it, `exact` GLU and window counting from Megatron-Bridge v0.5.0."""
    h = model.hidden
    gated = model.mlp == "swiglu" and (exact or model.glu_gate == "silu")
    m = 1.5 if gated else 1.0
    q_ratio = model.q_dim / h
    total = 0.0
    for kind in model.layer_kinds():
        if full_attention:
            keys = float(s)
        elif exact and kind.attention == "window":
            w = model.attention_window + 1  # Megatron's window (w, 0) plus the query's own key
            keys = w - w * (w - 1) / (2 * s)
        else:
            keys = s / 2
        ffn = model.ffn_hidden
        if kind.mlp == "moe" and model.moe is not None:
            ffn = model.moe.top_k * model.moe.expert_ffn + model.moe.shared_experts * model.moe.shared_ffn
        total += (1 + model.kv_heads / model.heads + keys / h) * q_ratio + ffn / h * m
    return 12.0 * h * h * total + 6.0 * h * model.vocab


def predicted_metric(
    metric: str, defn: str, model: ModelSpec, est: Estimate, row: dict[str, str], stack: Stack
) -> float | None:
    """The prediction expressed as the row's metric, or None when the metric is unknown."""
    if metric == "tokens_per_sec_per_gpu":
        return est.tokens_per_s_per_gpu
    if metric == "step_time_s":
        return est.step_time_s
    if metric == "peak_mem_gib":
        return est.memory.peak_gib
    if metric in ("tflops_per_gpu", "mfu"):
        flops = flops_per_step(defn, model, est, stack)
        if flops is None:  # "unknown": our own model FLOPs
            flops = est.model_flops_per_step
        tflops = flops / est.step_time_s / est.gpus / 1e12
        if metric == "tflops_per_gpu":
            return tflops
        datasheet = est.model_tflops_per_gpu / est.mfu
        peak = _peak(row.get("gpu", ""), row.get("precision", "") or "bf16", datasheet)
        return 100.0 * tflops / peak
    return None
