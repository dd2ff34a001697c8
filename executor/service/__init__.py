"""The executor's service side: queue worker, torchrun launch, timing stream, parent guard, run set-up."""
