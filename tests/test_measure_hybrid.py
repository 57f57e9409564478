"""Measure: hybrid and state-space blocks (Mamba, Mamba-2, Jamba, Nemotron-H, Falcon-H1, Bamba, Zamba2) built by
transformers on the meta device and priced from what was measured (`graph.measured.whole_block_group`); and
the unusual standard blocks (ALiBi, parallel attention + MLP) that the standard fields describe. Tiny
configs: a few layers of width 64, so that each measures in seconds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.costs.memory import rank_params_local
from shardscope.measure import measurement
from shardscope.measure.cache import ENV_DIR
from shardscope.measure.spec import spec_from_measurement
from shardscope.plan.plan import Plan

HAVE_EXTRA = importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("torch") is not None


def _has_class(model_type: str) -> bool:
    if not HAVE_EXTRA:
        return False
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def needs(model_type: str) -> pytest.MarkDecorator:
    """Skip unless the 'measure' extra is installed and its transformers has `model_type`'s class."""
    return pytest.mark.skipif(not _has_class(model_type), reason=f"transformers without {model_type!r}")


# Jamba-v0.1's layout (ai21labs/Jamba-v0.1 config.json: attention every 8th layer from the 5th, MoE every 2nd
# from the 2nd, 16 experts top-2 there) at width 64 and 4 experts.
JAMBA = dict(model_type="jamba", hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
             num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4,
             mamba_expand=2, mamba_dt_rank=4, vocab_size=256, attn_layer_period=8, attn_layer_offset=4,
             expert_layer_period=2, expert_layer_offset=1)  # fmt: skip
MAMBA = dict(model_type="mamba", hidden_size=64, num_hidden_layers=2, vocab_size=256, state_size=8, expand=2,
             conv_kernel=4, time_step_rank=4)  # fmt: skip
MAMBA2 = dict(model_type="mamba2", hidden_size=64, num_hidden_layers=2, vocab_size=256, state_size=16, expand=2,
              head_dim=16, num_heads=8, n_groups=1, chunk_size=64)  # fmt: skip
