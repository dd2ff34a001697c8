"""Formats in and out: torch's pipelining CSV, Chrome/Perfetto traces, the training stacks'
configs (torchtitan, Megatron, MindSpeed), ASCII Gantt charts, and the readers of
per-rank profiler traces and Megatron's simulator output into timeline records."""
