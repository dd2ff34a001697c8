"""The executor's torch runtime: model, partition, per-rank plan, transport, autograd split, ranks."""
