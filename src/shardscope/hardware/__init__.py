"""GPUs and clusters: datasheet peaks, memory, and the two-level network."""

from shardscope.hardware.catalog import GPU, Cluster, list_gpus, load_cluster_file, load_gpu, make_cluster

__all__ = ["GPU", "Cluster", "list_gpus", "load_cluster_file", "load_gpu", "make_cluster"]
