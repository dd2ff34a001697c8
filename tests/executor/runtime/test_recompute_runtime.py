"""The executor runs `recompute(...)` for real: fully recomputed layers keep only
their input and are rebuilt before their backward (fused BW, and split B then
W), selective ones rerun the attention core; the gradients stay exact by the
`--check-grads` rule, on the built-in model and on a HF adapter."""
import pytest
import torch
import torch.nn.functional as F
from executor_matrix import TRAIN, job

from executor.errors import ExecutorError
from executor.runtime.jobs import Job
from executor.runtime.memory_meter import MemoryMeter
from executor.runtime.model import Block
from executor.runtime.rank import run_local
from executor.runtime.recompute import SelectiveAttention
from mpipe_core.api import evaluate
from mpipe_core.runs.model_spec import BatchShape, ModelSpec

BUILTIN_TERMS = [  # 8 layers: 2 chunks of 4 (1F1B), 4 chunks of 2 (ZBV, split B and W)
    "1f1b(p=2, m=4)",
    "recompute(1f1b(p=2, m=4), mode=full)",
    "recompute(1f1b(p=2, m=4), layers=[2, 0])",
    "recompute(zbv(p=2, m=4), layers=[1, 0, 2, 1])",
    "recompute(recompute(zbv(p=2, m=4), mode=selective), chunks=[0, 3])",
    "transpose(recompute(zbv(p=2, m=4), layers=[2, 1, 0, 2]), mode=dynamic, backward=owner)",
]
HF_TERMS = [  # 4 layers: 2 chunks of 2, or 4 of 1
    "1f1b(p=2, m=4)",
    "recompute(1f1b(p=2, m=4), mode=full)",
    "recompute(1f1b(p=2, m=4), layers=[1, 2])",
    "recompute(zbv(p=2, m=4), layers=[1, 0, 1, 0])",
    "recompute(transpose(1f1b(p=2, m=4), mode=prefix), mode=selective)",
]


def _checked(results) -> dict:
    bad = [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in results if not r.grad_check["ok"]]
    assert not bad
    return {r.name: r for r in results}


def test_recompute_on_the_builtin_model_keeps_the_gradients_and_saves_memory():
    jobs = [job(t, TRAIN, steps=2) for t in BUILTIN_TERMS]
    runs = _checked(run_local(jobs, 2))
    peak = {name: [m["activation_peak"] for m in r.memory] for name, r in runs.items()}
    plain, full = peak["1f1b(p=2, m=4)"], peak["recompute(1f1b(p=2, m=4), mode=full)"]
    assert all(f < p / 2 for f, p in zip(full, plain))
    # only chunk 0's first two layers: rank 0 saves less, rank 1 as much as without
    partial = peak["recompute(1f1b(p=2, m=4), layers=[2, 0])"]
    assert full[0] < partial[0] < plain[0] and partial[1] == plain[1]
    # a fused backward rebuilds the recomputed layers one at a time: the peak is reached in a BW
    assert [m["activation_peak_op"] for m in runs["recompute(1f1b(p=2, m=4), mode=full)"].memory] \
        == ["llm:0BW0", "llm:1BW0"]
    assert all(r.memory[d]["parameters"] > 0 for r in runs.values() for d in (0, 1))


def test_recompute_on_a_hf_adapter_keeps_the_gradients():
    spec = ModelSpec("hf:llava", None, BatchShape())
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.workload import model_workload

    wl = model_workload(load_model(spec))
    jobs = [Job.make(t, evaluate(t, wl).schedule, spec, check_grads=True) for t in HF_TERMS]
    runs = _checked(run_local(jobs, 2))
    plain = runs["1f1b(p=2, m=4)"].memory
    full = runs["recompute(1f1b(p=2, m=4), mode=full)"].memory
    assert all(f["activation_peak"] < p["activation_peak"] for f, p in zip(full, plain))


def test_selective_recompute_keeps_the_attention_core_inputs_only():
    """CPU's scaled_dot_product_attention keeps q, k, v, its output (which the
    output projection saves as well) and the softmax statistics: under
    selective recompute the statistics go, and the gradients are the same."""
    torch.manual_seed(0)
    block = Block(32, 2, causal=True)
    x = torch.randn(1, 16, 32, requires_grad=True)
    saved, grads = [], []
    for selective in (False, True):
        meter = MemoryMeter()
        meter.set_static(block.parameters())
        with meter.recording():
            if selective:
                with SelectiveAttention():
                    y = block(x)
            else:
                y = block(x)
            saved.append(meter.live)
            grads.append(torch.autograd.grad(y.square().sum(), [x, *block.parameters()]))
    assert saved[0] - saved[1] == 1 * 2 * 16 * 4  # logsumexp: batch x heads x tokens, float32
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_selective_recompute_refuses_attention_dropout():
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    with SelectiveAttention(), pytest.raises(ExecutorError) as caught:
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    assert caught.value.message == ("selective recompute reruns the attention core in the backward, which "
                                    "attention dropout (0.1) would make differ from the forward")


class _DropoutLayer(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, hidden, context):
        return hidden + self.drop(torch.tanh(self.fc(hidden)))


class _Embed(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, batch, features):
        return self.fc(features)


class _DropoutModel(torch.nn.Module):
    """Chunk 0 of a model whose layers use dropout, in train mode."""

    def __init__(self, width: int = 16, layers: int = 4):
        super().__init__()
        self.embedding = _Embed(width)
        self.layers = torch.nn.ModuleList(_DropoutLayer(width) for _ in range(layers))
        self.head = torch.nn.Linear(width, 1)

    def loss(self, logits, batch, normalizer):
        return logits.square().sum() / normalizer


@pytest.mark.parametrize("split", [False, True], ids=["BW", "B+W"])
def test_full_recompute_reruns_dropout_with_the_forwards_mask(split):
    """A fully recomputed layer reruns under its forward's random state: with
    dropout in train mode, the gradients are exactly those without recompute,
    and the rerun leaves the global random state alone."""
    from executor.runtime.models.chunks import ModelChunk
    from executor.runtime.recompute import chunk_forward

    torch.manual_seed(0)
    model = _DropoutModel().train()
    chunk = ModelChunk(0, range(4), first=True, last=True)
    features = torch.randn(2, 8, 16)
    results = []
    for full in (0, 3):
        model.zero_grad()
        feats = features.clone().requires_grad_(True)
        torch.manual_seed(1)
        graph = chunk_forward(chunk, model, None, [feats], None, None, 1, full=full)
        after_forward = torch.get_rng_state()
        if split:
            (gin,) = graph.backward_input(torch.ones_like(graph.output))
            graph.backward_weight()
        else:
            (gin,) = graph.backward_fused(torch.ones_like(graph.output))
        assert torch.equal(torch.get_rng_state(), after_forward)  # the rebuilds forked it
        results.append((gin, [p.grad.clone() for p in model.parameters()]))
    (plain_gin, plain), (gin, recomputed) = results
    assert all(g is not None and g.abs().sum() > 0 for g in plain)
    assert torch.equal(plain_gin, gin)
    assert all(torch.equal(a, b) for a, b in zip(plain, recomputed))
