"""Write the project's copies of the validation rows with `stack` and `flags` filled: the settings each
run's sources state (Megatron-Bridge perf recipes read at their publishing commits,
`megatron_bridge_recipes.yaml`; the published runs' papers and guides, `published_runs.yaml`; the FP8
variant and MTP the tables print) as the `shardscope estimate` flags that differ from the stack's own
settings. Run from the repository root:

    python tools/validation_flags.py ../shared/validation/training_public.csv validation/training_public.csv
    python tools/validation_flags.py validation/published_moe_runs.csv validation/published_moe_runs.csv

This is how the flags were derived (kept for review); shardscope itself reads only `stack` and `flags`.

How the settings below were read from each row:

Defaults for blank cells (the frameworks' own recipes, never tuned to a row):
  micro_batch   1 (Megatron's default; Narayanan 2021 and Llama 3 do not state it).
  vpp           1 (no interleaving).
  recompute     the least recompute that fits in memory (none, selective, full): the run did not run out
                of memory, and recipes pick recompute that way. A recipe's recompute where the run kept
                the recipe's layout; where it overrode the layout (`layout_differs`), the least recompute
                from the recipe's up that fits.
  zero_or_fsdp  blank: Megatron-Bridge/NeMo recipes use the distributed optimizer (ZeRO-1); Narayanan 2021
                predates it (DDP). `ddp` in Megatron-Bridge tables (LLM and Wan DiT recipes, whose
                `use_distributed_optimizer=True`) also runs the distributed optimizer.
  activation    Megatron-Core rows (Megatron-Bridge, NeMo, Wan DiT) run the fused bias-activation its model
                providers enable (`bias_activation_fusion`): the SwiGLU keeps only its input.
  attention     flash-attention 2 for llm-foundry (MosaicML's benchmarks) and for NeMo AutoModel's Wan rows,
                which run diffusers' default ("native") attention, torch SDPA: its fixed backend priority
                puts FlashAttention-2 first and cuDNN last (aten sdp_utils.cpp `priority_order`;
                transformers PR #48163 measures cuDNN 1.7-2.3x faster on H100 for training shapes);
                cuDNN/FA3-class kernels for Megatron-Bridge/NeMo on Hopper; none (unfused softmax,
                materialised scores) for Narayanan 2021, which predates FlashAttention; FA3-class on
                Hopper otherwise.
  causal skip   off for llm-foundry: its triton flash attention takes ALiBi and the causal mask as one
                additive bias, so every block of the score matrix is computed.
  TP overlap    on for Megatron-Bridge/NeMo perf recipes (they enable `tp_comm_overlap`), off otherwise.
  MoE recipes   Megatron-Bridge MoE rows take recompute (Megatron's recompute modules), the all-to-all
                overlap, the dispatcher and the pipeline layout from the
                perf recipe that produced them (`megatron_bridge_recipes.yaml`, read from the repository at
                the commit that published the row). NCCL `alltoall` sends a copy per token-expert pair
                (flat); DeepEP / HybridEP send one copy per node. A Megatron row without a recipe gets
                the flex dispatcher (DeepEP) and the overlap wherever Megatron-Core allows it. The
                measured runs of `validation/published_moe_runs.csv` take the same settings as their
                sources state them (`published_runs.yaml`, keyed by row id, each cited).
  MTP           DeepSeek-V3 rows train the MTP module unless the table says "w/o MTP" (the recipe's
                default; the rows' TFLOP/s-to-tokens/s ratios include its FLOPs), on the last stage.
  PP layout     the recipe's Megatron pipeline layout where it sets one (DeepSeek-V3), else the even split.
  CUDA graphs   the recipe's captured scopes for Megatron-Bridge MoE rows; eager (none) elsewhere, as the
                other sources do not say.
  MoE models    structure from the catalog config (MLA, shared experts, dense layers, windows), after
                checking the row's columns agree with it.
"""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path

