"""`serve-plan --export ENGINE[@RELEASE]`: a serving plan as the launch commands of that engine release.

Each release the export writes is data (`RELEASES`): its command, the option of each setting, how it runs
several replicas and prefill/decode disaggregation, each with the file of the engine's code that decides it.
Every option and value written is in the release's list `validation/<engine>_serve_flags.txt`, read from
its wheel by `tools/serve_engine_flags.py` (checked by `tests/test_serve_export.py`). A release with no such
list, or one that lacks what the plan needs, is refused in one line rather than written unchecked.

What a plan fixes: TP, EP (= TP within a replica), the replicas and their prefill/decode roles, max running
requests; the token budget and memory share are the engine's defaults the simulation used, written out so
the launch runs what was simulated. Replicas fill nodes in order, TP groups never straddle a node. What only
the user knows is a `FILL IN` placeholder: a model that is not a catalog model with a Hugging Face id, the
node of a multi-node launch, the load balancer or P/D proxy in front of several endpoints.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field

from shardscope.errors import ShardscopeError

FILL_IN = "FILL IN"


@dataclass(frozen=True, slots=True)
class EngineRelease:
    """How one engine release is launched, option by option (each the engine's own spelling)."""

    engine: str
    release: str
    command: tuple[str, ...]  # the launcher, before the model
    model_flag: str  # "" : the model is the first positional argument
    tp: str
    seqs: str
    tokens: str  # the per-iteration token budget (chunked prefill)
    memory: str  # the option of the KV memory rule
    quantization: tuple[str, str]  # (option, value) of FP8 weights
    kv_fp8: tuple[str, str]  # (option, value) of an FP8 KV cache
    port: str
    base_port: int
    host: str = ""
    ep: tuple[str, bool] | None = None  # (option, True: a switch / False: takes the EP size); None: no EP
    dp: str = ""  # the option running several independent replicas in one server; "" : one server a replica
    dp_dense_only: bool = False  # only a dense model's DP ranks are independent replicas
    disagg: str = ""  # how prefill/decode pools are launched: "kv-transfer" | "mode"; "" : not in this release
    # Wide EP (the MoE layers over several replicas' GPUs): the options of one data-parallel server spanning
    # nodes, (ranks on this node, first rank of this node, the head's address, its RPC port, a node that
    # serves no API); () : not written for this release
    wide_ep: tuple[str, ...] = ()
    # (what: options | replicas | ep | disagg, the engine's code that decides it)
    sources: tuple[tuple[str, str], ...] = ()
    missing: dict[str, str] = field(default_factory=dict)  # feature -> why this release cannot write it

    @property
    def label(self) -> str:
        return f"{self.engine}@{self.release}"

    @property
    def flags_file(self) -> str:
        return f"validation/{self.engine}_serve_flags.txt"


RELEASES: dict[str, dict[str, EngineRelease]] = {
    "vllm": {
        "0.33.0": EngineRelease(
            engine="vllm",
            release="0.33.0",
            command=("vllm", "serve"),
            model_flag="",
            tp="--tensor-parallel-size",
            seqs="--max-num-seqs",
            tokens="--max-num-batched-tokens",
            memory="--gpu-memory-utilization",
            quantization=("--quantization", "fp8"),
            kv_fp8=("--kv-cache-dtype", "fp8"),
            port="--port",
            base_port=8000,
            host="--host",
            ep=("--enable-expert-parallel", True),
            dp="--data-parallel-size",
            dp_dense_only=True,
            disagg="kv-transfer",
            wide_ep=(
                "--data-parallel-size-local",
                "--data-parallel-start-rank",
                "--data-parallel-address",
                "--data-parallel-rpc-port",
                "--headless",
            ),  # fmt: skip
            sources=(
                (
                    "options",
                    "vllm/engine/arg_utils.py EngineArgs.add_cli_args, "
                    "vllm/entrypoints/common/cli_args.py make_arg_parser",
                ),
                (
                    "replicas",
                    "vllm/v1/engine/core.py: 'Non-MoE DP ranks are completely independent, so "
                    "treat like DP=1'; a MoE model's DP ranks step together and shard experts across DP x TP, "
                    "so a MoE plan's replicas are separate servers",
                ),
                (
                    "ep",
                    "--enable-expert-parallel with no --data-parallel-size: EP = TP within the replica "
                    "(vllm/engine/arg_utils.py)",
                ),
                (
                    "wide-ep",
                    "--enable-expert-parallel with --data-parallel-size R: the MoE layers over all R x TP GPUs; "
                    "across nodes one server a node, --data-parallel-size-local ranks each, the later nodes "
                    "--headless from --data-parallel-start-rank, all reaching node 0 at --data-parallel-address "
                    "(vllm/engine/arg_utils.py)",
                ),
                (
                    "disagg",
                    "--kv-transfer-config with NixlConnector, kv_role kv_both on both "
                    "pools (vllm/distributed/kv_transfer/kv_connector/factory.py, vllm/config/kv_transfer.py); "
                    "VLLM_NIXL_SIDE_CHANNEL_PORT (vllm/envs.py, default 5600) apart per server on a node",
                ),
            ),
        ),
    },
    "sglang": {
        "0.5.23": EngineRelease(
            engine="sglang",
            release="0.5.23",
            command=("python", "-m", "sglang.launch_server"),
            model_flag="--model-path",
            tp="--tp-size",
            seqs="--max-running-requests",
            tokens="--chunked-prefill-size",
            memory="--mem-fraction-static",
            quantization=("--quantization", "fp8"),
            kv_fp8=("--kv-cache-dtype", "fp8_e4m3"),
            port="--port",
            base_port=30000,
            host="--host",
            ep=("--ep-size", False),
            disagg="mode",
            sources=(
                ("options", "sglang/srt/arg_groups/fields/*.py (ServerArgs namespaces), sglang/srt/server_args.py"),
                (
                    "replicas",
                    "one server per replica (CUDA_VISIBLE_DEVICES, a port each): how --dp-size splits "
                    "--max-running-requests was not read here, so it is not written",
                ),
                (
                    "ep",
                    "--ep-size = --tp-size: the replica's GPUs split the experts "
                    "(sglang/srt/arg_groups/fields/parallel.py)",
                ),
                (
                    "disagg",
                    "--disaggregation-mode prefill|decode (sglang/srt/arg_groups/fields/"
                    "disagg.py), transfer backend mooncake (its default), --disaggregation-bootstrap-port apart "
                    "per prefill server on a node",
                ),
            ),
        ),
    },
}

NOTE_LABELS = {
    "options": "options", "replicas": "replicas", "ep": "expert parallel", "wide-ep": "wide expert parallel",
    "disagg": "P/D disaggregation",
}  # fmt: skip

# Engines whose launch options could not be read from a release here: refused, never written unchecked
UNCHECKED = {
    "trtllm": "TensorRT-LLM's wheels are served only from pypi.nvidia.com (PyPI's tensorrt-llm is a stub that "
    "downloads from there), which could not be reached to read trtllm-serve's options, so no trtllm-serve "
    "command is written",
}


def export_engine(spec: str) -> str:
    """The engine `--export NAME[@RELEASE]` names, if the export writes it."""
    name = (spec or "").strip().lower().partition("@")[0]
    if name in UNCHECKED:
        raise ShardscopeError(f"--export {name}: {UNCHECKED[name]}")
    if name not in RELEASES:
        known = ", ".join([*RELEASES, *UNCHECKED])
        raise ShardscopeError(f"--export must be one of {known} (NAME[@RELEASE]), got {spec!r}")
    return name


def export_release(spec: str, engine_release: str) -> EngineRelease:
    """`NAME[@RELEASE]` of `--export`: a release the export writes. The plan was priced under `engine_release`
    (`vllm@0.33.0`): the export must name that engine, and a release, if named, the one priced."""
    name = export_engine(spec)
    release = spec.strip().lower().partition("@")[2]
    priced_name, _, priced_release = engine_release.partition("@")
    if name != priced_name:
        raise ShardscopeError(
            f"--export {name}: the plans were priced under {engine_release}; search with --engine {name} to "
            f"export {name}"
        )
    release = release or priced_release
    if release not in RELEASES[name]:
        written = ", ".join(RELEASES[name])
        raise ShardscopeError(
            f"--export {name}@{release}: the {name} export is written for release {written} (its options in "
            f"validation/{name}_serve_flags.txt)"
        )
    if release != priced_release:
        raise ShardscopeError(f"--export {name}@{release}: the plans were priced under {engine_release}")
    return RELEASES[name][release]


@dataclass(frozen=True, slots=True)
class Server:
    """One engine server of the launch: where it runs, its role and its command line."""

    role: str  # "serve" | "prefill" | "decode" | "headless" (a node of a data-parallel server serving no API)
    node: int
    devices: tuple[int, ...]  # GPU indices on its node (CUDA_VISIBLE_DEVICES)
    port: int
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]

    def flags(self) -> list[str]:
        return [a for a in self.argv if a.startswith("--")]

    def value(self, flag: str) -> str | None:
        """The value written after `flag` (None: not written; "" : a switch)."""
        if flag not in self.argv:
            return None
        i = self.argv.index(flag) + 1
        return self.argv[i] if i < len(self.argv) and not self.argv[i].startswith("--") else ""


