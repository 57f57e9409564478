"""GPU catalog (`gpus.yaml`, every figure with its source) and cluster descriptions.

A cluster is `gpus` GPUs of one kind in nodes of `gpus_per_node`, joined by a scale-up domain (NVLink /
Infinity Fabric, `scaleup_domain` GPUs) and a scale-out fabric (InfiniBand / RoCE, one NIC per GPU).
Users describe their own in YAML or JSON (see `load_cluster_file`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardscope.errors import ShardscopeError, unknown_name

if TYPE_CHECKING:
    from shardscope.hardware.profile import Profile

# Per-message latency of one collective step (NCCL Simple protocol): NVLink hop and network hop.
# Order of magnitude from nccl-tests small-message all-reduce times (~10 us intra-node on 8 GPUs, ~20-30
# us across nodes, i.e. a few us per ring step). Only matters for small messages and many steps.
SCALEUP_LATENCY_S = 3e-6
SCALEOUT_LATENCY_S = 8e-6


# The kernel library named where a GPU measures its FP8 GEMMs apart (`GPU.matmul_fraction`)
CUBLASLT = "cublaslt"


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    arch: str
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_gib: float
    hbm_gbps: float
    sms: int
    scaleup_gbps: float
    scaleup_domain: int
    scaleout_gbps: float
    gpus_per_node: int
    matmul_burst_fraction: float
    matmul_sustained_fraction: float
    fp8_matmul_sustained_fraction: float | None = None
    # FP8 GEMMs through cuBLASLt (training frameworks' path) where they run slower than the kernels the FP8
    # fraction was measured on (Blackwell: DeepGEMM); None: the FP8 fraction
    fp8_cublaslt_matmul_sustained_fraction: float | None = None
    fp4_tflops: float | None = None  # dense FP4 (NVFP4) tensor peak; None where the chip has no FP4 tensor cores
    fp4_matmul_sustained_fraction: float | None = None
    # NVFP4 grouped (MoE) GEMMs, measured slower than dense ones; None: the FP4 fraction
    fp4_grouped_matmul_sustained_fraction: float | None = None
    attention_fwd_scale: float = 1.0  # flash-attention forward speed over its architecture's figures
    pcie_gbps: float = 25.0  # host link per GPU per direction (achieved)
    tdp_w: float | None = None  # board power limit the sustained fractions were measured at
    host_memory_gib: float = 1024.0  # per node
    host_memory_gbps: float = 400.0  # per node
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    notes: str = ""
    # what is known to be wrong with this entry's efficiencies, said with every training estimate on it
    caveat: str = ""
    # A measured profile (`hardware.profile.Profile`) whose times replace the rooflines where it covers an
    # op (`costs.profiled`); None: rooflines and shipped efficiencies only. Part of the GPU's identity, so
    # memoised costs of a profiled GPU are never those of the bare one.
    profile: Profile | None = None

    def matmul_fraction(self, precision: str, library: str = "", grouped: bool = False) -> float:
        """Sustained fraction of the datasheet peak that large GEMMs of this precision reach (FP4 where
        unmeasured: FP8's); `library` `CUBLASLT`: FP8 GEMMs issued through cuBLASLt; `grouped`: one grouped
        kernel over many problems (MoE experts)."""
        if precision == "fp8" and library == CUBLASLT and self.fp8_cublaslt_matmul_sustained_fraction:
            return self.fp8_cublaslt_matmul_sustained_fraction
        if precision == "fp4" and grouped and self.fp4_grouped_matmul_sustained_fraction:
            return self.fp4_grouped_matmul_sustained_fraction
        if precision == "fp4" and self.fp4_matmul_sustained_fraction:
            return self.fp4_matmul_sustained_fraction
        if precision in ("fp8", "fp4") and self.fp8_matmul_sustained_fraction:
            return self.fp8_matmul_sustained_fraction
        return self.matmul_sustained_fraction

    def peak_tflops(self, precision: str) -> float:
        if precision == "fp8":
            if self.fp8_tflops is None:
                raise ShardscopeError(f"{self.name} has no FP8 tensor cores (use --precision bf16)")
            return self.fp8_tflops
        if precision == "fp4":
            if self.fp4_tflops is None:
                raise ShardscopeError(f"{self.name} has no FP4 tensor cores")
            return self.fp4_tflops
        return self.bf16_tflops


@dataclass(frozen=True, slots=True)
class Cluster:
    gpu: GPU
    gpus: int
    gpus_per_node: int
    scaleup_domain: int
    scaleup_gbps: float
    scaleout_gbps: float
    scaleup_latency_s: float = SCALEUP_LATENCY_S
    scaleout_latency_s: float = SCALEOUT_LATENCY_S

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)


@cache
def _gpu_table() -> dict[str, GPU]:
    import yaml

    raw = yaml.safe_load((resources.files("shardscope.hardware") / "gpus.yaml").read_text())
    table = {}
    for entry in raw["gpus"]:
        entry = {**entry, "aliases": tuple(entry.get("aliases", ())), "sources": tuple(entry.get("sources", ()))}
        gpu = GPU(**entry)
        table[gpu.name] = gpu
    return table


def list_gpus() -> list[GPU]:
    return list(_gpu_table().values())


# Words of a GPU's marketing name that do not change which catalog entry it is
_NAME_NOISE = {"nvidia", "sxm", "sxm4", "sxm5", "hbm3", "hbm3e", "hbm2e", "dgx", "hgx", "gpu", "tensor", "core"}


def load_gpu(name: str) -> GPU:
    """A GPU by catalog name or alias, case-insensitive (`H100`, `a100-80gb`, `GB200`); a marketing name
    ("H100 80GB HBM3", "NVIDIA A100-SXM4-40GB (DGX-A100)") is read by its part and memory size."""
    table = _gpu_table().values()

    def find(key: str) -> GPU | None:
        return next((g for g in table if key == g.name.lower() or key in g.aliases), None)

    key = name.strip().lower()
    words = [w for w in re.split(r"[\s_/-]+", re.sub(r"\(.*?\)", " ", key)) if w and w not in _NAME_NOISE]
    gpu = find(key) or find("-".join(words)) or (find(words[0]) if len(words) == 1 else None)
    if gpu is None and len(words) == 2 and re.fullmatch(r"\d+gb", words[1]):
        base = find(words[0])  # "H100 80GB": the part named alone, if its memory is that size
        if base is not None and abs(base.hbm_gib * 1.074 - int(words[1][:-2])) < 6:
            gpu = base
    if gpu is None:
        raise unknown_name("GPU", name, [g.name for g in table])
    return gpu


# Share of its rated power below which a GPU's GEMM clock sits at the voltage floor. Above it the voltage
# follows the clock and dynamic power goes as f·V², so the clock goes as the cube root of the power; below
# it the voltage cannot drop further and the clock falls in proportion. Fitted on one H100 measurement and
# checked on a GB300: FBGEMM PR #2546 (H100 at 500 W: BF16 GEMMs of 8k-64k rows 546-585 TFLOP/s, 0.81 of
# what this catalog gives the 700 W part) and facebookexperimental/triton PR #2023 (GB300: cuBLAS GEMMs
# ~617 TFLOP/s at 500 W against 1,600-2,174 at 1,400 W, 0.28-0.39; this law gives 0.40, the cube root 0.71).
VOLTAGE_FLOOR_SHARE = 0.83


def power_capped(gpu: GPU, watts: float) -> GPU:
    """`gpu` under a board power cap of `watts` below its TDP: GPU Boost lowers the SM clock until the
    board draws no more, and every compute-bound kernel's speed (GEMMs of each precision, attention) goes
    with the clock (`VOLTAGE_FLOOR_SHARE`); HBM bandwidth does not change (its clock is separate)."""
    if watts <= 0:
        raise ShardscopeError(f"--power-limit must be positive watts, got {watts:g}")
    if gpu.tdp_w is None:
        raise ShardscopeError(f"--power-limit needs the GPU's TDP, which the catalog lacks for {gpu.name}")
    share = min(1.0, watts / gpu.tdp_w)
    floor = VOLTAGE_FLOOR_SHARE
    ratio = share ** (1 / 3) if share >= floor else floor ** (1 / 3) * share / floor

    def slowed(fraction: float | None) -> float | None:
        return fraction * ratio if fraction else fraction

    return replace(
        gpu,
        matmul_sustained_fraction=gpu.matmul_sustained_fraction * ratio,
        fp8_matmul_sustained_fraction=slowed(gpu.fp8_matmul_sustained_fraction),
        fp8_cublaslt_matmul_sustained_fraction=slowed(gpu.fp8_cublaslt_matmul_sustained_fraction),
        fp4_matmul_sustained_fraction=slowed(gpu.fp4_matmul_sustained_fraction),
        fp4_grouped_matmul_sustained_fraction=slowed(gpu.fp4_grouped_matmul_sustained_fraction),
        notes=f"{gpu.notes} Power-capped at {watts:g} W (compute clocks x{ratio:.3f}).".strip(),
    )


def make_cluster(
    gpu: GPU | str,
    gpus: int,
    gpus_per_node: int | None = None,
    scaleout_gbps: float | None = None,
    power_limit_w: float | None = None,
) -> Cluster:
    """A homogeneous cluster of `gpus` GPUs, with the GPU's default node and network unless overridden;
    `power_limit_w` caps each GPU's board power (`power_capped`). Clusters are immutable, so one made of
    the same arguments is shared (each estimate makes one; the catalog is read once per process)."""
    return _make_cluster(gpu, gpus, gpus_per_node, scaleout_gbps, power_limit_w)


@lru_cache(maxsize=1024, typed=True)  # typed: gpus=8.0 is not gpus=8
def _make_cluster(
    gpu: GPU | str, gpus: int, gpus_per_node: int | None, scaleout_gbps: float | None, power_limit_w: float | None
) -> Cluster:
    if isinstance(gpu, str):
        gpu = load_gpu(gpu)
    if power_limit_w is not None:
        gpu = power_capped(gpu, power_limit_w)
    if gpus <= 0:
        raise ShardscopeError(f"--gpus must be positive, got {gpus}")
    per_node = gpus_per_node or gpu.gpus_per_node
    if per_node <= 0:
        raise ShardscopeError(f"--gpus-per-node must be positive, got {per_node}")
    if gpus > per_node and gpus % per_node:
        raise ShardscopeError(f"--gpus {gpus} is not a multiple of --gpus-per-node {per_node}")
    domain = max(gpu.scaleup_domain, per_node) if gpu.scaleup_domain > gpu.gpus_per_node else per_node
    return Cluster(
        gpu=gpu,
        gpus=gpus,
        gpus_per_node=per_node,
        scaleup_domain=domain,
        scaleup_gbps=gpu.scaleup_gbps,
        scaleout_gbps=scaleout_gbps if scaleout_gbps is not None else gpu.scaleout_gbps,
    )


def load_cluster_file(path: Path, gpus: int | None = None) -> Cluster:
    """Read a cluster description (YAML or JSON).

    Example::

        gpu: H100               # a catalog name, or a mapping with every GPU field to define a new one
        gpus: 1024
        gpus_per_node: 8
        scaleup_domain: 8       # GPUs per NVLink domain
        scaleup_gbps: 450       # per GPU per direction
        scaleout_gbps: 50       # per GPU per direction (one 400 Gb/s NIC per GPU)
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ShardscopeError(f"cannot read cluster file {path}: {exc.strerror}") from None
    try:
        if str(path).endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is the user's file
        raise ShardscopeError(f"malformed cluster file {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or "gpu" not in data:
        raise ShardscopeError(f"cluster file {path} must be a mapping with at least a 'gpu' key")
    gpu_field: Any = data["gpu"]
    if isinstance(gpu_field, dict):
        names = {f.name for f in fields(GPU)} - {"profile"}  # a profile is given by --profile, not here
        unknown = set(gpu_field) - names
        if unknown:
            raise ShardscopeError(f"cluster file {path}: unknown GPU fields {sorted(unknown)}")
        try:
            gpu = GPU(**{**gpu_field, "aliases": (), "sources": ("user",)})
        except TypeError as exc:
            raise ShardscopeError(f"cluster file {path}: incomplete GPU definition ({exc})") from None
    else:
        gpu = load_gpu(str(gpu_field))
    total = gpus if gpus is not None else data.get("gpus")
    if not isinstance(total, int):
        raise ShardscopeError(f"cluster file {path}: 'gpus' must be an integer (or pass --gpus)")
    cluster = make_cluster(gpu, total, data.get("gpus_per_node"), data.get("scaleout_gbps"))
    keys = ("scaleup_domain", "scaleup_gbps", "scaleup_latency_s", "scaleout_latency_s")
    overrides = {k: data[k] for k in keys if k in data}
    return replace(cluster, **overrides)