import yaml

from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import load_gpu, make_cluster
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import cuda_graph_scopes, make_plan
from shardscope.stacks import load_stack
from shardscope.validate.rows import RowCase, SkipRow, _int
from shardscope.validate.rows import model_from_row as new_model_from_row

MEGATRON_BRIDGE_SOURCES = {"MBRIDGE_PERF", "MBRIDGE_MOE_AB", "MBRIDGE_CARD", "MBRIDGE_CG_AB", "MBRIDGE_RECOMPUTE_AB"}
MEGATRON_SOURCES = MEGATRON_BRIDGE_SOURCES | {"NEMO_2407_PERF", "MCORE_MOE_REPORT", "MCORE_DSV3_GB200_GUIDE"}
# Megatron-Core runs of today (distributed optimizer, fused activations); Narayanan 2021 predates both.
# The Wan table's NeMo AutoModel rows are not: diffusers' WanTransformer3DModel under PyTorch FSDP2.
MEGATRON_CORE_SOURCES = MEGATRON_SOURCES | {"WAN_DIT_PERF"}
# llm-foundry's MPT takes `loss_fn: fused_crossentropy` by default (flash-attn's xentropy kernel;
# llmfoundry/models/mpt/modeling_mpt.py at 8c8dd48), and its benchmark configs keep the default.
FUSED_CROSS_ENTROPY_SOURCES = {"MOSAICML_LLMFOUNDRY"}
# Megatron-Bridge's GPT provider sets `cross_entropy_loss_fusion=True` (models/gpt_provider.py) and its
# perf scripts `cross_entropy_fusion_impl="te"` (scripts/performance/utils/overrides.py, perf_recipes/
# _common.py): Transformer Engine's Triton cross-entropy. Up to TE 2.16 it writes the logit gradient into
# the bf16 logits in place (the fused accounting); TE 2.18 (PR #3193, 2026-07) keeps an fp32 gradient, as
# many bytes as the unfused path. NeMo containers up to 26.06 ship TE <= 2.16, 26.08 TE 2.18
# (Megatron-Bridge docs/releases/software-versions.md). Runs naming no container keep the fp32 accounting:
# the Qwen3-30B A/B's measured rank-0 peak (62.2 GiB, July 2026) is 60.8 GiB with it, 57.4 without.
LAST_CONTAINER_WITH_INPLACE_CROSS_ENTROPY = (26, 6)


def model_from_row(row: dict[str, str]) -> ModelSpec:
    return new_model_from_row(row)[0]


def automodel(row: dict[str, str]) -> bool:
    """A NeMo AutoModel row (diffusers model code under PyTorch FSDP2), named so in the row's notes."""
    return "NeMo Automodel" in row.get("notes", "")


def megatron_core(row: dict[str, str]) -> bool:
    return row.get("source") in MEGATRON_CORE_SOURCES and not automodel(row)


def _sharding(row: dict[str, str]) -> dict:
    z = (row.get("zero_or_fsdp") or "").strip().lower()
    megatron = megatron_core(row)
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
    if source == "MOSAICML_LLMFOUNDRY" or automodel(row):
        return "fa2"
    return "auto"


def fp8_recipe(row: dict[str, str]) -> str:
    """The FP8 variant named in the row's notes (SOURCES.md): FP8-MX/MXFP8 is MX block scaling on
    Blackwell and 128x128 / 1x128 block scaling on Hopper; FP8-CS is per-tensor current scaling;
    NeMo 24.07 and llm-foundry's amp_fp8 used Transformer Engine's delayed scaling."""
    notes = row.get("notes", "")
    if "FP8-MX variant" in notes or re.search(r"precision as listed: (FP8-MX|MXFP8)\b", notes):
        return "mxfp8" if load_gpu(row["gpu"]).arch == "blackwell" else "blockwise"
    if row.get("source") in ("NEMO_2407_PERF", "MOSAICML_LLMFOUNDRY"):
        return "delayed"
    return "tensorwise"


