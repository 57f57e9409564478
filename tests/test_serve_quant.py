"""Weight formats in serving: what a checkpoint states, the bytes a deployment holds, the GEMMs it runs."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import make_cluster
from shardscope.models.catalog import load_model
from shardscope.models.hf import model_from_hf_config
from shardscope.models.quant import WEIGHT_FORMATS, checkpoint_format
from shardscope.serve.cost import Deployment, weights_bytes_per_gpu
from shardscope.serve.estimate import serve_estimate

LLAMA_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
}  # fmt: skip


@pytest.mark.parametrize(
    "quantization_config,expected",
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, ("fp8", False)),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, ("nvfp4", False)),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, ("w4a16", False)),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, ("w4a16", False)),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
                "weights": {"num_bits": 4, "type": "float", "group_size": 16},
                "input_activations": {"num_bits": 4, "type": "float"}}}},
            ("nvfp4", False),
        ),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
                "weights": {"num_bits": 4, "type": "int", "group_size": 128}, "input_activations": None}}},
            ("w4a16", False),
        ),
        ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}, ("mxfp4", True)),
    ],
)  # fmt: skip
def test_a_checkpoints_weight_format_is_read_from_its_config(quantization_config, expected):
    assert checkpoint_format({"quantization_config": quantization_config}) == expected


def test_an_unread_quantization_is_priced_in_the_model_dtype_with_a_warning():
    with pytest.warns(UserWarning, match="quantization_config 'bitsandbytes' is not read"):
        spec = model_from_hf_config({**LLAMA_8B, "quantization_config": {"quant_method": "bitsandbytes"}})
    assert spec.weight_format == ""
    assert model_from_hf_config({**LLAMA_8B, "quantization_config": {"quant_method": "fp8"}}).weight_format == "fp8"


def test_gpt_oss_serves_in_its_mxfp4_checkpoint_and_fits_one_h100():
    """GPT-OSS-120B's checkpoint stores the routed experts in MXFP4 (4.25 bits a weight with the E8M0 scale
    of every 32) and the rest in BF16: about 61 GiB, on one 80 GB GPU as OpenAI's model card says. In BF16
    it would need 218 GiB and does not fit."""
    spec = load_model("gpt-oss-120b")
    assert (spec.weight_format, spec.quantized_experts_only) == ("mxfp4", True)
    cluster = make_cluster("H100", 1)
    experts = spec.moe_layers * spec.moe.experts * spec.expert_params
    d = Deployment(spec, cluster, 1, "mxfp4")
    assert weights_bytes_per_gpu(d) == pytest.approx(experts * 4.25 / 8 + (spec.params_total - experts) * 2)
    assert 60 < weights_bytes_per_gpu(d) / 2**30 < 62
    r = serve_estimate("gpt-oss-120b", gpu="H100", gpus=1, num_prompts=50, input_len=1024, output_len=64)
    assert r.precision == "mxfp4" and r.memory.kv_blocks > 0
    with pytest.raises(ShardscopeError, match="does not fit"):
        serve_estimate("gpt-oss-120b", gpu="H100", gpus=1, precision="bf16", num_prompts=50)


def test_each_format_runs_its_gemms_where_the_gpu_can():
    """NVFP4 is W4A4 on Blackwell's FP4 tensor cores and weight-only BF16 elsewhere; MXFP4 meets MXFP8
    activations on Blackwell; FP8 is weight-only on a GPU without FP8 tensor cores (A100)."""
    spec = load_model("llama3.1-8b")

    def gemm(fmt: str, gpu: str) -> tuple[str, float]:
        return Deployment(spec, make_cluster(gpu, 1), 1, fmt).gemm(experts=False)

    assert gemm("nvfp4", "B200") == ("fp4", 4.5 / 8) and gemm("nvfp4", "H100") == ("bf16", 4.5 / 8)
    assert gemm("mxfp4", "B200") == ("fp8", 4.25 / 8) and gemm("mxfp4", "H100") == ("bf16", 4.25 / 8)
    assert gemm("fp8", "H100") == ("fp8", 1.0) and gemm("fp8", "A100-80GB") == ("bf16", 1.0)
    assert gemm("w4a16", "H100")[0] == "bf16" and gemm("w4a16", "H100")[1] == pytest.approx(4.15625 / 8)


def test_nvfp4_prefills_faster_than_fp8_on_b200_and_holds_half_the_weights():
    kw = dict(gpu="B200", gpus=1, num_prompts=100, input_len=4096, output_len=64)
    fp8 = serve_estimate("llama3.1-70b", precision="fp8", **kw)
    fp4 = serve_estimate("llama3.1-70b", precision="nvfp4", **kw)
    assert fp4.memory.weights_gib < 0.6 * fp8.memory.weights_gib
    assert fp4.prefill_s < 0.8 * fp8.prefill_s
    assert fp4.memory.kv_blocks > fp8.memory.kv_blocks


def test_cli_names_the_weight_formats():
    r = CliRunner().invoke(app, ["serve", "llama3.1-8b", "--gpus", "1", "--precision", "int3"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert all(name in r.output for name in ("auto", *WEIGHT_FORMATS))