@dataclass(frozen=True, slots=True)
class ServeExport:
    release: EngineRelease
    model: str  # the model argument written: a Hugging Face id or "$MODEL"
    model_known: bool  # False: the model path is a FILL IN placeholder
    nodes: int
    servers: tuple[Server, ...]
    notes: tuple[str, ...]


def serve_launch(result, model: str, plan_index: int = 0) -> ServeExport:
    """The servers that launch plan `plan_index` of a `serve_plan` result (`ServePlanResult`) of `model`
    (the catalog name or config path that was searched), for the engine release the plans were priced under.
    Raises ShardscopeError where that release cannot run the plan."""
    from shardscope.hardware.catalog import make_cluster
    from shardscope.models.catalog import catalog_sources, load_model
    from shardscope.serve.engine import load_engine

    rel = export_release(result.engine.partition("@")[0], result.engine)
    p = result.plans[plan_index]
    spec = load_model(model)
    cluster = make_cluster(result.gpu, p.gpus)
    eng = load_engine(result.engine, cluster.gpu)
    per_node = min(cluster.gpus_per_node, p.gpus)
    if per_node % p.tp:
        raise ShardscopeError(
            f"--export {rel.label}: a TP{p.tp} replica spans nodes of {cluster.gpus_per_node} GPUs; multi-node "
            "TP launches are not written"
        )
    repo = catalog_sources().get(spec.name, {}).get("hf_repo")
    known = bool(repo) and repo != "None"
    model_arg = repo if known else "$MODEL"
    moe = spec.moe is not None
    if p.pp > 1:
        raise ShardscopeError(
            f"--export {rel.label}: a pipelined plan (PP{p.pp}) is not written yet; its `shardscope serve` "
            "command is in the plan"
        )
    if p.ep > p.tp and not rel.wide_ep:
        raise ShardscopeError(
            f"--export {rel.label}: a wide-EP plan (EP{p.ep} over {p.replicas} replicas of TP{p.tp}) is not "
            "written for this engine; its `shardscope serve` command is in the plan"
        )
    if p.ep > 1 and rel.ep is None:
        raise ShardscopeError(f"--export {rel.label}: {rel.missing.get('ep', 'no expert-parallel option')}")
    if p.prefill_replicas and not rel.disagg:
        raise ShardscopeError(f"--export {rel.label}: {rel.missing.get('disagg', 'no prefill/decode disaggregation')}")

    common: list[str] = [rel.tp, str(p.tp)]
    if p.ep > 1:
        flag, switch = rel.ep
        common += [flag] if switch else [flag, str(p.ep)]
    common += [rel.seqs, str(p.max_num_seqs), rel.tokens, str(eng.max_num_batched_tokens)]
    common += [rel.memory, _memory_value(eng, cluster.gpu.hbm_gib)]
    # A checkpoint in the plan's weight format is read as it is stored; a BF16 one the engine quantizes to
    # FP8 as it loads; no engine quantizes to the 4-bit formats while loading
    if result.precision != (spec.weight_format or "bf16"):
        if result.precision != "fp8":
            raise ShardscopeError(
                f"--export {rel.label}: {result.precision} weights load from a checkpoint stored so, and "
                f"{spec.name}'s is {spec.weight_format or 'bf16'}; give that checkpoint's config.json"
            )
        common += list(rel.quantization)
    if result.kv_dtype == "fp8":
        common += list(rel.kv_fp8)
    head = [*rel.command, *([rel.model_flag] if rel.model_flag else []), model_arg]

    replicas_per_node = per_node // p.tp
    roles = ["prefill"] * p.prefill_replicas + ["decode" if p.prefill_replicas else "serve"] * p.decode_replicas
    servers: list[Server] = []
    one_server_per_node = not p.prefill_replicas and rel.dp and (not rel.dp_dense_only or not moe)
    nodes = math.ceil(p.gpus / per_node)
    if p.ep > p.tp:  # one data-parallel server over every replica, a node's ranks each
        servers = _wide_ep_servers(rel, head, common, p.replicas, replicas_per_node, p.tp, nodes)
    elif one_server_per_node:  # the release runs independent replicas under one server: one per node
        for node in range(nodes):
            local = min(replicas_per_node, p.replicas - node * replicas_per_node)
            argv = [*head, *common]
            if local > 1:
                argv[len(head) + 2 : len(head) + 2] = [rel.dp, str(local)]  # after the TP size
            argv += _listen(rel, nodes, rel.base_port)
            devices = tuple(range(local * p.tp))
            servers.append(Server("serve", node, devices, rel.base_port, (), tuple(argv)))
    else:
        for i, role in enumerate(roles):
            node, slot = divmod(i, replicas_per_node)
            devices = tuple(range(slot * p.tp, (slot + 1) * p.tp))
            port = rel.base_port + slot
            argv = [*head, *common, *_role_args(rel, role, slot)]
            argv += _listen(rel, nodes, port)
            env = [("CUDA_VISIBLE_DEVICES", ",".join(map(str, devices)))]
            if rel.disagg == "kv-transfer" and role != "serve":
                env.append(("VLLM_NIXL_SIDE_CHANNEL_PORT", str(5600 + slot)))
                if nodes > 1:
                    env.append(("VLLM_NIXL_SIDE_CHANNEL_HOST", "$NODE_HOST"))
            servers.append(Server(role, node, devices, port, tuple(env), tuple(argv)))
    if p.ep > p.tp:
        wanted = {"options", "wide-ep"}
    else:
        wanted = {"options", *(["replicas"] if p.replicas > 1 else []), *(["ep"] if p.ep > 1 else [])}
    wanted |= {"disagg"} if p.prefill_replicas else set()
    notes = [f"{NOTE_LABELS[what]}: {src}" for what, src in rel.sources if what in wanted]
    return ServeExport(rel, model_arg, known, nodes, tuple(servers), tuple(notes))


