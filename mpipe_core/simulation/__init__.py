"""Simulation: a schedule on a workload becomes a timeline.  Dataflow (dependencies and
transfers), chunk costs, host contention, the simulator and its fast paths, memory over
time, metrics (makespan, bubbles, lower bound), explanations of a measured gap and the
layout costs the comparison tables show."""
