"""Serving: per-iteration costs of an inference engine, KV capacity, and a discrete-event simulator of
continuous batching (`shardscope serve`)."""
