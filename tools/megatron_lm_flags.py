"""List every option of Megatron-LM's training argument parser (`megatron/training/arguments.py`).

Run from a Megatron-LM checkout, on CPU, with PyTorch installed:

    PYTHONPATH=. python tools/megatron_lm_flags.py > validation/megatron_lm_flags.txt

The GPU-only packages Megatron imports at module level (Transformer Engine, Triton, Apex, ...) are
stubbed: only the parser is built, nothing runs. `tests/test_planner.py` checks every flag the
Megatron-LM export writes against the list.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import re
import subprocess
import sys
import types
import typing
from pathlib import Path

import torch._inductor.compile_fx  # noqa: F401  (imported before the stubs: PyTorch probes Triton itself)

STUBBED = ("triton", "transformer_engine", "apex", "flash_attn", "nvidia_resiliency_ext", "einops", "wandb")
STUBBED += ("tensorstore", "zarr", "nv_one_logger", "modelopt", "flashinfer", "mamba_ssm", "causal_conv1d")
STUBBED += ("emerging_optimizers", "nvtx", "onnx", "multistorageclient")


class _Anything(type):
    """A class whose every attribute is another such class: enough for module-level uses."""

    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})

    def __iter__(cls):
        return iter(())

    def __call__(cls, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Anything("result", (), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__, module.__spec__, module.__version__ = [], spec, "2.9.0"
        return module

    def exec_module(self, module) -> None:
        pass


def main() -> None:
    sys.meta_path.insert(0, _StubFinder())
    typing.override = getattr(typing, "override", lambda f: f)  # Python 3.12's decorator on 3.11
    sys.argv = sys.argv[:1]
    from megatron.training import arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    source = Path(arguments.__file__).read_text()
    for adder in re.findall(r"parser = (_add_\w+)\(parser\)", source):  # what parse_args() adds
        parser = getattr(arguments, adder)(parser)
    flags = sorted({o for action in parser._actions for o in action.option_strings if o.startswith("--")})
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# Megatron-LM training arguments at NVIDIA/Megatron-LM@{commit or 'unknown'}")
    print("# listed by tools/megatron_lm_flags.py")
    print("\n".join(flags))


if __name__ == "__main__":
    main()