def _wide_ep_servers(
    rel: EngineRelease, head: list[str], common: list[str], replicas: int, per_node: int, tp: int, nodes: int
) -> list[Server]:
    """One server a node, together `replicas` data-parallel ranks of TP `tp` whose MoE layers run over all
    their GPUs; node 0 serves the API, the others join it headless."""
    local_flag, start_flag, address_flag, rpc_flag, headless = rel.wide_ep
    servers = []
    for node in range(nodes):
        local = min(per_node, replicas - node * per_node)
        argv = [*head, *common, rel.dp, str(replicas)]
        if nodes > 1:
            argv += [local_flag, str(local), address_flag, "$HEAD_ADDR", rpc_flag, str(WIDE_EP_RPC_PORT)]
        if node:
            argv += [headless, start_flag, str(node * per_node)]
        else:
            argv += _listen(rel, nodes, rel.base_port)
        role, port = ("headless", 0) if node else ("serve", rel.base_port)
        servers.append(Server(role, node, tuple(range(local * tp)), port, (), tuple(argv)))
    return servers


WIDE_EP_RPC_PORT = 13345  # the head's data-parallel RPC port, as vLLM's data-parallel deployment guide uses


def _memory_value(eng, hbm_gib: float) -> str:
    """The engine's KV memory setting as the simulation used it."""
    if eng.memory_rule == "utilization":
        return f"{eng.gpu_memory_utilization:g}"
    if eng.memory_rule == "static_fraction":  # SGLang: (HBM - reserved) / HBM holds weights and KV
        return f"{math.floor((hbm_gib - eng.reserved_gib) / hbm_gib * 1000) / 1000:g}"
    return f"{eng.kv_free_fraction:g}"


