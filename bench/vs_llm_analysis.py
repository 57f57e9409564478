"""Distinct training configurations estimated per second: shardscope against llm-analysis 0.2.2 on the
same configurations, in the same run.

    python bench/vs_llm_analysis.py [--peer-python PATH] [--n 600] [--repeat 3]

Each configuration is a distinct (TP, PP, micro-batch, global batch, sequence length, recompute) plan of
Llama-2-70B on H100s (the model both tools know by name); every one is a fresh question, so no tool can
answer from a cache of a previous one; each keeps what it derives along the way, as in any run of many
estimates (shardscope builds one op graph per TP, micro-batch and sequence length, and plans share the costs
that do not depend on where they differ: a pipeline's across global batches, the model state's across
recompute policies). llm-analysis runs in `--peer-python` (an interpreter where `pip install
llm-analysis==0.2.2` was run; it imports transformers), each tool timed in its own process over the same
list. Each tool runs `--repeat` times in fresh processes, alternating, so that a busy moment of the machine
does not fall on one tool only; prints each tool's best and median rate and the ratio of the best.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys

PEER = r"""
import json, logging, sys, time
from llm_analysis.analysis import train
configs = json.loads(sys.stdin.read())
t0 = time.perf_counter()
failed = 0
for c in configs:
  try:
    train(model_name="upstage_Llama-2-70b-instruct-v2", gpu_name="h100-sxm-80gb", dtype_name="w16a16e16",
          log_level="ERROR", batch_size_per_gpu=c["micro_batch"], global_batch_size=c["global_batch"],
          seq_len=c["seq_len"], tp_size=c["tp"], pp_size=c["pp"], total_num_gpus=c["gpus"], ds_zero=1,
          activation_recomputation=2 if c["recompute"] == "full" else 0, flash_attn=True,
          mlp_gated_linear_units=True)
  except Exception:
    failed += 1
print(len(configs) / (time.perf_counter() - t0), failed)
"""


def configurations(n: int) -> list[dict]:
    grid = itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4), (1024, 2048, 4096), ("none", "full"),
                             (512, 1024, 2048))  # fmt: skip
    out = []
    for tp, pp, mb, seq, rc, gbs in grid:
        gpus = 512
        dp = gpus // (tp * pp)
        if gbs % (mb * dp) == 0:
            out.append(dict(tp=tp, pp=pp, micro_batch=mb, seq_len=seq, recompute=rc, global_batch=gbs, gpus=gpus))
    return out[:n]


OURS = r"""
import json, sys, time
import shardscope
configs = json.loads(sys.stdin.read())
shardscope.estimate("llama2-70b", "H100", 8, global_batch=8)  # imports and catalog load, not timed
t0 = time.perf_counter()
for c in configs:
    c = dict(c)
    shardscope.estimate("llama2-70b", "H100", c.pop("gpus"), zero=1, **c)
print(len(configs) / (time.perf_counter() - t0), 0)
"""


def rate(python: str, code: str, configs: list[dict]) -> float:
    """Distinct configurations per second of `code` run by `python` in a fresh process."""
    out = subprocess.run([python, "-c", code], input=json.dumps(configs), capture_output=True, text=True, check=True)
    value, failed = out.stdout.strip().splitlines()[-1].split()
    if int(failed):
        print(f"  ({failed} configurations raised)")
    return float(value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-python", default=None, help="interpreter with llm-analysis==0.2.2 installed")
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--repeat", type=int, default=3, help="fresh-process runs of each tool, alternating")
    args = ap.parse_args()
    configs = configurations(args.n)
    ours: list[float] = []
    peer: list[float] = []
    for _ in range(args.repeat):
        ours.append(rate(sys.executable, OURS, configs))
        if args.peer_python:
            peer.append(rate(args.peer_python, PEER, configs))
    print(f"shardscope:   best {max(ours):8.0f}, median {statistics.median(ours):8.0f} distinct configurations/s "
          f"({len(configs)} configurations, {args.repeat} runs)")  # fmt: skip
    if peer:
        print(f"llm-analysis: best {max(peer):8.0f}, median {statistics.median(peer):8.0f} distinct configurations/s")
        print(f"ratio of the best: {max(ours) / max(peer):.2f}x")


if __name__ == "__main__":
    sys.exit(main())
