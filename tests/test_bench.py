"""Speed benchmarks (pytest-benchmark; run with `pytest tests/test_bench.py --benchmark-enable`).
With benchmarks disabled (the default in CI) each runs once as a smoke test."""

import shardscope
from shardscope.validate.runner import run_validation


def test_bench_estimate_405b_16k(benchmark):
    est = benchmark(
        shardscope.estimate,
        "llama3.1-405b",
        gpu="H100",
        gpus=16384,
        tp=8,
        pp=16,
        vpp=4,
        global_batch=2048,
        seq_len=8192,
    )
    assert est.step_time_s > 0


def test_bench_validate_public(benchmark, public_csv):
    report = benchmark(run_validation, public_csv)
    assert report.rows
