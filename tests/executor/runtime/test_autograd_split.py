import torch

from executor.runtime.autograd_split import backward_fused, backward_input, backward_weight
from executor.runtime.model import LanguageModel, ModelConfig


def _grads(params):
    return [None if p.grad is None else p.grad.clone() for p in params]


def _run(fn, inputs, params, split):
    for p in params:
        p.grad = None
    xs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*xs)
    g = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    if split:
        gin, state = backward_input([out], [g], xs, params)
        # B must not have touched the weights yet.
        assert all(p.grad is None for p in params)
        backward_weight(state)
    else:
        gin = backward_fused([out], [g], xs, params)
    return gin, _grads(params)


def _same(a, b):
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x, y)


def test_split_equals_fused_on_a_transformer_chunk():
    cfg = ModelConfig()
    lm = LanguageModel(cfg, layers=[2, 3], embed=False, head=False)
    params = list(lm.parameters())
    x = torch.randn(2, cfg.seq_len, cfg.d_model, generator=torch.Generator().manual_seed(0)).requires_grad_()
    fused = _run(lambda x: lm.run_layers(x, [2, 3]), [x], params, split=False)
    split = _run(lambda x: lm.run_layers(x, [2, 3]), [x], params, split=True)
    _same(fused[0], split[0])
    _same(fused[1], split[1])


def test_no_input_gradient_means_w_does_everything():
    cfg = ModelConfig(encoder=None)
    lm = LanguageModel(cfg, layers=[0], embed=True, head=False)
    params = list(lm.parameters())
    tokens = torch.randint(0, cfg.vocab, (1, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    fn = lambda t: lm.run_layers(lm.embed(t, None, None), [0])  # noqa: E731
    fused = _run(fn, [tokens], params, split=False)
    split = _run(fn, [tokens], params, split=True)
    _same(fused[1], split[1])


def test_weight_used_twice_is_not_counted_twice():
    w = torch.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(2)))
    c = torch.nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(3)))
    fn = lambda x: torch.tanh(torch.tanh(x @ w + c) @ w) * c  # noqa: E731
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4)).requires_grad_()
    fused = _run(fn, [x], [w, c], split=False)
    split = _run(fn, [x], [w, c], split=True)
    _same(fused[0], split[0])
    for a, b in zip(fused[1], split[1]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