OTHERS = {
    "nemotron_h": dict(model_type="nemotron_h", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256, ssm_state_size=16,
                       mamba_num_heads=8, mamba_head_dim=16, n_groups=1, chunk_size=64, hybrid_override_pattern="M-M*",
                       head_dim=16),
    "falcon_h1": dict(model_type="falcon_h1", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256, mamba_d_state=16, mamba_n_heads=8,
                      mamba_d_head=16, mamba_n_groups=1, mamba_chunk_size=64, head_dim=16, mamba_expand=2,
                      mamba_d_ssm=128),
    "bamba": dict(model_type="bamba", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256, mamba_d_state=16, mamba_n_heads=8,
                  mamba_d_head=16, mamba_n_groups=1, mamba_chunk_size=64, attn_layer_indices=[2]),
    "zamba2": dict(model_type="zamba2", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=4, vocab_size=256, mamba_d_state=16, mamba_headdim=16,
                   n_mamba_heads=8, mamba_ngroups=1, chunk_size=64, layers_block_type=["mamba", "hybrid"] * 2,
                   attention_head_dim=32),
}  # fmt: skip
SSM = {"jamba": JAMBA, "mamba": MAMBA, "mamba2": MAMBA2, **OTHERS}
# Linear attention and other recurrent or convolutional mixers beside softmax attention.
LINEAR = {
    "qwen3_next": dict(
        model_type="qwen3_next",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        full_attention_interval=4,
    ),
    "minimax": dict(
        model_type="minimax",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        num_local_experts=4,
        num_experts_per_tok=2,
        block_size=64,
    ),
    "lfm2": dict(
        model_type="lfm2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        full_attn_idxs=[1, 3],
    ),
    "recurrent_gemma": dict(
        model_type="recurrent_gemma",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=256,
        lru_width=64,
        attention_window_size=64,
    ),
    "falcon_mamba": dict(
        model_type="falcon_mamba", hidden_size=64, num_hidden_layers=2, vocab_size=256, state_size=8, expand=2
    ),
    "granitemoehybrid": dict(
        model_type="granitemoehybrid",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        mamba_d_state=16,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_chunk_size=64,
        layer_types=["mamba", "attention"] * 2,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=64,
    ),
}
# Standard blocks with an unusual part: ALiBi (BLOOM), parallel attention + MLP (GPT-J; Falcon-7B's one shared
# norm and multi-query attention).
UNUSUAL = {
    "bloom": dict(model_type="bloom", hidden_size=64, n_layer=2, n_head=4, vocab_size=256),
    "gptj": dict(model_type="gptj", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=256, n_positions=512),
    "falcon": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
                   multi_query=True, parallel_attn=True, new_decoder_architecture=False, bias=False),
}  # fmt: skip
FAST = ["--gpu", "H100", "--gpus", "8", "--seq-len", "1024", "--global-batch", "16", "--json"]


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tests of this file measure into one temporary cache folder (each config is measured once)."""
    folder = tmp_path_factory.mktemp("measured")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_DIR, str(folder))
        yield folder


def _file(tmp_path: Path, cfg: dict[str, Any], name: str = "config") -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


def _estimate(path: Path, *args: str) -> Any:
    return CliRunner().invoke(app, ["estimate", str(path), *FAST, *args])


def _meta_params(cfg: dict[str, Any]) -> int:
    """The parameters of the model transformers builds (shared tensors once), counted here afresh."""
    from shardscope.measure.meta import build_meta_model

    return sum(p.numel() for p in build_meta_model(cfg).parameters())


@pytest.mark.parametrize("name", sorted(SSM))
def test_parameter_count_exact(name: str) -> None:
    """The spec's count is the meta model's, and the per-GPU counts of two pipeline stages add up to it."""
    cfg = SSM[name]
    if not _has_class(cfg["model_type"]):
        pytest.skip(f"transformers without {cfg['model_type']!r}")
    spec = spec_from_measurement(measurement(cfg), name)
    assert spec.params_total == _meta_params(cfg)
    assert spec.whole_blocks and any(b.ssm for b in spec.whole_blocks)
    plan = Plan(pp=2, micro_batch=1, global_batch=8, seq_len=1024)
    copy = spec.vocab * spec.hidden if spec.tied_embeddings else 0
    assert sum(sum(rank_params_local(spec, plan, r)) for r in range(2)) == pytest.approx(spec.params_total + copy)


@needs("jamba")
def test_jamba_estimates_and_reports_its_mamba_layers_as_measured(tmp_path: Path) -> None:
    r = _estimate(_file(tmp_path, JAMBA, "jamba"))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["params"]["total"] == _meta_params(JAMBA)
    (said,) = [w for w in out["warnings"] if "priced from measurement" in w]
    # 7 Mamba layers (3 with an MLP, 4 with the experts); the attention layer (with its MLP) is a standard one
    assert "JambaMambaMixer+JambaMLP x3 (SSM scan by bytes)" in said
    assert "JambaMambaMixer+JambaSparseMoeBlock x4 (SSM scan by bytes)" in said
    assert out["step_time_s"] > 0 and out["fits"]
    # the tables say it too
    text = CliRunner().invoke(app, ["estimate", str(tmp_path / "jamba.json"), *FAST[:-1]]).output
    assert "priced from measurement" in " ".join(text.split())
    spec = spec_from_measurement(measurement(JAMBA), "jamba")
    kinds = spec.layer_kinds()
    assert [k.mlp for k in kinds].count("measured") == 7 and kinds[4].attention == "full"
    # the routed experts a token does not reach are not active: 4 layers x 4 experts, top-2
    moe = spec.whole_block(kinds[1])
    assert moe.experts == 4 and spec.params_active == spec.params_total - 4 * moe.expert_params // 2


@needs("mamba")
def test_more_layers_take_more_time(tmp_path: Path) -> None:
    from shardscope import setup
    from shardscope.analytic.step import estimate_step

    times = []
    for layers in (1, 2, 4):
        spec, cluster, plan = setup(_file(tmp_path, MAMBA | {"num_hidden_layers": layers}, f"m{layers}"),
                                    "H100", 8, seq_len=2048, global_batch=64)  # fmt: skip
        times.append(estimate_step(spec, cluster, plan).step_time_s)
    assert times[0] < times[1] < times[2]
    # ... and a deeper Jamba (16 layers: two periods of 8)
    jamba = []
    for layers in (8, 16):
        spec, cluster, plan = setup(_file(tmp_path, JAMBA | {"num_hidden_layers": layers}, f"j{layers}"),
                                    "H100", 8, seq_len=1024, global_batch=16)  # fmt: skip
        jamba.append(estimate_step(spec, cluster, plan).step_time_s)
    assert jamba[0] < jamba[1]


def _counted_flops(cfg: dict[str, Any], seq: int) -> float:
    """FlopCounterMode's forward + backward FLOPs of one block: the whole model's, less its output layer's
    (6·s·vocab·hidden), over its blocks (all of one kind)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from shardscope.measure.meta import build_meta_model

    model = build_meta_model(cfg)
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    emb = model.get_input_embeddings()
    head = 6.0 * seq * emb.num_embeddings * emb.embedding_dim
    return (counter.get_total_flops() - head) / model.config.num_hidden_layers


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_block_flops_are_flop_counter_modes(name: str) -> None:
    """The priced block's FLOPs (forward + backward: its GEMMs and the scan's, which is priced by bytes) are
    FlopCounterMode's count within 1%, at a length other than the measuring ones."""
    from shardscope.graph.build import layer_group

    cfg = SSM[name]
    if not _has_class(cfg["model_type"]):
        pytest.skip(f"transformers without {cfg['model_type']!r}")
    spec = spec_from_measurement(measurement(cfg), name)
    seq = 512
    group = layer_group(spec, Plan(seq_len=seq, micro_batch=1, global_batch=1), kind=spec.layer_kind(0))
    priced = sum(op.flops + op.bwd_flops for op in group.ops)
    assert priced == pytest.approx(_counted_flops(cfg, seq), rel=0.01)
    # the scan is memory-bound: priced by its bytes, its FLOPs carried for the count only
    (scan,) = [op for op in group.ops if "selective scan" in op.name]
    assert scan.kind == "memory" and scan.bytes > 0
    assert {op.kind for op in group.ops} == {"gemm", "memory"}


