"""Interop: PyTorch pipelining CSV, Chrome/Perfetto traces, JSON."""
