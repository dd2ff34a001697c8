"""The MLLM suite: each case under the fused baseline, encoder_stage, transpose
prefix (the reference) and transpose dynamic, with the lower bound."""
from __future__ import annotations

import sys
import time

from mpipe_core.api import evaluate
from mpipe_core.presets import preset_document

SMALL_SEED = {  # the seed paper's small-scale regime: P=4, few microbatches, heavy frozen tower
    "name": "seed-small",
    "llm": {"layers": 8, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.0, "boundary_bytes": 1.0},
    "encoders": [{"name": "vision", "f": 20.0, "trainable": False, "output_bytes": 1.0, "activation": 2.0}],
    "link": {"latency": 0.05, "bandwidth": 20.0},
}

SMALL_ENCODER_HUGE_LLM = {"name": "vit-l+gpt3-175b", "model": "gpt3-175b", "device": "a100",
                          "encoders": [{"name": "vision", "vit": "vit-l-0.3b", "trainable": False}]}

VARIABLE_IMAGES = {"name": "internvl-frozen-1to6-images", "model": "internlm2-20b", "device": "ascend-910c",
                   "encoders": [{"name": "vision", "vit": "intern-vit-6b", "trainable": False,
                                 "images": {"min": 1, "max": 6, "seed": 3}}]}

# (label, workload, p, m, target speedup of the best transpose, or None)
CASES = [
    ("small-scale seed regime (P4 M4, heavy frozen ViT)", SMALL_SEED, 4, 4, 2.70),
    ("512-device stand-in: InternVL-26B trainable (P16 M64)", preset_document("internvl-26b"), 16, 64, 1.21),
    ("Optimus: ViT-22B + GPT-175B (P16 M32)", preset_document("optimus-vit22b-gpt175b"), 16, 32, None),
    ("small encoder, huge LLM: ViT-L + GPT-175B (P8 M32)", SMALL_ENCODER_HUGE_LLM, 8, 32, None),
    ("variable images 1-6/sample: InternVL frozen (P8 M16)", VARIABLE_IMAGES, 8, 16, None),
]


def run_case(workload, p: int, m: int) -> dict:
    base = f"1f1b(p={p}, m={m})"
    terms = {
        "fused": base,
        "encoder_stage": f"encoder_stage({base})",
        "prefix": f"transpose({base})",
        "dynamic": f"transpose({base}, mode=dynamic, backward=owner, shards=4)",
        # the same transpose over a zero-bubble V body: what the algebra reaches
        "dynamic_zbv": f"transpose(zbv(p={p}, m={m}), mode=dynamic, backward=owner, shards=4)",
    }
    out = {}
    for key, term in terms.items():
        ev = evaluate(term, workload)
        out[key] = ev.summary()
    return out


def main(argv: list[str]) -> None:
    print("mllm suite: makespan (speedup vs fused 1F1B baseline); efficiency = lower bound / makespan")
    header = (f"{'case':<56} {'fused':>9} {'enc_stage':>15} {'prefix':>15} {'dynamic':>15} {'LB':>9} {'eff':>5} "
              f"{'dynamic(zbv)':>15} {'LB':>9} {'eff':>5} {'target':>11}")
    print(header)
    effs, effs_zbv = [], []
    for label, workload, p, m, target in CASES:
        print(f"  running {label} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        r = run_case(workload, p, m)
        base = r["fused"]["makespan"]

        def cell(key):
            t = r[key]["makespan"]
            return f"{t:>8.4g} ({base / t:.2f}x)"

        best = min(r[k]["makespan"] for k in ("prefix", "dynamic", "dynamic_zbv"))
        eff = r["dynamic"]["lower_bound"] / r["dynamic"]["makespan"]
        eff_zbv = r["dynamic_zbv"]["lower_bound"] / r["dynamic_zbv"]["makespan"]
        effs.append(eff)
        effs_zbv.append(eff_zbv)
        met = "-" if target is None else (f"{'ok' if base / best >= target else 'MISS'} {target}x")
        print(f"{label:<56} {base:>9.4g} {cell('encoder_stage'):>15} {cell('prefix'):>15} {cell('dynamic'):>15} "
              f"{r['dynamic']['lower_bound']:>9.4g} {eff:>5.2f} {cell('dynamic_zbv'):>15} "
              f"{r['dynamic_zbv']['lower_bound']:>9.4g} {eff_zbv:>5.2f} {met:>11}")
        print(f"  ({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)
    print(f"mean efficiency over the suite: transpose dynamic on 1F1B {sum(effs) / len(effs):.2f}, "
          f"on ZBV {sum(effs_zbv) / len(effs_zbv):.2f}")
