"""The serving GPUs of the catalog (issue 47): each loads with the peaks, memory and links its datasheet
gives ([nv-l40s], [nv-ada], [nv-gh200], [nv-rtx-blackwell], [nv-fp4] in gpus.yaml), and a PCIe-only GPU's
tensor-parallel collectives run over PCIe through the host, slower than NVLink for the same bytes."""

import pytest

from shardscope.costs.comm import SCALEUP_EFFICIENCY, bus_bandwidth_gbps, collective_time_s, place_group
from shardscope.errors import ShardscopeError
from shardscope.hardware.catalog import load_gpu, make_cluster

# name: (bf16 dense, fp8 dense, fp4 dense, usable GiB, memory GB/s, SMs, scale-up GB/s per direction, domain)
CITED = {
    "L40S": (362, 733, None, 46068 / 1024, 864, 142, 32, 1),
    "RTX-4090": (165.2, 330.3, None, 24564 / 1024, 1008, 128, 32, 1),
    "RTX-PRO-6000": (503.8, 1007.6, 2000, 97887 / 1024, 1597, 188, 64, 1),
    "GH200": (989, 1979, None, 97871 / 1024, 4000, 132, 450, 1),
    "GH200-144GB": (989, 1979, None, 146831 / 1024, 4900, 132, 450, 1),
}


@pytest.mark.parametrize("name", sorted(CITED))
def test_serving_gpu_loads_with_cited_figures(name):
    bf16, fp8, fp4, gib, gbps, sms, up, domain = CITED[name]
    g = load_gpu(name)
    assert (g.bf16_tflops, g.fp8_tflops, g.fp4_tflops) == (bf16, fp8, fp4)
    assert g.hbm_gib == pytest.approx(gib, abs=0.05)
    assert (g.hbm_gbps, g.sms, g.scaleup_gbps, g.scaleup_domain) == (gbps, sms, up, domain)
    assert g.sources and g.tdp_w and 0 < g.matmul_sustained_fraction < g.matmul_burst_fraction < 1


@pytest.mark.parametrize(
    "marketing,canonical",
    [
        ("L40S", "L40S"),
        ("NVIDIA L40S", "L40S"),
        ("GH200 480GB", "GH200"),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"),
    ],
)
def test_serving_gpu_marketing_names(marketing, canonical):
    assert load_gpu(marketing).name == canonical


def test_gh200_is_h100_compute_with_c2c_host_link():
    gh, h100 = load_gpu("GH200"), load_gpu("H100")
    assert gh.arch == "hopper" and gh.peak_tflops("bf16") == h100.peak_tflops("bf16")
    assert gh.peak_tflops("fp8") == h100.peak_tflops("fp8")
    assert gh.pcie_gbps == 450 and gh.host_memory_gib == 480  # NVLink-C2C each way, 480 GB LPDDR5X


@pytest.mark.parametrize("name,fp4", [("B200", 9000), ("GB200", 10000), ("B300", 13500), ("GB300", 15000)])
def test_blackwell_fp4_dense_peaks(name, fp4):
    g = load_gpu(name)
    assert g.fp4_tflops == fp4 and g.peak_tflops("fp4") == fp4
    assert g.fp4_tflops >= 2 * g.fp8_tflops  # FP4 at least doubles FP8


def test_no_fp4_on_hopper():
    with pytest.raises(ShardscopeError, match="no FP4"):
        load_gpu("H100").peak_tflops("fp4")


@pytest.mark.parametrize("pcie,nvlink", [("L40S", "H100"), ("RTX-PRO-6000", "B200"), ("RTX-4090", "A100-80GB")])
def test_tp_collective_over_pcie_is_slower_than_nvlink(pcie, nvlink):
    nbytes = 64 * 2**20  # one TP all-reduce of a 64 MiB activation
    times = {}
    for name in (pcie, nvlink):
        cluster = make_cluster(name, 8)
        group = place_group(cluster, 8, 1)  # TP 8 inside one node
        assert group.intra  # through the node's own link, never the NIC
        bw = bus_bandwidth_gbps(cluster, group)
        assert bw == pytest.approx(load_gpu(name).scaleup_gbps * SCALEUP_EFFICIENCY)
        times[name] = collective_time_s(cluster, "all_reduce", nbytes, group)
    assert times[pcie] > 5 * times[nvlink]
    # the PCIe path is the x16 host link: Gen4 32 GB/s, Gen5 64 GB/s per direction, 80% achieved
    assert bus_bandwidth_gbps(make_cluster(pcie, 8), place_group(make_cluster(pcie, 8), 8, 1)) <= 64 * 0.8
