"""The mutation audit of issue 40: apply each of 13 plausible wrong formulas in the
cluster model and the planner once, run the tests, say which tests fail, revert.

    .venv/bin/python scripts/mutation_audit.py [TEST FILE ...]

(default: the feature and bound tests written for it).  Every mutation must fail at
least one test; one that fails none prints NONE FAILED and the script exits 1.  It
edits the source files in place and restores each with `git checkout` afterwards, so
it refuses to start while any of them has uncommitted changes.  A mutation whose
text is no longer in its file (the formula moved) is reported as such, not applied.
"""
from __future__ import annotations

import re
import subprocess
import sys

MUTATIONS = [
 ("cluster._outermost reversed", "mpipe_core/workloads/cluster.py",
  "def _outermost(levels: set[str]) -> str:\n    for level in reversed(LEVELS):",
  "def _outermost(levels: set[str]) -> str:\n    for level in LEVELS:"),
 ("sp divides norm/dropout-add work by tp twice", "mpipe_core/workloads/transformer_cost.py",
  "hidden = tokens * shape.h / (t if shape.sp else 1)", "hidden = tokens * shape.h / (t * t if shape.sp else 1)"),
 ("GQA ignored in the roofline's QKV GEMM", "mpipe_core/workloads/transformer_cost.py",
  "qkv_n = (h + 2 * shape.kv_width) / t", "qkv_n = 3 * h / t"),
 ("GQA ignored in the CP K/V exchange bytes", "mpipe_core/workloads/layer_comm.py",
  "block = 2 * shape.b * shape.s / c * shape.kv_width / shape.tp * BYTES",
  "block = 2 * shape.b * shape.s / c * shape.h / shape.tp * BYTES"),
 ("DP overlap window counts every microbatch's backward", "mpipe_core/simulation/step_figures.py",
  "if kind in BACKWARD_KINDS and mb == last_mb.get(module) and s * unit < first_backward[d][0]:",
  "if kind in BACKWARD_KINDS and s * unit < first_backward[d][0]:"),
 ("distributed optimizer's Adam not divided by dp*cp", "mpipe_core/simulation/step_figures.py",
  "updated = params / (n if model.distributed_optimizer else 1) + (sharded / n if sharded else 0.0)", "updated = params + (sharded / n if sharded else 0.0)"),
 ("dist-opt bytes per parameter sharded over dp, not dp*cp", "mpipe_core/workloads/analytic.py",
  'per_param = bytes_per_parameter(True, dp * cp, par["distributed_optimizer"])',
  'per_param = bytes_per_parameter(True, dp, par["distributed_optimizer"])'),
 ("gradient sync on dp's link while cp's is slower", "mpipe_core/workloads/step_model.py",
  'links = [group_link(self.cluster, placement, d) for d in ("dp", "cp")]',
  'links = [group_link(self.cluster, placement, d) for d in ("dp",)]'),
 ("devices_total without cp", "mpipe_core/simulation/step_figures.py",
  "devices_total = model.tp * model.cp * model.dp * pp", "devices_total = model.tp * model.dp * pp"),
 ("CP K/V ring never hidden behind attention", "mpipe_core/workloads/analytic.py",
  'cp_e = _exposed(layer_comm.seconds(cp_c), {"F": times.core_f, "B": 2 * times.core_f, "W": 0.0}, True)',
  'cp_e = _exposed(layer_comm.seconds(cp_c), {"F": times.core_f, "B": 2 * times.core_f, "W": 0.0}, False)'),
 ("recomputed forwards' collectives missing from the comm timeline", "mpipe_core/simulation/comm_timeline.py",
  "full = recompute[chunk][0] if kind in (B, BW) else 0", "full = 0"),
 ("sp LM head's F and B collectives swapped", "mpipe_core/workloads/layer_comm.py",
  'return {"F": (all_gather(shape.tp, size, link),), "B": (reduce_scatter(shape.tp, size, link),), "W": ()}',
  'return {"F": (reduce_scatter(shape.tp, size, link),), "B": (all_gather(shape.tp, size, link),), "W": ()}'),
 ("planner's lower bound x 1.1", "mpipe_core/search/plan_space.py",
  "return Bounds((llm + enc) / pp + optimizer, llm, enc, optimizer, static / pp)",
  "return Bounds(((llm + enc) / pp + optimizer) * 1.1, llm, enc, optimizer, static / pp)"),
]
DEFAULT_TESTS = ["tests/mpipe_core/workloads/test_step_model_features.py",
                 "tests/mpipe_core/search/test_plan_bound.py"]


def main(tests: list[str]) -> int:
    files = sorted({path for _, path, _, _ in MUTATIONS})
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *files], capture_output=True, text=True).stdout
    if dirty.strip():
        print(f"error: uncommitted changes in files the audit edits:\n{dirty}", file=sys.stderr)
        return 2
    missed = 0
    for name, path, old, new in MUTATIONS:
        text = open(path, encoding="utf-8").read()
        if text.count(old) != 1:
            print(f"{name}\tNOT APPLIED: the formula is no longer in {path} as written")
            missed += 1
            continue
        open(path, "w", encoding="utf-8").write(text.replace(old, new))
        try:
            run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                                  "--hypothesis-seed=0", *tests], capture_output=True, text=True)
            failed = sorted(set(re.findall(r"^FAILED (\S+?)(?: - |$)", run.stdout, re.M)))
            missed += not failed
            print(f"{name}\t{'; '.join(f.split('::')[-1] for f in failed) or 'NONE FAILED'}", flush=True)
        finally:
            subprocess.run(["git", "checkout", "--", path], check=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DEFAULT_TESTS))
