"""List the options a serving engine release's launch command accepts, read from its wheel's source.

The engines are far too heavy to install for a check (vLLM's wheel is 336 MB with CUDA kernels), so the
argument-parser source files are read straight out of the wheel (a zip) and parsed with `ast`; nothing of the
engine is imported or run. `tests/test_serve_export.py` checks every flag and value that
`shardscope serve-plan --export` writes against the lists. Run from the repository root:

    pip download --no-deps vllm==0.33.0 -d /tmp/wheels
    python tools/serve_engine_flags.py vllm /tmp/wheels/vllm-0.33.0-*.whl > validation/vllm_serve_flags.txt
    pip download --no-deps sglang==0.5.23 -d /tmp/wheels
    python tools/serve_engine_flags.py sglang /tmp/wheels/sglang-0.5.23-*.whl > validation/sglang_serve_flags.txt

The output: a header naming the release, the wheel and the files read; one option per line (`--name`);
then `values KEY: V1 V2 ...` lines, the accepted values of a few options and of vLLM's KV-transfer config.

How each engine declares its options:
  vLLM   `vllm serve` builds its parser in `make_arg_parser` (vllm/entrypoints/common/cli_args.py): a few
         `add_argument` calls, the frontend dataclasses' fields (`--field-name`, bool fields also
         `--no-field-name`), then `EngineArgs.add_cli_args` (vllm/engine/arg_utils.py), one `add_argument`
         per option. Values: `CacheDType` (vllm/config/cache.py), `QuantizationMethods`
         (vllm/model_executor/layers/quantization/__init__.py), `KVRole` and the `KVTransferConfig`
         fields (vllm/config/kv_transfer.py), the connectors registered in
         vllm/distributed/kv_transfer/kv_connector/factory.py.
  SGLang `python -m sglang.launch_server` parses `ServerArgs.add_cli_args` (sglang/srt/server_args.py): the
         namespace fields of sglang/srt/arg_groups/fields/*.py annotated `A[T, "help"]` or `A[T, Arg(...)]`
         (`--field-name`, or `Arg(cli_name=...)`, plus `Arg(aliases=[...])`; `Arg(no_cli=True)` skipped),
         then a few literal `add_argument` calls. Values: `Arg(choices=...)` (a list, or a name of
         sglang/srt/arg_groups/choices.py) or a `Literal[...]` type.
"""

from __future__ import annotations

import ast
import re
import sys
import zipfile
from pathlib import Path

VLLM_FILES = {
    "parser": ("vllm/entrypoints/common/cli_args.py", "vllm/engine/arg_utils.py"),
    "cache": "vllm/config/cache.py",
    "quantization": "vllm/model_executor/layers/quantization/__init__.py",
    "kv_transfer": "vllm/config/kv_transfer.py",
    "factory": "vllm/distributed/kv_transfer/kv_connector/factory.py",
}
SGLANG_FIELDS = "sglang/srt/arg_groups/fields/"
SGLANG_FILES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/choices.py")


def _flags_of_add_argument(tree: ast.AST) -> set[str]:
    """Every `--option` string literal passed positionally to an `add_argument` call."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
                    out.add(a.value)
    return out


def _literal_strings(node: ast.AST | None) -> list[str]:
    """The strings of `Literal["a", "b", ...]` (nested Literals and unions flattened)."""
    if node is None:
        return []
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _module_assign(tree: ast.Module, name: str) -> ast.AST | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            return node.value
    return None


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(cls: ast.ClassDef) -> list[ast.AnnAssign]:
    return [n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def _is_bool(annotation: ast.AST) -> bool:
    return isinstance(annotation, ast.Name) and annotation.id == "bool"


def vllm_lists(z: zipfile.ZipFile) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(flags, values, files read) of `vllm serve`."""
    read: list[str] = []

    def parse(path: str) -> ast.Module:
        read.append(path)
        return ast.parse(z.read(path).decode())

    cli_path, engine_path = VLLM_FILES["parser"]
    cli, engine = parse(cli_path), parse(engine_path)
    flags = _flags_of_add_argument(cli) | _flags_of_add_argument(engine)
    for name in ("BaseFrontendArgs", "FrontendArgs"):  # FrontendArgs.add_cli_args: one option per field
        for f in _fields(_class(cli, name)):
            flag = "--" + f.target.id.replace("_", "-")
            flags.add(flag)
            if _is_bool(f.annotation):  # vLLM's get_kwargs gives bool fields BooleanOptionalAction
                flags.add("--no-" + flag[2:])
    values: dict[str, list[str]] = {}
    values["--kv-cache-dtype"] = _literal_strings(_module_assign(parse(VLLM_FILES["cache"]), "CacheDType"))
    quant = parse(VLLM_FILES["quantization"])
    values["--quantization"] = _literal_strings(_module_assign(quant, "QuantizationMethods"))
    kv = parse(VLLM_FILES["kv_transfer"])
    values["kv_role"] = sorted(set(_literal_strings(_module_assign(kv, "KVProducer"))) | set(
        _literal_strings(_module_assign(kv, "KVConsumer"))
    ))  # fmt: skip
    values["kv_transfer_config"] = [f.target.id for f in _fields(_class(kv, "KVTransferConfig"))]
    factory = parse(VLLM_FILES["factory"])
    values["kv_connector"] = sorted(
        node.args[0].value
        for node in ast.walk(factory)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "register_connector"
        and node.args and isinstance(node.args[0], ast.Constant)
    )  # fmt: skip
    return sorted(flags), values, read


