"""The `mpipe` command line: one front for every layer."""