def _listen(rel: EngineRelease, nodes: int, port: int) -> list[str]:
    host = [rel.host, "0.0.0.0"] if rel.host and nodes > 1 else []
    return [*host, rel.port, str(port)]


def _role_args(rel: EngineRelease, role: str, slot: int) -> list[str]:
    if role == "serve":
        return []
    if rel.disagg == "kv-transfer":
        config = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        return ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    args = ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake"]
    if role == "prefill":
        args += ["--disaggregation-bootstrap-port", str(8998 + slot)]
    return args


def to_script(launch: ServeExport, header: list[str]) -> str:
    """The launch as a bash script: `header` comment lines, the model, then each node's servers (a
    multi-node launch runs the same script on every node with NODE_RANK set)."""
    rel = launch.release
    lines = ["#!/usr/bin/env bash", *(f"# {h}" for h in header)]
    lines.append(f"# {rel.label}: every option below is in {rel.flags_file}, read from the release's wheel")
    lines += [f"#   {n}" for n in launch.notes]
    lines.append("set -euo pipefail")
    if not launch.model_known:
        lines.append(f'MODEL="${{MODEL:?{FILL_IN}: the model checkpoint (a Hugging Face id or a local path)}}"')
    multi = launch.nodes > 1
    if multi:
        lines.append(f'NODE_RANK="${{NODE_RANK:?{FILL_IN}: this node\'s index, 0 .. {launch.nodes - 1}}}"')
        if any(dict(s.env).get("VLLM_NIXL_SIDE_CHANNEL_HOST") for s in launch.servers):
            lines.append(f'NODE_HOST="${{NODE_HOST:?{FILL_IN}: this node\'s address the other nodes reach}}"')
        if any("$HEAD_ADDR" in s.argv for s in launch.servers):
            lines.append(f'HEAD_ADDR="${{HEAD_ADDR:?{FILL_IN}: node 0\'s address the other nodes reach}}"')
        lines.append('case "$NODE_RANK" in')
    for node in range(launch.nodes):
        on = [s for s in launch.servers if s.node == node]
        indent = "    " if multi else ""
        if multi:
            lines.append(f"  {node})")
        background = len(on) > 1
        for s in on:
            where = f", port {s.port}" if s.port else " (joins node 0's)"
            lines.append(f"{indent}# {s.role} server on GPUs {','.join(map(str, s.devices))}{where}")
            env = " ".join(f"{k}={_word(v)}" for k, v in s.env)
            text = _command(s.argv, indent)
            lines.append(f"{indent}{env + ' ' if env else ''}{text}{' &' if background else ''}")
        if background:
            lines.append(f"{indent}wait")
        if multi:
            lines.append("    ;;")
    if multi:
        lines += ['  *) echo "NODE_RANK must be 0 .. ' + str(launch.nodes - 1) + '" >&2; exit 2 ;;', "esac"]
    lines += _front(launch)
    return "\n".join(lines) + "\n"