def case_model_mtp(row: dict[str, str]) -> bool:
    return row["model"].lower() == "deepseek_v3" and "w/o MTP" not in row.get("notes", "")


@lru_cache(maxsize=2)
def _settings_file(name: str) -> dict:
    """One of the run-settings files in validation/ (`megatron_bridge_recipes.yaml`, `published_runs.yaml`)."""
    return yaml.safe_load((Path(__file__).resolve().parents[1] / "validation" / name).read_text())


def nemo_container(notes: str) -> str | None:
    """The NeMo container release a row's notes name ("NeMo container 26.04.01"), or None."""
    match = re.search(r"NeMo container ([\d.]+)", notes)
    return match.group(1) if match else None


def fused_cross_entropy(row: dict[str, str]) -> bool:
    """Whether the run's loss kernel keeps only the bf16 logits (see `FUSED_CROSS_ENTROPY_SOURCES`)."""
    if row.get("source") in FUSED_CROSS_ENTROPY_SOURCES:
        return True
    release = container_release(row.get("notes", ""))
    if row.get("source") not in MEGATRON_BRIDGE_SOURCES or not release:
        return False
    return release[:2] <= LAST_CONTAINER_WITH_INPLACE_CROSS_ENTROPY


def container_release(notes: str) -> tuple[int, ...]:
    """The NeMo container release as numbers ((26, 4, 1) for 26.04.01), empty when the notes name none."""
    release = nemo_container(notes)
    return tuple(int(x) for x in release.split(".")) if release else ()


def megatron_bridge_recipe(row: dict[str, str]) -> dict | None:
    """The perf recipe behind a Megatron-Bridge row: matched on model, system, GPUs, the precision as
    listed and the container release (both from the row's notes)."""
    if row.get("source") != "MBRIDGE_PERF":
        return None
    notes = row.get("notes", "")
    container = nemo_container(notes)
    precision = re.search(r"precision as listed: ([^;]+);", notes)
    if not container or not precision:
        return None
    key = (row["model"], row["gpu"], _int(row, "num_gpus"), precision.group(1).strip(), container)
    for recipe in _settings_file("megatron_bridge_recipes.yaml")["recipes"]:
        if (recipe["model"], recipe["system"], recipe["gpus"], recipe["precision"], recipe["container"]) == key:
            return recipe
    return None


def run_recipe(row: dict[str, str]) -> dict | None:
    """The settings behind a row that its columns do not carry: the Megatron-Bridge perf recipe, or for
    the measured runs of `validation/published_moe_runs.csv` what their source states
    (`published_runs.yaml`, keyed by row id)."""
    return megatron_bridge_recipe(row) or _settings_file("published_runs.yaml")["runs"].get(row.get("id", ""))


def recipe_cuda_graphs(recipe: dict) -> tuple[str, ...]:
    """The recipe's CUDA-graph scopes: `none`, `full_iteration` or `partial: <scope>, <scope>...`."""
    return cuda_graph_scopes(recipe["cuda_graphs"].strip().removeprefix("partial:"))


def _moe_settings(row: dict[str, str], recipe: dict | None) -> dict:
    """EP overlap and dispatch: the recipe's where known, else the defaults of Megatron-Bridge perf runs
    (flex dispatcher, overlap where Megatron-Core allows it: no pipeline or an interleaved one)."""
    if recipe is not None and "dispatcher" in recipe:  # an MoE run's recipe
        return {
            "ep_comm_overlap": recipe["ep_comm_overlap"],
            "ep_dispatch": "flat" if recipe["dispatcher"] == "alltoall" else recipe["dispatcher"],
            "cuda_graphs": recipe_cuda_graphs(recipe),
        }
    megatron = row.get("source") in MEGATRON_SOURCES
    overlap = megatron and _int(row, "ep", 1) > 1 and (_int(row, "pp", 1) == 1 or _int(row, "vpp", 1) > 1)
    return {"ep_comm_overlap": overlap, "ep_dispatch": "deepep" if megatron else "flat"}


