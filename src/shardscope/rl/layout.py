"""The trainer's and the rollout engines' layouts, parsed as users write them.

Trainer: `"megatron tp1 pp16 ep16"` (a stack from `shardscope stacks` and its parallel sizes) or
`"fsdp 64"` / `"fsdp fsdp64 tp2"` (PyTorch FSDP: every weight sharded over the FSDP group). Rollout:
`"vllm tp32 dp8"` (engine, tensor-parallel size, instances), `"16 x TP16"` (16 instances), `ep` optional.
Megatron carves EP out of data parallelism, so the trainer's GPUs are tp x pp x dp with dp a multiple of ep.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardscope.errors import ShardscopeError, unknown_name
from shardscope.stacks.registry import ALIASES as STACK_ALIASES
from shardscope.stacks.registry import stack_names

# Inference engines whose weight loading `rl.engine` models. A rollout written without an engine is vLLM,
# the engine every published RL weight-sync benchmark we know ran (verl, NeMo-RL, checkpoint-engine).
ENGINES = ("vllm", "sglang")
DEFAULT_ENGINE = "vllm"
FSDP = "fsdp"

_SIZE = re.compile(r"^(tp|pp|ep|dp|fsdp|etp)(\d+)$")


def _sizes(tokens: list[str], text: str, allowed: tuple[str, ...]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for token in tokens:
        m = _SIZE.match(token)
        if not m or m.group(1) not in allowed:
            raise ShardscopeError(f"cannot read {token!r} in layout {text!r} (expected {'/'.join(allowed)}N)")
        value = int(m.group(2))
        if value <= 0:
            raise ShardscopeError(f"{m.group(1)} must be positive in layout {text!r}")
        if m.group(1) in sizes:
            raise ShardscopeError(f"{m.group(1)} given twice in layout {text!r}")
        sizes[m.group(1)] = value
    return sizes


@dataclass(frozen=True, slots=True)
class TrainLayout:
    """Where the trainer's weights live: `stack` and its TP/PP/EP sizes over `dp` data-parallel replicas
    (EP inside DP, Megatron's rule), or an FSDP group of `fsdp` ranks (`stack == "fsdp"`)."""

    stack: str
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    fsdp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.fsdp

    def label(self) -> str:
        if self.stack == FSDP:
            return f"fsdp{self.fsdp}" + (f" tp{self.tp}" if self.tp > 1 else "")
        return f"{self.stack} tp{self.tp} pp{self.pp} ep{self.ep} dp{self.dp}"


@dataclass(frozen=True, slots=True)
class RolloutLayout:
    """`instances` engine instances of `tp` GPUs each; experts sharded over `ep` GPUs of an instance
    (vLLM's expert parallelism runs EP = TP inside an instance; 1: experts TP-sharded instead)."""

    engine: str
    tp: int = 1
    ep: int = 1
    instances: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.instances

    def label(self) -> str:
        return f"{self.engine} tp{self.tp}" + (f" ep{self.ep}" if self.ep > 1 else "") + f" dp{self.instances}"


def parse_train(text: str, gpus: int | None = None) -> TrainLayout:
    """`"megatron tp1 pp16 ep16"` (dp defaults to the smallest that holds ep, or `gpus` / (tp x pp)) or
    `"fsdp 64"`. `gpus`, when given, must equal the layout's GPUs."""
    tokens = text.lower().replace("×", " ").split()
    if not tokens:
        raise ShardscopeError('empty --train layout (e.g. "megatron tp1 pp16 ep16" or "fsdp 64")')
    name = STACK_ALIASES.get(tokens[0], tokens[0])
    if name == FSDP:
        rest = [f"fsdp{t}" if t.isdigit() else t for t in tokens[1:]]
        sizes = _sizes(rest, text, ("fsdp", "tp"))
        tp = sizes.get("tp", 1)
        fsdp = sizes.get("fsdp", (gpus // tp) if gpus else 1)
        layout = TrainLayout(FSDP, tp=tp, fsdp=fsdp)
    else:
        if name not in stack_names():
            if _SIZE.match(name):  # sizes with no stack named: the project's default stack
                name, tokens = "megatron", ["megatron", *tokens]
            else:
                raise unknown_name("training stack", tokens[0], [*stack_names(), FSDP])
        sizes = _sizes(tokens[1:], text, ("tp", "pp", "ep", "dp", "etp"))
        if sizes.get("etp", 1) != 1:
            raise ShardscopeError("expert tensor parallelism (etp > 1) is not modelled; use etp1")
        tp, pp, ep = sizes.get("tp", 1), sizes.get("pp", 1), sizes.get("ep", 1)
        dp = sizes.get("dp") or ((gpus // (tp * pp)) if gpus and gpus % (tp * pp) == 0 else ep)
        if dp % ep:
            raise ShardscopeError(f"--train {text!r}: ep{ep} must divide the data-parallel size dp{dp}")
        layout = TrainLayout(name, tp=tp, pp=pp, ep=ep, dp=dp)
    if gpus is not None and layout.gpus != gpus:
        raise ShardscopeError(f"--train {text!r} uses {layout.gpus} GPUs, not the {gpus} given")
    return layout


def sizes_unstated(text: str) -> bool:
    """Whether a --train layout names a stack that takes TP/PP/EP sizes and states none of them ("megatron",
    "nemo"): FSDP alone is a whole layout (every GPU shards), a Megatron-style stack alone is not."""
    tokens = text.lower().split()
    return len(tokens) == 1 and STACK_ALIASES.get(tokens[0], tokens[0]) in stack_names()


def parse_rollout(text: str, gpus: int | None = None) -> RolloutLayout:
    """`"vllm tp32 dp8"`, `"sglang tp8 ep8"`, `"16 x TP16"` (16 instances) or `"TP8"` (engine: vLLM)."""
    clean = text.lower().replace("×", " x ")
    m = re.match(r"^\s*(\d+)\s*x\s*(.*)$", clean)  # "16 x TP16": instances first
    instances_prefix = int(m.group(1)) if m else None
    tokens = (m.group(2) if m else clean).split()
    if not tokens:
        raise ShardscopeError('empty --rollout layout (e.g. "vllm tp8 dp2")')
    engine = DEFAULT_ENGINE
    if not _SIZE.match(tokens[0]):
        engine, tokens = tokens[0], tokens[1:]
        if engine not in ENGINES:
            raise unknown_name("rollout engine", engine, list(ENGINES))
    sizes = _sizes(tokens, text, ("tp", "ep", "dp"))
    tp = sizes.get("tp", 1)
    ep = sizes.get("ep", 1)
    if ep > 1 and ep != tp:
        raise ShardscopeError(f"--rollout {text!r}: the engines shard experts over their TP ranks (ep = tp)")
    instances = instances_prefix or sizes.get("dp") or ((gpus // tp) if gpus and gpus % tp == 0 else 1)
    layout = RolloutLayout(engine, tp=tp, ep=ep, instances=instances)
    if gpus is not None and layout.gpus != gpus:
        raise ShardscopeError(f"--rollout {text!r} uses {layout.gpus} GPUs, not the {gpus} given")
    return layout
