"""Searches over the algebra: `tune` (which schedule for one pipeline: the Pareto front of
makespan against memory), its fitting rules (`fit`) and the exact encoder placement of
small instances (`exact`, CP-SAT)."""
