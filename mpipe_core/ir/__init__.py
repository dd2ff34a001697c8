"""The schedule IR: an op `(module, kind, chunk, microbatch)`, a schedule (a placement and
one order of ops per device), and the timeline records a run or a simulation produces.
Imports nothing of the core but its errors."""
