"""python -m benchmarks [core|mllm|tune|plan|app|executor|profile|memory|worker|all] [--no-torch] [--engine-only] [--no-exact]
python -m benchmarks worker-kill [--times N]   (not part of `all`: ten worker-kill tests beside CPU burners)
python -m benchmarks published   (not part of `all`: the a100 fitted from Korthikanti et al. 2022 Table 4, then Narayanan et al. 2021 Table 1 predicted out of sample)
python -m benchmarks per-batch [--batches N]   (not part of `all`: per_batch against tune's static term, a few minutes)
python -m benchmarks stragglers   (not part of `all`: a 512-rank cluster_step_trace_time.csv imported, its slow cards found)
python -m benchmarks layout [--in-process] [--model TEXT] (not part of `all`: dp and ZeRO-1 layouts' gradient checks, a few minutes)
python -m benchmarks build-memory [--pp 4] [--models builtin,hf]   (not part of `all`: each rank's build memory at pp=1 and pp=4, the built-in MLLM and HF LLaVA from a folder, four launches)
python -m benchmarks comm-timing   (not part of `all`: pp2·dp2 ZeRO-1 communication per kind against the prediction on a loopback-probed preset of this host)
python -m benchmarks grad-check [--seeds N]   (not part of `all`: the gradient check on seeded runs of every schedule family, and its mutations)

Each part prints its own table; `all` runs them in that order (the executor
part launches torchrun: three timed launches and part 1, about ten minutes on an idle 2-core machine; `python -m benchmarks executor --help` for its options; `memory` profiles two models and runs each in one torchrun launch)."""
import sys

PARTS = ("core", "mllm", "tune", "plan", "app", "executor", "profile", "memory", "worker")
ALONE = ("worker-kill", "published", "per-batch", "stragglers", "layout", "build-memory", "grad-check",
         "comm-timing")  # run only when named

which = next((a for a in sys.argv[1:] if not a.startswith("-")), "all")
if which == "all" and {"-h", "--help"} & set(sys.argv[1:]):  # a part's own --help goes to that part
    print(__doc__)
    sys.exit(0)
if which not in PARTS + ALONE + ("all",):
    print(f"error: unknown benchmark '{which}' (choose from {', '.join(PARTS + ALONE)}, all)", file=sys.stderr)
    sys.exit(2)
if which == "published":
    from . import published_bench

    published_bench.main(sys.argv[2:])
    sys.exit(0)
if which == "per-batch":
    from . import per_batch_bench

    per_batch_bench.main(sys.argv[2:])
    sys.exit(0)
if which == "stragglers":
    from . import straggler_bench

    straggler_bench.main(sys.argv[2:])
if which == "layout":
    from . import layout_bench

    layout_bench.main(sys.argv[2:])
if which == "build-memory":
    from . import build_memory_bench

    build_memory_bench.main(sys.argv[2:])
if which == "comm-timing":
    from . import comm_timing_bench

    comm_timing_bench.main(sys.argv[2:])
    sys.exit(0)
if which == "grad-check":
    from . import grad_check_sweep

    grad_check_sweep.main(sys.argv[2:])
    sys.exit(0)
if which == "worker-kill":
    from . import worker_kill_bench

    worker_kill_bench.main(sys.argv[2:])
    sys.exit(0)
flags = [a for a in sys.argv[1:] if a.startswith("-")]
if which in ("core", "all"):
    from . import core_bench

    core_bench.main(flags)
    print()
if which in ("mllm", "all"):
    from . import mllm_suite

    mllm_suite.main(flags)
    print()
if which in ("tune", "all"):
    from . import tune_bench

    tune_bench.main(sys.argv[2:] if which == "tune" else [])
    print()
if which in ("plan", "all"):
    from . import plan_bench

    plan_bench.main(sys.argv[2:])
    print()
if which in ("app", "all"):
    from . import app_bench

    app_bench.main([])
    print()
if which in ("executor", "all"):
    from . import executor_bench

    executor_bench.main(sys.argv[2:] if which == "executor" else [])
    print()
if which in ("profile", "all"):
    from . import profile_bench

    profile_bench.main(sys.argv[2:] if which == "profile" else [])
    print()
if which in ("memory", "all"):
    from . import memory_bench

    memory_bench.main(sys.argv[2:] if which == "memory" else [])
    print()
if which in ("worker", "all"):
    from . import worker_bench

    worker_bench.main(sys.argv[2:] if which == "worker" else [])
