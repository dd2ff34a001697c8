"""Example model plug-ins (`mpipe run --model examples.tiny_mllm:build`)."""
