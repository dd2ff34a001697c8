"""Context parallelism (issue 39 section 4), ranks as threads: the cp attention
alone against unsharded attention, and cp2 x pp2 (and cp2 x pp2 x dp2 under
ZeRO-1 with a trainable encoder) against one process over the whole sequence;
a wrong causal-mask offset must fail the gradient check.  Over torchrun and
gloo (the functional all-gather on the mesh's groups):
test_context_parallel_torchrun.py."""
import threading

import pytest
import torch

from executor.parallel.context_parallel import ContextParallel, ContextParallelAttention, transport_gather
from executor.runtime.model import Attention
from executor.runtime.rank import run_local
from executor.runtime.transport import LocalHub, LocalTransport

from executor_matrix import TEXT, TRAIN, job


def _attention_on_blocks(cp_size: int, fault_rank: int | None = None):
    """Each of `cp_size` threads runs the same attention on its block of one input;
    returns (unsharded output, input gradient, qkv weight gradient) and the same
    joined from the blocks (weight gradients summed, as the dp x cp reduction does)."""
    torch.manual_seed(0)
    reference = Attention(16, 2, causal=True)
    x = torch.randn(2, 12, 16)
    w = torch.randn(2, 12, 16)  # a fixed upstream gradient
    xr = x.clone().requires_grad_()
    out = reference(xr)
    (out * w).sum().backward()
    hub = LocalHub(cp_size, 30.0)
    members = tuple(range(cp_size))
    s = 12 // cp_size
    outs, xgrads, wgrads, rows = [None] * cp_size, [None] * cp_size, [None] * cp_size, [None] * cp_size

    def body(r: int) -> None:
        attn = Attention(16, 2, causal=True)
        attn.load_state_dict(reference.state_dict())
        fault = {"kind": "cp_mask_offset", "global_rank": fault_rank}
        cp = ContextParallel(r, cp_size, transport_gather(LocalTransport(hub, r), members), global_rank=r,
                             fault=fault)
        attn.core = ContextParallelAttention(cp, chunk=0)
        xb = x[:, r * s:(r + 1) * s].clone().requires_grad_()
        y = attn(xb)
        (y * w[:, r * s:(r + 1) * s]).sum().backward()
        outs[r], xgrads[r], wgrads[r], rows[r] = y.detach(), xb.grad, attn.qkv.weight.grad, cp.take_rows()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(cp_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    joined = (torch.cat(outs, 1), torch.cat(xgrads, 1), sum(wgrads))
    return (out.detach(), xr.grad, reference.qkv.weight.grad), joined, rows


@pytest.mark.parametrize("cp", [2, 3])
def test_cp_attention_equals_unsharded_attention(cp):
    full, joined, rows = _attention_on_blocks(cp)
    for a, b in zip(joined, full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # One gather in the forward and its reduce-scatter in the backward, each timed.
    assert all([k for k, *_ in r] == ["cp_comm", "cp_comm"] and all(e >= s for _, _, s, e in r) for r in rows)


def test_a_wrong_mask_offset_changes_the_attention():
    full, joined, _ = _attention_on_blocks(2, fault_rank=1)
    assert not torch.allclose(joined[0], full[0], atol=1e-4)


def _run(term, cfg, layout, fault=None):
    j = job(term, cfg, layout=layout, fault=fault)
    world = layout.get("cp", 1) * layout.get("pp", 1) * layout.get("dp", 1)
    (result,) = run_local([j], world)
    return result


@pytest.mark.parametrize("term,cfg,layout", [
    ("1f1b(p=2, m=4)", TEXT, {"cp": 2, "pp": 2}),
    ("zbv(p=2, m=4)", TRAIN, {"cp": 2, "pp": 2, "dp": 2, "distributed_optimizer": True}),
], ids=["cp2-pp2-1f1b", "cp2-pp2-dp2-zbv-encoder-zero1"])
def test_cp_gradients_equal_the_whole_sequence_reference(term, cfg, layout):
    r = _run(term, cfg, layout)
    check = r.grad_check
    assert check["ok"], check["steps"][-1]["failures"][:3]
    # The loss is the whole sequence's: the cp blocks' (and replicas') shares add up to it.
    assert abs(r.loss[0] - check["steps"][0]["reference_loss"]) <= 1e-5 * abs(r.loss[0])
    kinds = {c.kind for c in r.comm}
    assert {"cp_comm", "dp_comm", "optimizer"} <= kinds
    # Every LLM layer gathers once forward and once backward: 2 per (layer, microbatch) per stage.
    layers_per_stage = TEXT.n_layer // 2
    for device in (0, 1):
        gathers = [c for c in r.comm if c.device == device and c.kind == "cp_comm"]
        assert len(gathers) == 2 * layers_per_stage * 4  # (this pipeline's 4 microbatches)
        assert {c.chunk for c in gathers} == {row.chunk for row in r.timeline if row.device == device}


def test_a_wrong_mask_offset_fails_the_gradient_check():
    r = _run("1f1b(p=2, m=4)", TEXT, {"cp": 2, "pp": 2}, fault={"kind": "cp_mask_offset", "global_rank": 1})
    assert not r.grad_check["ok"]
    assert any(": gradient off by" in f for f in r.grad_check["steps"][0]["failures"])


def test_cp_is_refused_where_it_does_not_run():
    from executor.parallel.layout_checks import ModelDims, builtin_dims, check_layout
    from executor.runtime.model import ModelConfig
    from mpipe_core.runs.layout import LayoutError, RunLayout

    check_layout(RunLayout(cp=2, pp=2), builtin_dims(ModelConfig()))  # the built-in model runs it
    with pytest.raises(LayoutError, match=r"^layout cp=2: model hf:llava has no context-parallel attention "
                                          r"\(run it with cp=1\)$"):
        check_layout(RunLayout(cp=2, pp=2), ModelDims("model hf:llava"))
    with pytest.raises(LayoutError, match="^layout cp=2 with --data: packed microbatches do not run "
                                          "context-parallel yet$"):
        check_layout(RunLayout(cp=2, pp=2), builtin_dims(ModelConfig()), data=True)


@pytest.mark.parametrize("term,cfg", [
    ("recompute(1f1b(p=2, m=4))", TEXT),  # the gathers run again in the recomputed forward
    ("recompute(zb_h1(p=2, m=4), mode=selective)", TEXT),  # the attention core recomputed, split B/W
    ("transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)", TRAIN),  # encoder replicas beside cp
], ids=["full-recompute", "selective-recompute-zb_h1", "transpose-owner"])
def test_cp_under_recompute_and_transpose(term, cfg):
    r = _run(term, cfg, {"cp": 2, "pp": 2})
    assert r.grad_check["ok"], r.grad_check["steps"][-1]["failures"][:3]
    gathers = [c for c in r.comm if c.kind == "cp_comm" and c.device == 0]
    # Forward and backward each layer and microbatch, and once more where the layer is recomputed.
    assert len(gathers) == (3 if term.startswith("recompute(1f1b") else 2) * 4 * 4
