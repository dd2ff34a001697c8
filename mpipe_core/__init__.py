"""Mpipe's core: the schedule algebra, workloads, the simulator and metrics.

Pure Python (no torch, Streamlit or database); `mpipe_core.api.evaluate` is the
entry point.  A regular package, not a namespace one, so a checkout's own copy
is the only one that imports.
"""
