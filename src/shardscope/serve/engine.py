"""Serving engines as data files (`serve/engines/NAME.yaml`): scheduler limits, KV memory rule, CUDA graphs
and host cost, each setting with its source. GPU-dependent defaults (vLLM and SGLang pick their token
budget by GPU memory) are `tiers`, the first that matches the GPU wins."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

from shardscope.errors import ShardscopeError, unknown_name
from shardscope.hardware.catalog import GPU
from shardscope.models.spec import ModelSpec

MEMORY_RULES = ("utilization", "static_fraction", "free_fraction")
KV_ADMISSIONS = ("incremental", "reserve_full")


@dataclass(frozen=True, slots=True)
class Engine:
    """One engine's settings on one GPU kind."""

    name: str
    release: str
    title: str
    policy: str
    chunked_prefill: bool
    kv_admission: str  # "incremental" (blocks as tokens come, preempt when full) | "reserve_full"
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    memory_rule: str  # how the KV pool is sized: one of MEMORY_RULES
    gpu_memory_utilization: float  # "utilization": vLLM's fraction of HBM the engine may use
    reserved_gib: float  # "static_fraction": SGLang's memory kept out of weights + KV
    kv_free_fraction: float  # "free_fraction": TRT-LLM's share of the memory left after weights
    cuda_graph_max_batch: int  # decode-only batches up to this size replay a CUDA graph
    cuda_graph_pool_gib: float
    non_torch_gib: float
    host_s_per_iteration: float
    host_s_per_kernel: float  # the host's time to issue one kernel outside a CUDA graph
    sources: tuple[tuple[str, str], ...]
    # a quantized (FP8 or NVFP4) checkpoint's KV cache is FP8 unless the user says otherwise
    fp8_kv_with_quantized_weights: bool = False
    # a sliding window the config sets for every layer (Mistral's `sliding_window`) is applied; off, the
    # layers attend over the whole context unless the user sets the window (windowed layer kinds of a model
    # built with them, GPT-OSS's or Llama 4's, run as built either way)
    uniform_sliding_window: bool = True
    # the KV blocks a windowed layer no longer reads (before its sliding window or current chunk) go back to
    # the pool, which all layers share; off, every layer holds a request's whole context
    kv_window_freed: bool = False
    # full KV blocks of a prompt prefix another request computed are reused (vLLM's prefix caching, SGLang's
    # radix cache): a request starts from them and holds them shared
    prefix_caching: bool = False
    prefix_cached_at_schedule: bool = False  # a prefix is shared once scheduled (vLLM), not once computed
    # the library the engine's dense per-tensor FP8 GEMMs run in (`CUBLASLT`; "": the kernels the catalog's FP8
    # fraction was measured on), where a GPU measures them apart (`GPU.matmul_fraction`)
    fp8_gemm_library: str = ""

    def serving_model(self, spec: ModelSpec) -> ModelSpec:
        """`spec` as this engine runs it: without its uniform sliding window where the engine leaves it off."""
        if self.uniform_sliding_window or spec.attention_pattern or not spec.attention_window:
            return spec
        return replace(spec, attention_window=0)

    def kv_dtype(self, asked: str, precision: str) -> str:
        """The KV-cache dtype a run gets: as `asked`, or for "auto" the engine's rule for `precision`."""
        if asked != "auto":
            return asked
        return "fp8" if precision in ("fp8", "nvfp4") and self.fp8_kv_with_quantized_weights else "bf16"

    @property
    def label(self) -> str:
        return f"{self.name}@{self.release}"

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "sources"}
        out["sources"] = dict(self.sources)
        return out


@cache
def engine_names() -> tuple[str, ...]:
    files = (resources.files("shardscope.serve") / "engines").iterdir()
    return tuple(sorted(e.name.removesuffix(".yaml") for e in files if e.name.endswith(".yaml")))


@cache
def _engine_file(name: str) -> dict:
    import yaml

    return yaml.safe_load((resources.files("shardscope.serve") / "engines" / f"{name}.yaml").read_text())


def load_engine(spec: str, gpu: GPU) -> Engine:
    """`NAME` or `NAME@RELEASE` (only the shipped release is known) resolved for `gpu`."""
    name, _, release = spec.strip().lower().partition("@")
    if name not in engine_names():
        raise unknown_name("engine", name, list(engine_names()))
    data = _engine_file(name)
    if release and release != str(data["release"]):
        raise ShardscopeError(f"engine {name}: release {release!r} is not known (known: {data['release']})")
    values = {k: v["value"] for k, v in data["settings"].items()}
    sources = {k: v["source"] for k, v in data["settings"].items()}
    for tier in data.get("tiers") or ():
        excluded = tier.get("exclude_name", "") and tier["exclude_name"] in gpu.name.lower()
        if gpu.hbm_gib >= tier["min_hbm_gib"] and not excluded:
            values |= tier["settings"]
            sources |= {k: tier["source"] for k in tier["settings"]}
            break
    if values.get("kv_admission", "incremental") not in KV_ADMISSIONS:
        raise ShardscopeError(f"engine {name}: kv_admission must be one of {', '.join(KV_ADMISSIONS)}")
    if values["memory_rule"] not in MEMORY_RULES:
        raise ShardscopeError(f"engine {name}: memory_rule must be one of {', '.join(MEMORY_RULES)}")
    return Engine(
        name=name,
        release=str(data["release"]),
        title=data["title"],
        policy=values["policy"],
        chunked_prefill=bool(values["chunked_prefill"]),
        kv_admission=str(values.get("kv_admission", "incremental")),
        max_num_batched_tokens=int(values["max_num_batched_tokens"]),
        max_num_seqs=int(values["max_num_seqs"]),
        block_size=int(values["block_size"]),
        memory_rule=values["memory_rule"],
        gpu_memory_utilization=float(values.get("gpu_memory_utilization", 1.0)),
        reserved_gib=float(values.get("reserved_gib", 0.0)),
        kv_free_fraction=float(values.get("kv_free_fraction", 1.0)),
        cuda_graph_max_batch=int(values["cuda_graph_max_batch"]),
        cuda_graph_pool_gib=float(values["cuda_graph_pool_gib"]),
        non_torch_gib=float(values["non_torch_gib"]),
        host_s_per_iteration=float(values["host_s_per_iteration"]),
        host_s_per_kernel=float(values["host_s_per_kernel"]),
        sources=tuple(sorted(sources.items())),
        fp8_kv_with_quantized_weights=bool(values.get("fp8_kv_with_quantized_weights", False)),
        uniform_sliding_window=bool(values.get("uniform_sliding_window", True)),
        kv_window_freed=bool(values.get("kv_window_freed", False)),
        prefix_caching=bool(values.get("prefix_caching", False)),
        prefix_cached_at_schedule=bool(values.get("prefix_cached_at_schedule", False)),
        fp8_gemm_library=str(values.get("fp8_gemm_library", "")),
    )
