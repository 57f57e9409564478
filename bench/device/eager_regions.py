"""Time, on one CUDA GPU, the elementwise regions that PyTorch-native model code runs eagerly, and the
GEMMs of a Llama-3.1-8B block through plain `F.linear`: what `graph/eager.py` prices.

Run on the device machine: `python bench/device/eager_regions.py OUT_DIR`. Writes
`OUT_DIR/eager_regions.json`: forward and forward+backward milliseconds (CUDA events, median of 20) and
the bytes autograd keeps, at 8192 tokens of Llama-3.1-8B (hidden 4096, 32 q / 8 kv heads of 128):
  * RMSNorm: `nn.RMSNorm` (fused since PyTorch 2.9), Hugging Face's `LlamaRMSNorm` (written out: fp32
    upcast, pow, mean, rsqrt, multiply, weight), and the composite `F.rms_norm` would run before 2.9;
  * RoPE on q and k: torchtitan's complex multiplication, Hugging Face's rotate_half;
  * SwiGLU: `F.silu(a) * b`;
  * the block's GEMMs (qkv, out, gate+up, down) forward and backward through `F.linear` in bf16.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from h100_kernels import events_time_ms  # this folder's kernel bench (the script's folder is on the path)

T, H, NQ, NKV, HD, FFN = 8192, 4096, 32, 8, 128, 14336
DEV, BF16 = "cuda", torch.bfloat16


def timed(fn, reps: int = 20) -> float:
    return events_time_ms(fn, reps, warmup=3)


def region(name: str, make, forward) -> dict:
    """Forward ms, forward+backward ms and the bytes autograd keeps for `forward` over `make()`'s inputs."""
    inputs = make()
    fwd = timed(lambda: forward(*inputs))
    grad = torch.randn_like(forward(*inputs))

    def step():
        y = forward(*inputs)
        y.backward(grad)

    both = timed(step)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = forward(*inputs)
    kept = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    del y
    return {"name": name, "fwd_ms": fwd, "fwd_bwd_ms": both, "saved_bytes": kept}


def hf_rmsnorm(x, w, eps=1e-5):
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(x.dtype)


def composite_rmsnorm(x, w, eps=1e-5):  # F.rms_norm's composite before PyTorch 2.9
    up = x.float()
    r = torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + eps)
    return ((up * r) * w).type_as(x)


def complex_rope(q, k, f):
    def one(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * f).flatten(-2).type_as(x)

    return torch.cat([one(q).flatten(1), one(k).flatten(1)], 1)


def rotate_half_rope(q, k, cos, sin):
    def rot(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    return torch.cat([(q * cos + rot(q) * sin).flatten(1), (k * cos + rot(k) * sin).flatten(1)], 1)


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "regions": []}

    def x_w():
        return (torch.randn(T, H, device=DEV, dtype=BF16, requires_grad=True),
                torch.ones(H, device=DEV, dtype=BF16, requires_grad=True))  # fmt: skip

    norm = torch.nn.RMSNorm(H, eps=1e-5, device=DEV, dtype=BF16)
    res["regions"].append(region("nn.RMSNorm", lambda: (x_w()[0],), norm))
    res["regions"].append(region("hf LlamaRMSNorm", x_w, hf_rmsnorm))
    res["regions"].append(region("composite rms_norm (<2.9)", x_w, composite_rmsnorm))
    ang = torch.rand(T, 1, HD // 2, device=DEV)
    freqs = torch.polar(torch.ones_like(ang), ang)

    def qk():
        return (torch.randn(T, NQ, HD, device=DEV, dtype=BF16, requires_grad=True),
                torch.randn(T, NKV, HD, device=DEV, dtype=BF16, requires_grad=True))  # fmt: skip

    res["regions"].append(region("torchtitan complex rope", lambda: (*qk(), freqs), complex_rope))
    cos = torch.rand(T, 1, HD, device=DEV, dtype=BF16)
    sin = torch.rand(T, 1, HD, device=DEV, dtype=BF16)
    res["regions"].append(region("hf rotate_half rope", lambda: (*qk(), cos, sin), rotate_half_rope))

    def ab():
        return (torch.randn(T, FFN, device=DEV, dtype=BF16, requires_grad=True),
                torch.randn(T, FFN, device=DEV, dtype=BF16, requires_grad=True))  # fmt: skip

    res["regions"].append(region("silu(a) * b", ab, lambda a, b: F.silu(a) * b))
    for name, n, k in (("qkv", (NQ + 2 * NKV) * HD, H), ("out", H, NQ * HD), ("gate+up", 2 * FFN, H), ("down", H, FFN)):
        w = (torch.randn(n, k, device=DEV, dtype=BF16) * 0.02).requires_grad_()
        r = region(f"F.linear {name} ({T}x{n}x{k})", lambda k=k: (torch.randn(T, k, device=DEV, dtype=BF16,
                   requires_grad=True),), lambda x, w=w: F.linear(x, w))  # fmt: skip
        r["tflops_fwd"] = 2 * T * n * k / r["fwd_ms"] / 1e9
        r["tflops_fwd_bwd"] = 6 * T * n * k / r["fwd_bwd_ms"] / 1e9
        res["regions"].append(r)
    for r in res["regions"]:
        print(f"{r['name']:42s} fwd {r['fwd_ms']:7.3f} ms  fwd+bwd {r['fwd_bwd_ms']:7.3f} ms  "
              f"saved {r['saved_bytes'] / 2**20:8.1f} MiB {r.get('tflops_fwd_bwd', '')}", flush=True)  # fmt: skip
    Path(out_dir, "eager_regions.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