def _arg_meta(annotation: ast.AST) -> tuple[ast.AST | None, ast.AST | None]:
    """(type, metadata) of `A[T, meta]` / `Annotated[T, meta]`, else (None, None)."""
    if not (isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", "") in ("A", "Annotated")):
        return None, None
    elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    return (elts[0], elts[1]) if len(elts) >= 2 else (elts[0], None)


def sglang_lists(z: zipfile.ZipFile) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(flags, values, files read) of `python -m sglang.launch_server`."""
    read: list[str] = []

    def parse(path: str) -> ast.Module:
        read.append(path)
        return ast.parse(z.read(path).decode())

    server, choices = (parse(p) for p in SGLANG_FILES)
    flags = _flags_of_add_argument(server)
    values: dict[str, list[str]] = {}
    field_files = sorted(n for n in z.namelist() if n.startswith(SGLANG_FIELDS) and n.endswith(".py"))
    for path in field_files:
        for cls in (n for n in parse(path).body if isinstance(n, ast.ClassDef)):
            for f in _fields(cls):
                typ, meta = _arg_meta(f.annotation)
                if meta is None:
                    continue  # no CLI metadata: not registered (add_cli_args_from_dataclass)
                kw = {k.arg: k.value for k in meta.keywords} if isinstance(meta, ast.Call) else {}
                if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
                    continue
                name = kw["cli_name"].value if "cli_name" in kw else "--" + f.target.id.replace("_", "-")
                aliases = [e.value for e in getattr(kw.get("aliases"), "elts", [])]
                flags.update([name, *aliases])
                if "choices" in kw:
                    node = kw["choices"]
                    if isinstance(node, ast.Name):
                        node = _module_assign(choices, node.id)
                    vals = _literal_strings(node)
                else:
                    is_literal = any(isinstance(n, ast.Name) and n.id == "Literal" for n in ast.walk(typ))
                    vals = _literal_strings(typ) if is_literal else []
                if vals:
                    values[name] = vals
    return sorted(flags), values, read


ENGINES = {
    "vllm": ("vLLM", "vllm serve", vllm_lists),
    "sglang": ("SGLang", "python -m sglang.launch_server", sglang_lists),
}


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in ENGINES:
        sys.exit(f"usage: python tools/serve_engine_flags.py {{{','.join(ENGINES)}}} WHEEL")
    engine, wheel = argv[0], Path(argv[1])
    title, command, lister = ENGINES[engine]
    release = re.match(rf"{engine}-([^-]+)-", wheel.name)
    if release is None:
        sys.exit(f"{wheel.name}: not a {engine} wheel (NAME-RELEASE-...whl)")
    with zipfile.ZipFile(wheel) as z:
        flags, values, read = lister(z)
    print(f"# {title} {release.group(1)} `{command}` options, read from {wheel.name}:")
    for path in read:
        print(f"#   {path}")
    print("# listed by tools/serve_engine_flags.py")
    print("\n".join(flags))
    for key in sorted(values):
        print(f"values {key}: {' '.join(values[key])}")


if __name__ == "__main__":
    main(sys.argv[1:])
