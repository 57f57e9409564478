"""Measure: the structure of any architecture `transformers` can build, read from the model itself.

A config.json whose family has no hand-written adapter (`models.hf`) is built on the meta device by
transformers (no weights, no memory), and its exact parameter count, standard block fields and, per
decoder-layer kind, forward+backward FLOPs, saved-activation bytes and GEMM shapes are measured
(`measure.meta`). The result is cached as JSON keyed by the config's hash (`measure.cache`) and turned
into a ModelSpec (`measure.spec`), whose blocks the op graph prices from what was measured where the
standard fields fall short (`graph.measured`: GEMMs by measured shape, extra or shared norms, the eager
score matrices of unfused attention). Mixture-of-experts blocks are measured through transformers' batched
experts (`measure.meta`). Blocks the standard fields do not describe (Mamba/SSM mixers and the hybrids that
mix them with attention: Jamba, Bamba, Nemotron-H; an attention or an MLP alone) are kinds of their own,
priced wholly from what was measured (`graph.measured.whole_block_group`), and the estimate's warnings
name them.

This module imports neither torch nor transformers: the CLI starts without them, and a cached
measurement is read without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from shardscope.errors import ShardscopeError, warn

__all__ = ["EXTRA", "measured_model", "measurement", "priced_from_measurement", "trusting_remote_code"]

# The optional-dependency group that installs what measuring needs (pyproject.toml).
EXTRA = "measure"

# Whether the user allowed a checkpoint's own modeling code to run (`--trust-remote-code`); off unless the
# CLI (or a caller) turns it on for the call.
_TRUST_REMOTE_CODE: ContextVar[bool] = ContextVar("shardscope_trust_remote_code", default=False)


@contextmanager
def trusting_remote_code(allowed: bool = True) -> Iterator[None]:
    """Within it, a config whose architecture ships as code with the checkpoint may be built."""
    token = _TRUST_REMOTE_CODE.set(allowed)
    try:
        yield
    finally:
        _TRUST_REMOTE_CODE.reset(token)


def remote_code_trusted() -> bool:
    return _TRUST_REMOTE_CODE.get()


def measurement(cfg: dict[str, Any], source_dir: Path | None = None) -> dict[str, Any]:
    """The measurement record of `cfg` (`measure.meta.measure_config`): from the cache, else measured
    (and cached)."""
    from shardscope.measure.cache import load_cached, store

    record = load_cached(cfg)
    if record is None:
        try:
            from shardscope.measure.meta import measure_config
        except ImportError as exc:  # torch or transformers absent: name the extra that installs them
            raise ShardscopeError(
                f"no built-in adapter, and measuring the model transformers builds needs the '{EXTRA}' extra "
                f"({exc.name} is missing): pip install 'shardscope[{EXTRA}]'"
            ) from None
        record = measure_config(cfg, source_dir=source_dir, trust_remote_code=remote_code_trusted())
        store(cfg, record)
    return record


def measured_model(cfg: dict[str, Any], name: str, source_dir: Path | None = None) -> Any:
    """The ModelSpec of `cfg` as transformers builds it, its parameter count exact."""
    from shardscope.measure.spec import spec_from_measurement

    spec = spec_from_measurement(measurement(cfg, source_dir), name)
    warn(
        f"{name}: no adapter for model_type {cfg.get('model_type')!r}; structure measured from "
        f"{spec.measured} on the meta device ({spec.params_total:,} parameters, exact)"
    )
    if text := priced_from_measurement(spec):
        warn(f"{name}: {text}")
    return spec


def priced_from_measurement(spec: Any) -> str:
    """The sentence naming the block kinds priced wholly from their measurement ("" if none)."""
    kinds = spec.layer_kinds()
    parts = [
        f"{b.attention} x{sum(k.attention == b.attention for k in kinds)}" + (" (SSM scan by bytes)" if b.ssm else "")
        for b in spec.whole_blocks
    ]
    if not parts:
        return ""
    return (
        "layer types priced from measurement (measured GEMMs at the GEMM rate, the rest by bytes at HBM "
        f"bandwidth): {', '.join(parts)}"
    )
