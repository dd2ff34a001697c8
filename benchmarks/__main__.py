"""python -m benchmarks [core|mllm|all] [--no-torch]"""
import sys

from . import core_bench, mllm_suite

which = next((a for a in sys.argv[1:] if not a.startswith("-")), "all")
if which in ("core", "all"):
    core_bench.main(sys.argv[1:])
    print()
if which in ("mllm", "all"):
    mllm_suite.main(sys.argv[1:])
