"""python -m benchmarks published: the `a100` device fitted from a layer profile,
then whole runs predicted from it, out of sample.

1. The fit: `executor.analysis.layer_fit` on Korthikanti et al. 2022, Table 4
   (`examples/layer-profiles/korthikanti2022-table4.json`: one 22B GPT layer
   on a DGX A100, Megatron-LM of 2022, five settings), each cell's error after
   it, and whether the shipped `a100` preset holds what the fit gives.
2. The prediction: Narayanan et al. 2021 ("Efficient Large-Scale Language
   Model Training on GPU Clusters Using Megatron-LM", SC21), Table 1, on the
   shipped `a100` device and `dgx-a100` cluster presets, under the software
   of 2021 (`MEGATRON_2021`).  No row informs any figure of the model.

Every row: GPT with sequence 2048 and vocabulary 51,200 (its embedding tied to
its head, as Megatron's GPT ties them), full recomputation
of every layer, dp = GPUs / (t p), no flash attention (the paper predates
it), Megatron's default rank order.  Settings the table leaves out are the
authors' own, from Megatron-LM's `examples/sc21/run_table_1.sh` (the script
that produced the table): the microbatch size per row and the interleaved
schedule's layers per virtual stage (76B, 145B: 5; 310B: 3; 530B: 1; the
others plain 1F1B).

Predicted TFLOP/s per GPU = the paper's Eq. 3, F = 96 B s l h^2 (1 + s/6h +
V/16lh), over the predicted step time x GPUs (the paper's own way to count).
"""
from __future__ import annotations

from pathlib import Path

from executor.analysis.layer_fit import fit_layer_profile
from mpipe_core.api import evaluate
from mpipe_core.workloads.layer_profile import load_profile
from mpipe_core.workloads.presets import DEVICES

TABLE_4 = Path(__file__).resolve().parent.parent / "examples" / "layer-profiles" / "korthikanti2022-table4.json"
FIT_TARGET = (0.03, 0.06)  # rms, max |error| per cell
ROW_TARGET, MEAN_TARGET = 0.10, 0.05
SEQ, VOCAB = 2048, 51200
# Megatron-LM as it ran Table 1 (mid-2021, `--fp16`; the tree of `examples/sc21`, de7dc40f88),
# stated once for every row: the backward tensor-parallel all-reduce synchronous (the
# asynchronous one and gradient-accumulation fusion came in 83b1e42f30, 2022-02-13; fusion
# for fp16 in 07916bf245, 2022-09-27), each 16-bit weight gradient added to the fp32 one by a
# hook, gradients all-reduced in fp16 (no --accumulate-allreduce-grads-in-fp32), and pipeline
# exchanges synchronous (p2p_communication.py: batch_isend_irecv, a wait on every request,
# then torch.cuda.synchronize()).
MEGATRON_2021 = {"tp_backward_overlap": False, "grad_accumulation_fusion": False, "grad_reduce_fp32": False,
                 "p2p_overlap": False}
# (billions of parameters, heads, hidden, layers, tp, pp, GPUs, batch, published TFLOP/s per GPU,
#  microbatch size, layers per virtual stage or None, DDP) -- Table 1 and run_table_1.sh
ROWS = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, None, "torch"),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, None, "torch"),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, None, "torch"),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, None, "torch"),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, None, "local"),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 5, "local"),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 5, "local"),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 3, "local"),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 1, "local"),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, None, "local"),
]


def row_case(row) -> tuple[str, dict]:
    """The term and the analytic workload of one row."""
    _, heads, h, layers, tp, pp, gpus, batch, _, mbs, per_virtual, ddp = row
    dp = gpus // (tp * pp)
    m = batch // (mbs * dp)
    v = 1 if per_virtual is None else layers // pp // per_virtual
    body = f"1f1b(p={pp}, m={m})" if v == 1 else f"interleaved(p={pp}, m={m}, v={v})"
    doc = {"model": {"hidden": h, "layers": layers, "heads": heads, "seq_len": SEQ, "vocab": VOCAB,
                     "microbatch_size": mbs, "tied_embeddings": True},
           "device": "a100", "cluster": "dgx-a100",
           "parallel": {"tp": tp, "dp": dp, "flash_attention": False, **MEGATRON_2021,
                        "overlap_grad_reduce": ddp == "torch"}}
    return f"recompute({body}, mode=full)", doc


def paper_flops(row) -> float:
    """Eq. 3 of the paper: FLOPs of one iteration, recomputed forward included."""
    _, _, h, layers, _, _, _, batch, *_ = row
    return 96 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))


def predict(row) -> dict:
    """One row on the shipped presets."""
    term, doc = row_case(row)
    step = evaluate(term, doc).step
    tflops = paper_flops(row) / (step.step_time_s * row[6]) / 1e12
    return {"term": term, "step": step, "tflops": tflops, "error": tflops / row[8] - 1}


def fit_table_4():
    """The layer-profile fit on Table 4, printed; (the fit, whether the preset holds it)."""
    fit = fit_layer_profile(load_profile(TABLE_4))
    print("1. The a100 device fitted from Korthikanti et al. 2022, Table 4 (one 22B layer, DGX A100)")
    print(fit.format())
    shipped = {k: DEVICES["a100"].get(k) for k in fit.fitted}
    holds = all(shipped[k] is not None and abs(shipped[k] - v) <= 5e-4 for k, v in fit.fitted.items())
    print(f"summary: Table 4 fit rms {fit.rms:.1%}, max {fit.worst:.1%} "
          f"(target: rms <= {FIT_TARGET[0]:.0%}, max <= {FIT_TARGET[1]:.0%}); the shipped a100 preset "
          + ("holds these fractions" if holds else f"differs: {shipped}"))
    return fit, holds


def main(argv: list[str] | None = None) -> list[dict]:
    fit_table_4()
    print()
    print("2. Out of sample: Narayanan et al. 2021, Table 1, predicted on the shipped a100 + dgx-a100 presets "
          "under Megatron-LM 2021's settings")
    print(f"{'params':>7} {'t':>2} {'p':>3} {'GPUs':>5} {'pred':>6} {'paper':>6} {'error':>7} {'step s':>7}  "
          f"{'compute':>7} {'tp':>6} {'bubble':>6} {'dp':>6} {'optim':>6}  term")
    results = []
    for row in ROWS:
        r = predict(row)
        b = r["step"].breakdown
        print(f"{row[0]:>6}B {row[4]:>2} {row[5]:>3} {row[6]:>5} {r['tflops']:>6.1f} {row[8]:>6} "
              f"{r['error']:>+7.1%} {r['step'].step_time_s:>7.2f}  {b['compute']:>7.2f} {b['tp_comm']:>6.2f} "
              f"{max(b['bubble'], 0.0):>6.2f} {b['dp_comm']:>6.2f} {b['optimizer']:>6.3f}  {r['term']}")
        results.append(r)
    errors = [abs(r["error"]) for r in results]
    within = sum(e <= ROW_TARGET for e in errors)
    print(f"summary: Table 1 out of sample: {within} of {len(errors)} rows within +-{ROW_TARGET:.0%}, "
          f"mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%} "
          f"(target: every row within +-{ROW_TARGET:.0%}, mean <= {MEAN_TARGET:.0%})")
    return results


if __name__ == "__main__":
    main()
