"""Benchmarks: `python -m benchmarks [core|mllm|all]` prints tables (see README)."""