@needs("jamba")
def test_tensor_parallel_ssm_is_one_line_exit_2(tmp_path: Path) -> None:
    path = _file(tmp_path, JAMBA, "jamba")
    r = _estimate(path, "--tp", "2")
    assert r.exit_code == 2
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    assert "tensor parallelism" in r.output and "JambaMambaMixer" in r.output
    # data parallel with FSDP and pipeline parallel run them
    for args in (["--fsdp"], ["--pp", "2"]):
        r = _estimate(path, *args)
        assert r.exit_code == 0, r.output


@pytest.mark.parametrize("name", sorted(OTHERS) + ["mamba2"])
def test_other_hybrids_estimate(tmp_path: Path, name: str) -> None:
    """Nemotron-H (Mamba-2, MLP-only and attention-only blocks), Falcon-H1 (attention and Mamba-2 in parallel),
    Bamba, Zamba2 (a shared attention block) and Mamba-2 estimate, their measured kinds named."""
    cfg = SSM[name]
    if not _has_class(cfg["model_type"]):
        pytest.skip(f"transformers without {cfg['model_type']!r}")
    r = _estimate(_file(tmp_path, cfg, name))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["params"]["total"] == _meta_params(cfg)
    assert any("priced from measurement" in w and "SSM scan by bytes" in w for w in out["warnings"])
    assert out["step_time_s"] > 0


@needs("falcon_h1")
def test_attention_inside_a_measured_block_is_a_flash_kernel() -> None:
    """Falcon-H1's block runs attention and Mamba-2 side by side: its s² FLOPs become a causal flash kernel."""
    from shardscope.graph.build import layer_group

    spec = spec_from_measurement(measurement(OTHERS["falcon_h1"]), "falcon-h1")
    group = layer_group(spec, Plan(seq_len=1024, micro_batch=1, global_batch=1), kind=spec.layer_kind(0))
    (attn,) = [op for op in group.ops if op.kind == "attention"]
    # eager QK^T and PV over the full square: 4·heads·head_dim per query per key; causal keeps (s+1)/2 keys
    assert attn.flops == pytest.approx(4 * 4 * 16 * 1024 * 1025 / 2, rel=0.01)


@pytest.mark.parametrize("name", sorted(UNUSUAL))
def test_alibi_and_parallel_blocks_estimate(tmp_path: Path, name: str) -> None:
    """BLOOM (ALiBi), GPT-J and Falcon (parallel attention + MLP) are standard blocks: estimated, exact."""
    cfg = UNUSUAL[name]
    if not _has_class(cfg["model_type"]):
        pytest.skip(f"transformers without {cfg['model_type']!r}")
    r = _estimate(_file(tmp_path, cfg, name))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["params"]["total"] == _meta_params(cfg)
    assert not any("priced from measurement" in w for w in out["warnings"])
    spec = spec_from_measurement(measurement(cfg), name)
    assert spec.parallel_block == (name != "bloom") and (spec.position == "alibi") == (name == "bloom")


@pytest.mark.parametrize("name", sorted(LINEAR))
def test_linear_attention_and_recurrent_mixers_estimate(tmp_path: Path, name: str) -> None:
    """Qwen3-Next's gated DeltaNet, MiniMax's lightning attention (the config's "linear_attention" layers),
    LFM2's short convolutions, RecurrentGemma's RG-LRU, Falcon-Mamba, Granite-4 hybrid: estimated from what
    was measured, exact parameters; the softmax-attention blocks among them keep the standard pricing."""
    cfg = LINEAR[name]
    if not _has_class(cfg["model_type"]):
        pytest.skip(f"transformers without {cfg['model_type']!r}")
    r = _estimate(_file(tmp_path, cfg, name))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["params"]["total"] == _meta_params(cfg)
    assert any("priced from measurement" in w for w in out["warnings"])
    spec = spec_from_measurement(measurement(cfg), name)
    if name in ("qwen3_next", "minimax"):  # the linear-attention layers are measured kinds, the full ones not
        kinds = spec.layer_kinds()
        assert {k.mlp for k in kinds} >= {"measured"} and any(k.attention == "full" for k in kinds)
    if name == "minimax":  # measured over one and two of its blocks: linear in the tokens, no s² attention
        (block,) = spec.whole_blocks
        assert block.attention_flops == 0.0
