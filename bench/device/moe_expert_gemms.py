"""Write `moe_expert_gemms.json`: the expert GEMM shapes of every MoE validation row, for the device script.

`python bench/device/moe_expert_gemms.py` (here, with the package installed): one entry per distinct
(experts, tokens an expert, N, K, precision) of the grouped GEMMs that the op graph of each MoE row of
`../shared/validation/training_public.csv` and `validation/published_moe_runs.csv` builds, with the rows
that use it. `h100_kernels.py` times each one's forward, dgrad and wgrad on the GPU.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from shardscope.graph.build import build_stage_graph
from shardscope.validate.rows import case_from_row

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    ROOT.parent / "shared" / "validation" / "training_public.csv",
    ROOT / "validation" / "published_moe_runs.csv",
)


def expert_gemm_shapes() -> list[dict]:
    shapes: dict[tuple, list[str]] = {}
    for path in SOURCES:
        for row in csv.DictReader(path.open()):
            if row.get("arch") != "moe" or not row["metric"].startswith("tokens"):
                continue
            case = case_from_row(row)
            graph = build_stage_graph(case.model, case.plan, case.cluster.gpu.arch)
            for layer in graph.layers.values():
                for op in layer.ops:
                    if op.kind != "gemm" or op.groups <= 1:
                        continue
                    m, n, k = op.mnk
                    precision = "fp8" if op.fp8 and case.plan.precision == "fp8" else "bf16"
                    key = (op.groups, max(1, round(m / op.groups)), n, k, precision)
                    shapes.setdefault(key, []).append(f"{row['id']}:{op.name}")
    return [
        {"groups": g, "m": m, "n": n, "k": k, "precision": p, "rows": rows}
        for (g, m, n, k, p), rows in sorted(shapes.items())
    ]


if __name__ == "__main__":
    out = Path(__file__).parent / "moe_expert_gemms.json"
    out.write_text(json.dumps(expert_gemm_shapes(), indent=1))
    print(f"wrote {out}")
