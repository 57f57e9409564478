"""Pipeline layouts: how many decoder layers each model chunk holds.

Accepts Megatron-Core's `--pipeline-model-parallel-layout` string (virtual stages separated by `|`;
`E` embedding, `t` a transformer layer, `m` an MTP module, `L` the loss; `x*N` and `(...)*N` repeat),
e.g. DeepSeek-V3 on PP16: `Et*4|(t*4|)*14tmL`, or a plain comma-separated list of layer counts.
Chunks are in Megatron's order: chunk c runs on pipeline rank c mod pp. The MTP modules may sit in a chunk
of their own ahead of the loss (`...|m|L`): that chunk runs their blocks, the loss chunk their output layers.
"""

from __future__ import annotations

import re

from shardscope.errors import ShardscopeError

_REPEAT_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_REPEAT_ONE = re.compile(r"([EtmL])\*(\d+)")


def _expand(text: str) -> str:
    while "(" in text:
        expanded = _REPEAT_GROUP.sub(lambda m: m.group(1) * int(m.group(2)), text)
        if expanded == text:
            raise ShardscopeError(f"--pp-layout {text!r}: unbalanced parentheses or a group without *N")
        text = expanded
    return _REPEAT_ONE.sub(lambda m: m.group(1) * int(m.group(2)), text)


def _chunks(text: str) -> list[str] | None:
    """The layout's chunks as symbol strings (None for a list of counts), checked."""
    text = text.replace(" ", "")
    if re.fullmatch(r"\d+(,\d+)*", text):
        return None
    bad = set(text) - set("EtmL|()*0123456789")
    if bad or set(_expand(text)) - set("EtmL|"):
        raise ShardscopeError(
            f"--pp-layout {text!r}: unknown symbol(s) {''.join(sorted(bad)) or '*'}; use E, t, m, L, |, x*N, "
            "(...)*N or comma-separated layer counts"
        )
    chunks = _expand(text).split("|")
    if any("E" in c for c in chunks[1:]) or chunks[0].count("E") > 1:
        raise ShardscopeError(f"--pp-layout {text!r}: the embedding (E) must be in the first chunk only")
    if any("L" in c for c in chunks[:-1]):
        raise ShardscopeError(f"--pp-layout {text!r}: the loss (L) must be in the last chunk")
    with_mtp = [i for i, c in enumerate(chunks) if "m" in c]
    after_mtp = chunks[with_mtp[0] + 1 :] if with_mtp else []
    if len(with_mtp) > 1 or any("t" in c for c in after_mtp):
        raise ShardscopeError(
            f"--pp-layout {text!r}: the MTP modules (m) must share one chunk after the last transformer layer"
        )
    return chunks


def read_pp_layout(text: str) -> tuple[tuple[int, ...], int]:
    """Decoder layers per model chunk from a Megatron layout string or a list of counts, and the chunk
    that holds the MTP modules (`m`); -1 (the last chunk, with the loss) when it names none."""
    chunks = _chunks(text)
    if chunks is None:
        return tuple(int(n) for n in text.replace(" ", "").split(",")), -1
    return tuple(c.count("t") for c in chunks), next((i for i, c in enumerate(chunks) if "m" in c), -1)


def format_pp_layout(counts: tuple[int, ...], mtp_layers: int = 0, mtp_chunk: int = -1) -> str:
    """Megatron-Core's layout string for `counts` layers per chunk (embedding first, the loss last, the
    MTP modules in `mtp_chunk`, by default the last)."""

    def layers(n: int) -> str:
        return "t" * n if n <= 2 else f"t*{n}"

    chunks = [layers(n) for n in counts]
    chunks[0] = "E" + chunks[0]
    chunks[mtp_chunk] += "m" * mtp_layers
    chunks[-1] += "L"
    return "|".join(chunks)
