"""Workloads: what exists and what it costs, independent of any schedule.  The explicit
form (`workload`, `llm`, `encoder`, `hardware`, checked by `fields`, in `units`), the
analytic form from model dimensions and a device (`analytic`, `presets`), the memory
formulas (`memory_model`) and bounded reading of input documents (`inputs`)."""