def _front(launch: ServeExport) -> list[str]:
    """Comment lines: what fronts several endpoints (not an engine option, so not checked here)."""
    host = (lambda n: f"<node {n} host: {FILL_IN}>") if launch.nodes > 1 else (lambda n: "localhost")
    urls = {role: [f"http://{host(s.node)}:{s.port}" for s in launch.servers if s.role == role]
            for role in ("serve", "prefill", "decode")}  # fmt: skip
    if urls["prefill"]:
        if launch.release.disagg == "kv-transfer":
            return [
                f"# in front ({FILL_IN}): a P/D proxy sending each request to a prefill server, then its KV and the "
                "request to a decode server, e.g. vLLM's tests/v1/kv_connector/nixl_integration/toy_proxy_server.py",
                "#   prefill: " + " ".join(urls["prefill"]),
                "#   decode:  " + " ".join(urls["decode"]),
            ]
        return [
            f"# in front ({FILL_IN}): the SGLang router (package sglang-router, not checked here), e.g.",
            "#   python -m sglang_router.launch_router --pd-disaggregation "
            + " ".join(f"--prefill {u} {b}" for u, b in zip(urls["prefill"], _bootstrap(launch), strict=True))
            + " "
            + " ".join(f"--decode {u}" for u in urls["decode"]),
        ]
    if len(urls["serve"]) > 1:
        return [f"# in front ({FILL_IN}): a load balancer over " + " ".join(urls["serve"])]
    return []