def case_from_row(row: dict[str, str]) -> RowCase:
    precision = (row.get("precision") or "bf16").strip().lower()
    model = model_from_row(row)
    cluster = make_cluster(row["gpu"], _int(row, "num_gpus"))
    recipe = run_recipe(row)
    settings = recipe or {}  # the recipe's optional fields, each with the frameworks' default
    recompute = (row.get("recompute") or settings.get("recompute") or "none").strip().lower()
    recompute_layers = 0
    if recompute.startswith("selective"):
        recompute = "selective"
    elif recompute.startswith("full("):  # Megatron "full(block,N)": N layers per stage recomputed
        match = re.search(r"full\(\w+,\s*(\d+)\)", recompute)
        recompute, recompute_layers = "full", int(match.group(1)) if match else 0
    try:
        plan = make_plan(
            model,
            cluster,
            tp=_int(row, "tp", 1),
            pp=_int(row, "pp", 1),
            vpp=_int(row, "vpp", 1),
            pp_layout=settings.get("pp_layout"),
            cp=_int(row, "cp", 1),
            dp=_int(row, "dp", 0) or None,
            micro_batch=_int(row, "micro_batch", 1),
            global_batch=_int(row, "global_batch"),
            seq_len=_int(row, "seq_len"),
            recompute=recompute,
            recompute_layers=recompute_layers,
            recompute_modules=tuple(recipe["recompute_modules"]) if recipe and recompute == "selective" else None,
            precision="fp8" if precision == "fp8" else "bf16",
            fp8_recipe=(settings.get("fp8_recipe") or fp8_recipe(row)) if precision == "fp8" else "tensorwise",
            fp8_all_gather=bool(settings.get("fp8_param_gather")),
            attention_kernel=_attention_kernel(row),
            tp_comm_overlap=settings.get("tp_comm_overlap", row.get("source") in MEGATRON_SOURCES),
            fused_activation=megatron_core(row),
            fused_cross_entropy=settings.get("fused_cross_entropy", fused_cross_entropy(row)),
            causal_block_skip=row.get("source") != "MOSAICML_LLMFOUNDRY",
            ep=_int(row, "ep", 1),
            capacity_factor=settings.get("capacity_factor", 0.0),
            moe_router_padding=bool(settings.get("moe_router_padding")) and precision == "fp8",
            deepep_fused_routing_map=bool(settings.get("enable_experimental")),
            fused_expert_mlp=bool(settings.get("fused_expert_mlp")),
            optimizer_moments=settings.get("optimizer_moments", "fp32"),
            main_grads=settings.get("main_grads", "fp32"),
            offload_optimizer=bool(settings.get("offload_optimizer")),
            offload_activations=settings.get("offload_activations", 0.0),
            overlap_grad_reduce=settings.get("overlap_grad_reduce", True),
            **_moe_settings(row, recipe),
            # Megatron-Bridge's DeepSeek-V3 recipe trains the MTP module unless the table says "w/o MTP".
            mtp=bool(case_model_mtp(row)),
            **_sharding(row),
        )
    except ShardscopeError as exc:
        raise SkipRow(f"plan rejected: {exc}") from None
    return RowCase(model, cluster, plan, load_stack(row.get("stack") or ""))


