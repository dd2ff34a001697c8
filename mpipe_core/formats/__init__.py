"""Formats read and written: other stacks' configs and traces (issue 28 moves export/ here)."""