def _bootstrap(launch: ServeExport) -> list[str]:
    return [s.value("--disaggregation-bootstrap-port") or "" for s in launch.servers if s.role == "prefill"]


def _word(arg: str) -> str:
    if arg.startswith("$") and arg[1:].replace("_", "").isalnum():
        return f'"{arg}"'
    return shlex.quote(arg)


def _command(argv: tuple[str, ...], indent: str) -> str:
    """The launcher and model on the first line, then one option and its value per line."""
    parts: list[str] = []
    for arg in argv:
        if arg.startswith("--") or not parts:
            parts.append(_word(arg))
        else:
            parts[-1] += f" {_word(arg)}"
    return f" \\\n{indent}  ".join(parts)


def serve_export(result, spec: str, model: str, plan_index: int = 0) -> str:
    """Plan `plan_index` of `result` as `--export spec`'s launch script."""
    export_release(spec, result.engine)
    launch = serve_launch(result, model, plan_index)
    p = result.plans[plan_index]
    slos = ", ".join(f"{n} p90 {v:,.1f} ms" for n, v in (("TTFT", p.ttft_p90_ms), ("TPOT", p.tpot_p90_ms)))
    layout = f"P:D {p.disaggregate}" if p.disaggregate else f"{p.replicas} replica{'s' * (p.replicas > 1)}"
    header = [
        f"shardscope serve-plan: plan #{plan_index + 1} of {result.model} on {p.gpus}x {result.gpu}: "
        f"TP{p.tp}{f' EP{p.ep}' if p.ep > 1 else ''} x {layout}, max seqs {p.max_num_seqs}, "
        f"{result.precision} weights, KV {result.kv_dtype}",
        f"simulated at Poisson {result.arrivals}: {p.goodput_requests_per_s_per_gpu:,.3f} "
        f"goodput req/s per GPU, {slos}",
        f"as a simulation: {p.serve_command}",
    ]
    return to_script(launch, header)
