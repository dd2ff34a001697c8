"""The schedule algebra: terms (text, parsed and printed), generators (canonical LLM
schedules), combinators (schedule -> schedule) and `evaluate`, which turns a term and a
workload into a schedule."""
