"""`python -m benchmarks plan`: `mpipe plan` at scale, whole process each.

1. the InternVL-26B-class workload (`internvl-26b`) on 512 cloudmatrix384 dies, global batch 512, target <= 60 s;
2. Llama 3.1 405B on 16,384 H100s (dgx-h100), global batch 2,048 (16M tokens of 8,192), target <= 5 min.

3. GPT-3 175B on 64 A100s (dgx-a100), global batch 64, against the layout Narayanan et al. 2021 ran there
   ((t, p) = (8, 8), 1F1B, microbatch 1, every layer recomputed): where that layout ranks among the evaluated.

Each row: wall time, layouts and terms in the space, evaluations (recomp: of them recompute tries), pruned by the
bound and by static memory, left by the time limit, and the best layout.  Then the 512-device table of
the best layout of each encoder strategy (docs/benchmarks.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    ("internvl-26b, 512 x cloudmatrix384, B=512", "internvl-26b", None, 512, 512, "cloudmatrix384", 45, 60),
    ("llama3-405b, 16384 x dgx-h100, B=2048", None, {"model": "llama3-405b", "device": "h100"}, 16384, 2048,
     "dgx-h100", 240, 300),
)


def _run(workload: str, devices: int, batch: int, cluster: str, limit: float) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "mpipe_cli.main", "plan", "-w", workload, "--devices", str(devices),
           "--global-batch", str(batch), "--cluster", cluster, "--time-limit", str(limit), "--top", "5", "--json",
           "--evaluations", str(10**9)]  # the time limit alone bounds it: the targets are times
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"plan failed: {out.stderr.strip().splitlines()[-1]}")
    return wall, json.loads(out.stdout)


def main(argv: list[str]) -> None:
    print("plan benchmark: whole process (python -m mpipe_cli.main plan ... --json); load average at the start "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'case':<44} {'wall s':>7} {'target':>6} {'layouts':>7} {'terms':>7} {'evaluated':>9} {'recomp':>6} "
          f"{'bound':>7} {'memory':>7} {'time':>6}  best")
    for label, preset, doc, devices, batch, cluster, limit, target in CASES:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            if doc is not None:
                json.dump(doc, f)
        try:
            wall, result = _run(preset or f.name, devices, batch, cluster, limit)
        finally:
            os.unlink(f.name)
        s, best = result["searched"], result["best"]
        par = best["parallel"]
        print(f"{label:<44} {wall:>7.1f} {target:>6} {s['layouts']:>7} {s['terms']:>7} {s['evaluated']:>9} "
              f"{s['recompute_tries']:>6} {s['pruned_by_bound']:>7} {s['pruned_by_memory']:>7} {s['not_tried']:>6}  "
              f"tp={par['tp']} cp={par['cp']} pp={best['pp']} dp={par['dp']} mbs={best['microbatch_size']} "
              f"{best['term']}  {best['step_time_s']:.3g} s MFU {best['mfu']:.1%}"
              f"{'' if wall <= target else '  MISS'}")
        if preset == "internvl-26b":
            print("  best of each encoder strategy within the 64 GB cap:")
            for fam, c in sorted(result["best_of_family"].items(), key=lambda kv: kv[1]["step_time_s"]):
                p = c["parallel"]
                print(f"    {fam:<14} {c['step_time_s']:>7.3f} s  MFU {c['mfu']:>6.1%}  tp={p['tp']} cp={p['cp']} "
                      f"pp={c['pp']} dp={p['dp']} mbs={c['microbatch_size']}  {c['term']}")
    _papers_layout()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def _papers_layout() -> None:
    """Plan GPT-3 175B on 64 A100s at batch 64 and rank the paper's own layout among the candidates."""
    from mpipe_core.api import evaluate
    from mpipe_core.search.plan import plan
    from mpipe_core.search.plan_space import Layout, layout_document
    from mpipe_core.workloads.presets import preset_document
    from mpipe_core.workloads.workload import parse_workload

    doc = preset_document("gpt3-175b")
    paper = evaluate("recompute(1f1b(p=8, m=64))",
                     parse_workload(layout_document(doc, Layout(8, 1, 8, 1, 1, False), "dgx-a100"))).step
    t0 = time.perf_counter()
    result = plan(doc, 64, 64, cluster="dgx-a100", top=5, time_limit=30, max_evaluations=None)
    fitting = [c for c in result.candidates if c.within_cap]
    rank = 1 + sum(c.step_time_s < paper.step_time_s for c in fitting)
    best = result.best
    print(f"gpt3-175b, 64 x dgx-a100, B=64 (in process, {time.perf_counter() - t0:.1f} s): best {best.layout.label()} "
          f"{best.term} {best.step_time_s:.3f} s; the paper's layout (t=8, p=8, 1F1B, mbs 1, full recompute) "
          f"{paper.step_time_s:.3f} s ranks {rank} of {len(fitting)} evaluated within the cap")
