"""Time vLLM's per-checkpoint-tensor scan of `expert_params_mapping` on this CPU (no GPU, no torch).

vLLM's MoE `load_weights` (vllm/model_executor/models/deepseek_v2.py, qwen3_moe.py, ...) walks, for every
expert tensor of the checkpoint, the list of 3 x experts (param_name, weight_name, expert_id, shard_id)
tuples until `weight_name in name` matches: one tuple unpack and one substring test per entry. This
script rebuilds that loop with the real names and prints the seconds per entry (used by
`shardscope.rl.engine.EXPERT_SCAN_ENTRY_S`, put on the H100 hosts' clock with HOST_PYTHON_SPEED).
Run: python bench/vllm_expert_scan.py
"""

from __future__ import annotations

import time


def main(experts: int = 256, layers: int = 4, repeats: int = 3) -> float:
    mapping = [
        ("experts.w13_" if w in ("gate_proj", "up_proj") else "experts.w2_", f"experts.{e}.{w}.", e, s)
        for e in range(experts)
        for w, s in (("gate_proj", "w1"), ("down_proj", "w2"), ("up_proj", "w3"))
    ]
    names = [
        f"model.layers.{layer}.mlp.experts.{e}.{w}.weight"
        for layer in range(layers)
        for e in range(experts)
        for w in ("gate_proj", "up_proj", "down_proj")
    ]
    best = float("inf")
    for _ in range(repeats):
        visited = 0
        start = time.perf_counter()
        for name in names:
            for i, mapping_entry in enumerate(mapping):
                _param_name, weight_name, _expert_id, _shard_id = mapping_entry
                if weight_name not in name:
                    continue
                visited += i + 1
                break
        best = min(best, (time.perf_counter() - start) / visited)
    return best


if __name__ == "__main__":
    print(f"{main() * 1e9:.1f} ns per mapping entry")
