"""What every exporter shares: the framework release an export is written for (`ExportTarget`, parsed by the
stack registry), what a launch needs beyond the plan (`Launch`: nodes, GPUs per node, training steps), the
placeholders a user must fill, and the constraint rows that say what a framework release cannot run.

A constraint is data: the test that a plan needs something the framework cannot do, the reason, and the
file in that framework's own code that decides it. The search leaves out the plans that break one
(`SearchSpace.runnable_by`) and the exporters refuse them, so `--export X` never writes what X cannot run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from shardscope.errors import ShardscopeError
from shardscope.models.catalog import catalog_sources
from shardscope.models.spec import ModelSpec
from shardscope.plan.plan import MOMENT_BYTES, Plan
from shardscope.stacks import Stack, load_stack
from shardscope.stacks.registry import _version as release_key
from shardscope.stacks.registry import known_releases

FORMATS = ("torchtitan", "megatron", "deepspeed")
# The releases each exporter writes (the stack file's releases it has been checked against). torchtitan 0.2
# is its last TOML release; 0.3 is configured by `--module M --config F` and `--section.key` overrides.
# Megatron-LM before core 0.12 (the 2021 paper's) predates most of the arguments written.
EXPORT_RELEASES: dict[str, tuple[str, ...]] = {
    "torchtitan": ("0.2", "0.3"),
    "megatron": ("0.12", "0.13", "0.14", "0.15", "0.16"),
    "deepspeed": ("0.14", "0.15", "0.16", "0.17"),
}
# The release of an export that names none: torchtitan's current one (its stack's default prices 0.2, which
# runs alike); the others export the release their stack prices by default.
DEFAULT_RELEASES = {"torchtitan": "0.3"}

# What the user must fill in before a launch: written into every export, never guessed
FILL_IN = "FILL IN"


@dataclass(frozen=True, slots=True)
class ExportTarget:
    """The framework release an export is written for, and the stack that prices the plans it runs."""

    framework: str
    release: str
    stack: Stack

    @property
    def label(self) -> str:
        return f"{self.framework}@{self.release}"


def export_target(spec: str) -> ExportTarget:
    """`NAME[@RELEASE]` (`torchtitan`, `torchtitan@0.2`, `megatron@core_r0.14`, `deepspeed`) as the stack registry
    parses it (aliases, release spellings, the nearest known release with a warning); the release must be one
    the exporter writes."""
    text = (spec or "").strip()
    try:
        stack = load_stack(text)
    except ShardscopeError as exc:
        raise ShardscopeError(f"--export {text}: {exc}") from None
    if stack.name not in FORMATS:
        raise ShardscopeError(f"--export must be one of {', '.join(FORMATS)} (NAME[@RELEASE]), got {spec!r}")
    if "@" not in text and stack.name in DEFAULT_RELEASES:
        stack = load_stack(f"{stack.name}@{DEFAULT_RELEASES[stack.name]}")
    releases = EXPORT_RELEASES[stack.name]
    if stack.release not in releases:
        raise ShardscopeError(
            f"--export {stack.label}: the {stack.name} export is written for releases {', '.join(releases)}"
        )
    return ExportTarget(stack.name, stack.release, stack)


def constraints_target(stack: Stack) -> ExportTarget | None:
    """The exported release whose constraints say what `stack`'s framework can run, for a search priced under
    `stack` without `--export`: its own release where the exporter writes it, else the nearest one written
    (the first at or after it, or the last); None for a framework without an exporter."""
    releases = EXPORT_RELEASES.get(stack.name)
    if not releases:
        return None
    if stack.release in releases:
        return ExportTarget(stack.name, stack.release, stack)
    known = known_releases(stack.name)  # the stack file's releases, oldest first
    at = known.index(stack.release) if stack.release in known else len(known)
    later = [r for r in known[at:] if r in releases]
    release = later[0] if later else releases[-1]
    return ExportTarget(stack.name, release, load_stack(f"{stack.name}@{release}"))


@dataclass(frozen=True, slots=True)
class Launch:
    """What a launch needs besides the plan: the nodes and the processes per node (torchrun's `--nnodes`,
    `--nproc_per_node`), and the optimizer steps that train the token budget (None: a FILL IN placeholder)."""

    nodes: int
    gpus_per_node: int
    steps: int | None = None


def launch_for(plan: Plan, gpus_per_node: int = 8, tokens: float | None = None) -> Launch:
    """The launch of `plan` on nodes of `gpus_per_node` GPUs (fewer GPUs than a node: one node of them),
    training `tokens` in whole steps of global batch x sequence length (rounded up, as `training_cost`)."""
    per_node = min(gpus_per_node, plan.gpus)
    if plan.gpus % per_node:
        raise ShardscopeError(
            f"{plan.gpus} GPUs do not fill whole nodes of {per_node}: a launcher starts the same number of "
            "processes on every node"
        )
    steps = math.ceil(tokens / (plan.global_batch * plan.seq_len)) if tokens else None
    return Launch(plan.gpus // per_node, per_node, steps)


# A plan and the model it runs: what a constraint tests
Check = Callable[[ModelSpec, Plan], bool]


@dataclass(frozen=True, slots=True)
class Constraint:
    """One thing a framework release cannot run. `breaks(model, plan)` is True where the plan needs it;
    `reason` says what (a string, or a function of model and plan for a message naming them); `source` is
    the file in the framework's code that decides it. It holds from release `since` (inclusive, "" = every
    release written) up to `until` (exclusive, "" = still holds). `uniform`: it reads only the model and the
    settings every plan of one search shares (precision, FP8 recipe, kernels, a fixed MoE dispatcher), so a
    search can refuse before it starts rather than exclude every plan."""

    breaks: Check
    reason: str | Callable[[ModelSpec, Plan], str]
    source: str
    since: str = ""
    until: str = ""
    uniform: bool = False

    def holds_at(self, release: str) -> bool:
        v = release_key(release)
        return (not self.since or v >= release_key(self.since)) and (not self.until or v < release_key(self.until))

    def message(self, model: ModelSpec, plan: Plan) -> str:
        reason = self.reason(model, plan) if callable(self.reason) else self.reason
        return f"{reason} ({self.source})"


def moments_note(plan: Plan, framework: str) -> list[str]:
    """Adam moments below fp32 are a Megatron-Core option (precision-aware optimizer) that `framework`
    cannot set from its config: say so rather than export a plan whose state the run would exceed."""
    if plan.optimizer_moments == "fp32":
        return []
    extra = 2 * (MOMENT_BYTES["fp32"] - plan.moment_bytes)  # two moments, m and v
    return [
        f"{plan.optimizer_moments} Adam moments have no {framework} config option: the run keeps fp32 moments "
        f"(+{extra} B/param of optimizer state over this plan) unless the optimizer is swapped in code"
    ]


def hf_repo(model: ModelSpec) -> str | None:
    """The Hugging Face repository of a catalog model (its tokenizer), if it has one."""
    repo = catalog_sources().get(model.name, {}).get("hf_repo")
    return repo if repo and repo != "None" else None


def fill_in(name: str, what: str) -> str:
    """A shell line that takes placeholder `name` from the environment and stops the launch, saying what to
    fill in, where it is unset."""
    return f'{name}="${{{name}:?{FILL_IN}: {what}}}"'


# A comment line of a multi-node launch script
EVERY_NODE = "# run on every node with NODE_RANK (0 .. nodes-1) and MASTER_ADDR (node 0) set"


def torchrun(launch: Launch) -> list[str]:
    """torchrun's launcher arguments for `launch`: one node standalone, else a c10d rendezvous at the first
    node (NODE_RANK and MASTER_ADDR from the environment of each node)."""
    args = ["torchrun", "--nnodes", str(launch.nodes), "--nproc_per_node", str(launch.gpus_per_node)]
    if launch.nodes == 1:
        return [*args, "--standalone"]
    return [*args, "--node_rank", "$NODE_RANK", "--rdzv_backend", "c10d", "--rdzv_endpoint", "$MASTER_ADDR:29500"]


def shell_command(*groups: list[str], indent: str = "  ") -> str:
    """The shell command of `groups` of arguments (launcher, script, options): one option and its values per
    line; `$NAME` placeholders stay expandable (double-quoted), everything else is quoted as the shell needs."""
    lines: list[str] = []
    for group in groups:
        start = len(lines)
        for arg in group:
            word = _shell_word(arg)
            if arg.startswith("--") or len(lines) == start:
                lines.append(word)
            else:
                lines[-1] += f" {word}"
    return f" \\\n{indent}".join(lines)


def _shell_word(arg: str) -> str:
    import shlex

    if arg.startswith("$") and all(c.isalnum() or c in "_:$0123456789" for c in arg[1:]):
        return f'"{arg}"'
    return shlex.quote(arg)
