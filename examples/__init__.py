"""Example model plug-ins (`mpipe run --model examples.tiny_mllm:build`; registered
as `tiny-mllm` by mpipe's own `mpipe.models` entry point, so a queued run names
it `-o model=tiny-mllm`)."""
