"""Weight formats: the bits a weight takes with its share of the scales, and the precision its GEMMs run at.

A checkpoint states its format in its config.json's `quantization_config` (`checkpoint_format`); a serving
deployment runs that format unless the user names another (`resolve_format`). Embeddings, the LM head and
the router stay in the model dtype in every format here, as the quantization tools leave them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardscope.errors import ShardscopeError, warn


@dataclass(frozen=True, slots=True)
class WeightFormat:
    name: str
    bits: float  # per weight, with its share of the scales and zero points
    blackwell_gemm: str  # the GEMM precision on a GPU with FP4 tensor cores
    gemm: str  # elsewhere ("bf16": the kernel dequantizes the weights and multiplies in BF16)
    what: str

    @property
    def bytes(self) -> float:
        return self.bits / 8


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("bf16", 16, "bf16", "bf16", "the model dtype"),
        WeightFormat(
            "fp8", 8, "fp8", "fp8",
            "E4M3 with per-tensor, per-channel or 128x128-block scales (under 0.1% of the bytes); weight-only "
            "(FP8 Marlin) on GPUs without FP8 tensor cores",
        ),
        WeightFormat(
            "nvfp4", 4.5, "fp4", "bf16",
            "E2M1 with one E4M3 scale per 16 weights (NVIDIA ModelOpt NVFP4): W4A4 on Blackwell, weight-only "
            "(vLLM's FP4 Marlin) elsewhere",
        ),
        WeightFormat(
            "mxfp4", 4.25, "fp8", "bf16",
            "E2M1 with one E8M0 scale per 32 weights (OCP MX): against MXFP8 activations on Blackwell (FlashInfer "
            "/ TensorRT-LLM MoE kernels), weight-only elsewhere (vLLM's triton matmul_ogs upcasts to BF16)",
        ),
        WeightFormat(
            "w4a16", 4 + 20 / 128, "bf16", "bf16",
            "int4 with an FP16 scale and an int4 zero point per group of 128 (AWQ, GPTQ): weight-only",
        ),
    )
}  # fmt: skip
FORMAT_NAMES = tuple(WEIGHT_FORMATS)


def resolve_format(name: str, checkpoint: str) -> str:
    """`auto`: the checkpoint's format (the model dtype where it states none); else the format named."""
    if name == "auto":
        return checkpoint or "bf16"
    if name not in WEIGHT_FORMATS:
        raise ShardscopeError(f"unknown precision {name!r} (valid: auto, {', '.join(FORMAT_NAMES)})")
    return name


def checkpoint_format(cfg: dict[str, Any]) -> tuple[str, bool]:
    """The weight format a config.json's `quantization_config` states, and whether it quantizes only the
    routed experts (GPT-OSS leaves attention, router, embeddings and LM head in BF16). ("", False): none."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return "", False
    method = str(q.get("quant_method", "")).lower()
    fmt = ""
    if method == "fp8":
        fmt = "fp8"
    elif method == "mxfp4":
        fmt = "mxfp4"
    elif method == "modelopt":
        fmt = {"nvfp4": "nvfp4", "fp8": "fp8"}.get(str(q.get("quant_algo", "")).lower(), "")
    elif method in ("awq", "gptq") and q.get("bits", 4) == 4:
        fmt = "w4a16"
    elif method == "compressed-tensors":
        fmt = _compressed_tensors_format(q)
    if not fmt:
        warn(f"config.json: quantization_config {method or '?'!r} is not read; weights priced in the model dtype")
        return "", False
    skipped = " ".join(str(m) for m in q.get("modules_to_not_convert") or q.get("ignore") or ())
    return fmt, "self_attn" in skipped


def _compressed_tensors_format(q: dict[str, Any]) -> str:
    """llm-compressor's `config_groups`: the weights' bits and type, and whether activations are quantized."""
    for group in (q.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        bits, kind, acts = weights.get("num_bits"), weights.get("type"), group.get("input_activations")
        if bits == 8 and kind == "float":
            return "fp8"
        if bits == 4 and kind == "float" and weights.get("group_size") == 16:
            return "nvfp4"
        if bits == 4 and kind == "int" and acts is None:
            return "w4a16"
    return ""
