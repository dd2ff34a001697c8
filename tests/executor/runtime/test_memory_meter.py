"""The memory meter counts what autograd saves for backward, by storage, for as
long as autograd keeps it; and a rank's static memory is its parts' parameters,
gradients and optimizer state."""
import gc

import torch
from executor_matrix import TEXT, job

from executor.runtime.memory_meter import MemoryMeter, storage_bytes, tensors_in
from executor.runtime.rank import run_local

FLOAT = 4


def test_saved_inputs_and_outputs_are_counted_until_the_backward_frees_them():
    x = torch.randn(100, requires_grad=True)
    meter = MemoryMeter()
    with meter.recording():
        y = torch.exp(x)  # saves its output: 400 bytes
        z = (y * x).sum()  # saves y (the same storage: not again) and x: 400 more
        assert meter.live == 2 * 100 * FLOAT
        torch.autograd.grad(z, [x])  # no retain_graph: released as the nodes run
    assert (meter.live, meter.peak) == (0, 2 * 100 * FLOAT)


def test_a_kept_graph_holds_its_saved_tensors_until_it_is_dropped():
    x = torch.randn(50, requires_grad=True)
    meter = MemoryMeter()
    with meter.recording():
        z = torch.exp(x).sum()
        torch.autograd.grad(z, [x], retain_graph=True)
    assert meter.live == 50 * FLOAT
    del z
    gc.collect()  # not needed (no cycle), but a cycle would show here
    assert meter.live == 0


def test_views_of_one_storage_count_once_and_parameters_never():
    w = torch.nn.Parameter(torch.randn(10, 10))
    x = torch.randn(4, 10, requires_grad=True)
    meter = MemoryMeter()
    meter.set_static([w])
    with meter.recording():
        # matmul saves x and w (excluded); the two halves of x are views of one storage
        y = (x @ w).sum() + (x[:2] * x[2:]).sum()
    assert meter.live == 4 * 10 * FLOAT
    del y
    assert meter.live == 0


def test_a_hold_counts_until_released_and_labels_the_peak():
    meter = MemoryMeter()
    meter.label = "llm:0F0"
    t = torch.zeros(8)
    handle = meter.hold(t)
    again = meter.hold(t[:4])  # the same storage
    assert (meter.live, meter.peak_at) == (8 * FLOAT, "llm:0F0")
    meter.label = "llm:0BW0"
    handle.release()
    assert meter.live == 8 * FLOAT  # still held by the view
    del again
    assert (meter.live, meter.peak, meter.peak_at) == (0, 8 * FLOAT, "llm:0F0")


def test_context_storages_are_left_out_for_the_step():
    ctx = {"masks": [torch.ones(16)], "rope": (torch.ones(8), torch.ones(8))}
    assert len(list(tensors_in(ctx))) == 3
    x = torch.randn(16, requires_grad=True)
    counts = []
    for leave_out in (False, True):
        meter = MemoryMeter()
        if leave_out:
            meter.exclude(tensors_in(ctx), step=True)
        with meter.recording():
            y = (torch.exp(x) * ctx["masks"][0]).sum()  # saves exp's output, and the mask (context)
        counts.append(meter.live)
        del y
    assert counts == [2 * 16 * FLOAT, 16 * FLOAT]
    meter.new_step()  # the next step's context may reuse the addresses: counted again
    with meter.recording():
        y = (torch.exp(x) * ctx["masks"][0]).sum()
    assert meter.live == 2 * 16 * FLOAT


def test_a_rank_measures_its_parts_parameters_gradients_and_optimizer_state():
    from executor.runtime.models.builtin import BuiltinModel

    (result,) = run_local([job("1f1b(p=2, m=4)", TEXT)], 2)
    model = BuiltinModel(TEXT)
    first = [model.embedding] + list(model.layers[:4])
    last = list(model.layers[4:]) + [model.head]
    for rank, parts in ((0, first), (1, last)):
        params = storage_bytes(p for m in parts for p in m.parameters())
        got = result.memory[rank]
        # every parameter trains: one gradient and one SGD momentum buffer each
        assert (got["parameters"], got["gradients"], got["optimizer"]) == (params, params, params)
        assert got["static"] == 3 * params and got["activation_peak"] > 0
    # 1F1B: rank 0 holds two microbatches at its peak, at the end of its second forward
    assert result.memory[0]["activation_peak_op"] == "llm:0F1"


def test_a_profile_counts_the_state_of_the_optimizer_the_run_uses():
    from executor.runtime.jobs import Job
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.profile import profile_model
    from mpipe_core.api import evaluate
    from mpipe_core.runs.model_spec import ModelSpec

    spec = ModelSpec("tiny-text")
    sgd = profile_model(load_model(spec), spec, warmup=0, repeats=1)
    adamw = profile_model(load_model(spec), spec, warmup=0, repeats=1, optimizer="adamw")
    # per float32 parameter: itself and its gradient; SGD's momentum, or AdamW's two moments (+ a step count)
    layer_params = sum(p.numel() for p in load_model(spec).layers[0].parameters())
    assert sgd["llm"]["static"]["layer"] == 3 * 4 * layer_params
    assert adamw["llm"]["static"]["layer"] == 4 * 4 * layer_params + 4 * len(list(load_model(spec).layers[0].parameters()))
    ev = evaluate("1f1b(p=2, m=2)", adamw)
    (r,) = run_local([Job.make(ev.term, ev.schedule, spec, optimizer={"name": "adamw", "lr": 1e-3, "momentum": 0.0},
                               steps=2, check_grads=True)], 2)
    assert [m["static"] for m in r.memory] == ev.metrics.static_memory
    # ... of an optimizer that really stepped once per step: the second step's gradients and the final
    # parameters agree with the reference run's
    assert r.grad_check["ok"] and r.grad_check["final_params_ok"] and len(r.grad_check["steps"]) == 2
