"""Time, on one CUDA GPU, the loss as PyTorch-native code runs it: `F.cross_entropy(logits.float(), ...)`
(log_softmax + nll_loss over an fp32 copy) forward and backward, against the same under `torch.compile`.

Run on the device machine: `python bench/device/loss_regions.py OUT_DIR`; writes `OUT_DIR/loss_regions.json`
(CUDA-event medians at 8192 tokens x 128256 vocab, Llama 3's, and 4096 x 151936, Qwen3's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from h100_kernels import events_time_ms  # this folder's kernel bench (the script's folder is on the path)


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def main(out_dir: str) -> None:
    res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "runs": []}
    compiled = torch.compile(loss)
    for tokens, vocab in ((8192, 128256), (4096, 151936)):
        logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, vocab, (tokens,), device="cuda")
        for name, fn in (("eager", loss), ("compiled", compiled)):
            fwd = events_time_ms(lambda fn=fn, x=logits, y=labels: fn(x, y), 20, warmup=3)
            both = events_time_ms(lambda fn=fn, x=logits, y=labels: fn(x, y).backward(), 20, warmup=3)
            row = {"tokens": tokens, "vocab": vocab, "mode": name, "fwd_ms": fwd, "fwd_bwd_ms": both}
            res["runs"].append(row)
            print(row, flush=True)
        del logits
        torch.cuda.empty_cache()
    Path(out_dir, "loss_regions.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