# Plan fields a flags cell may carry, in the order they are written
FLAGGED = (
    "recompute", "recompute_modules", "pp_layout", "fp8_recipe", "fp8_all_gather", "attention_kernel",
    "tp_comm_overlap", "fused_activation", "fused_cross_entropy", "causal_block_skip", "capacity_factor",
    "moe_router_padding", "deepep_fused_routing_map", "fused_expert_mlp", "optimizer_moments", "main_grads",
    "offload_optimizer", "offload_activations", "overlap_grad_reduce", "ep_comm_overlap", "ep_dispatch",
    "cuda_graphs", "mtp", "zero", "fsdp",
)  # fmt: skip
# recipe / published-run keys -> the Plan field they set
RECIPE_FIELDS = {
    "fp8_param_gather": "fp8_all_gather", "enable_experimental": "deepep_fused_routing_map",
    "dispatcher": "ep_dispatch",
}  # fmt: skip
STACKS = {  # the stack of rows whose shared file names none (the project's own files)
    "MCORE_MOE_REPORT": "megatron@0.16",
    "MCORE_DSV3_GB200_GUIDE": "megatron@0.16",
}


def _flag(name: str, value) -> str:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else "--no-" + name.replace("_", "-")
    if name == "cuda_graphs" and not value:
        return "--cuda-graphs none"
    if isinstance(value, tuple):
        value = ",".join(value) if name != "pp_layout" else ",".join(str(v) for v in value)
    text = str(value)
    return f"{flag} {shlex.quote(text)}"


def row_flags(row: dict[str, str], stack: str) -> str:
    """The flags that give `row` under `stack` the settings its sources state."""
    import shardscope.validate.rows as new_rows
    from shardscope.plan.flags import parse_flags

    stated = case_from_row(row).plan
    recipe = run_recipe(row)
    pp_text = (recipe or {}).get("pp_layout")
    out = []
    probe = dict(row, stack=stack, flags="", recompute=row.get("recompute") or stated.recompute)
    if stated.recompute_modules and not row.get("recompute"):
        probe["recompute"] = ""
    base = new_rows.case_from_row(probe).plan
    stated_keys = {RECIPE_FIELDS.get(k, k) for k in (recipe or {})}
    if stated.precision == "fp8":
        stated_keys.add("fp8_recipe")  # the variant the table prints ("FP8-MX", "MXFP8", "FP8-CS")
    model = case_from_row(row).model
    if model.mtp_layers:
        stated_keys.add("mtp")  # the table's "w/ MTP" / "w/o MTP"
    if stated.recompute == "selective" and stated.recompute_modules:
        stated_keys.add("recompute_modules")
    else:
        stated_keys.discard("recompute_modules")  # Megatron-Core reads the list only under selective
    for name in (n for n in FLAGGED if n in stated_keys):
        value, default = getattr(stated, name), getattr(base, name)
        if name == "recompute" and row.get("recompute"):
            continue
        if name == "pp_layout" and value and pp_text:
            out.append(_flag(name, pp_text))
            continue
        if name == "recompute" or (name == "recompute_modules" and value):
            out.append(_flag(name, value))  # the recipe's policy: a floor the run may have raised
            continue
        if value != default and not (name in ("zero", "fsdp") and row.get("zero_or_fsdp")):
            out.append(_flag(name, value))
    text = " ".join(out)
    parse_flags(text)  # the cell must read back
    return text


def main(src: str, dst: str) -> None:
    import csv

    with open(src, newline="") as fh:
        rows = list(csv.DictReader(fh))
    columns = list(rows[0])
    for col in ("stack", "flags"):
        if col not in columns:
            columns.append(col)
    for row in rows:
        row["stack"] = row.get("stack") or STACKS.get(row["source"], "")
        if not row["stack"] and nemo_container(row.get("notes", "")):
            row["stack"] = "nemo@" + nemo_container(row["notes"])
        if not row["stack"] and row["source"].startswith("MBRIDGE"):
            # Megatron-Bridge's skills and cards of July 2026 ran its main branch with Transformer Engine
            # 2.18 (the fp32 cross-entropy gradient): the 26.08 container's software
            row["stack"] = "nemo@26.08"
        try:
            row["flags"] = row_flags(row, row["stack"])
        except SkipRow as exc:
            print(f"{row['id']}: {exc}")
            row["flags"] = ""
    with open(dst, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {dst}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1], sys.argv[2])
