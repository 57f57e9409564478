"""Software stacks: what each framework decides for a run (kernels, fusions, overlaps, sharding flavour),
as data files with their sources (`*.yaml` beside this module)."""

from shardscope.stacks.registry import DEFAULT_STACK, STACK_ONLY_KEYS, Stack, list_stacks, load_stack

__all__ = ["DEFAULT_STACK", "STACK_ONLY_KEYS", "Stack", "list_stacks", "load_stack"]
