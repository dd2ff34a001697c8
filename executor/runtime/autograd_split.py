"""Backward split into an input-gradient part (B) and a weight-gradient part (W).

Zero-bubble schedules run `B` as soon as the next stage needs the input
gradient and defer `W`.  The same facts torch's `stage_backward_input` /
`stage_backward_weight` rely on are used here, in an implementation of our own:

* `backward_input` walks the chunk's autograd graph once.  Nodes that lie on a
  path from the outputs to a grad-requiring input form the *input path*.  Walking
  up from each parameter, the first input-path nodes reached are the *frontier*
  where that parameter's branch joins the input path.  B runs
  `autograd.grad(outputs -> inputs, retain_graph=True)`; autograd computes only
  what the inputs need (e.g. `addmm` only its `mat1` gradient), and a pre-hook
  on every frontier node captures the gradient flowing into it.
* `backward_weight` restarts from those captured gradients
  (`GradientEdge(node, i)` outputs) and asks only for the parameters of each
  connected group (params sharing branch or frontier nodes), so it runs just
  the parameter branches: no input-gradient work is repeated.  A group with
  several frontier nodes (a weight used twice) clamps each frontier to its
  captured gradient so nothing is counted twice.
* A chunk whose inputs need no gradient (the first chunk of a text-only LLM,
  an encoder on images) has no input path: B has nothing to compute and W runs
  the whole backward from the outputs, as in torch.

`backward_fused` is BW: one `autograd.grad` for inputs and parameters.
Parameter gradients are accumulated into `p.grad` (created as zeros if absent).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge


def _accumulate(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
    for p, g in zip(params, grads):
        if g is None:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        p.grad.add_(g)


def _grad_inputs(inputs: Sequence[torch.Tensor]) -> list[int]:
    return [i for i, x in enumerate(inputs) if x is not None and x.requires_grad]


def backward_fused(outputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor],
                   inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """BW: input gradients (None where an input needs none) and accumulated weight gradients."""
    want = _grad_inputs(inputs)
    params = [p for p in params if p.requires_grad]
    targets = [inputs[i] for i in want] + params
    result: list[torch.Tensor | None] = [None] * len(inputs)
    if not targets:
        return result
    grads = torch.autograd.grad(outputs, targets, grad_outputs, allow_unused=True)
    for i, g in zip(want, grads[: len(want)]):
        result[i] = g
    _accumulate(params, grads[len(want):])
    return result


@dataclass
class _Group:
    params: list[torch.Tensor] = field(default_factory=list)
    frontier: list = field(default_factory=list)  # autograd nodes


@dataclass
class WeightGradState:
    """What B leaves for W: the captured frontier gradients, or the outputs when
    the chunk has no input path."""

    groups: list[_Group]
    captured: dict  # node -> tuple of gradients flowing into it
    outputs: Sequence[torch.Tensor] | None = None
    grad_outputs: Sequence[torch.Tensor] | None = None
    root_params: list[torch.Tensor] = field(default_factory=list)


def backward_input(outputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor],
                   inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]
                   ) -> tuple[list[torch.Tensor | None], WeightGradState]:
    """B: gradients of the inputs only; the graph is kept for `backward_weight`."""
    want = _grad_inputs(inputs)
    params = [p for p in params if p.requires_grad]
    result: list[torch.Tensor | None] = [None] * len(inputs)
    if not want:  # nothing upstream needs a gradient: W does the whole backward
        return result, WeightGradState([], {}, outputs, grad_outputs, params)

    # The graph reachable from the outputs, with reverse (child -> parents) edges.
    roots = [get_gradient_edge(o).node for o in outputs]
    parents: dict = {}
    stack = list(roots)
    seen = set(roots)
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents.setdefault(child, []).append(node)
            if child not in seen:
                seen.add(child)
                stack.append(child)
    # Input path: nodes from which an input's gradient node is reachable.
    on_path = set()
    stack = [get_gradient_edge(inputs[i]).node for i in want]
    stack = [n for n in stack if n in seen]
    on_path.update(stack)
    while stack:
        node = stack.pop()
        for parent in parents.get(node, ()):
            if parent not in on_path:
                on_path.add(parent)
                stack.append(parent)

    # Each parameter's branch up to the frontier; union-find over shared nodes.
    owner: dict = {}  # node -> group id (union-find over group ids)
    link: list[int] = []

    def find(g: int) -> int:
        while link[g] != g:
            link[g] = link[link[g]]
            g = link[g]
        return g

    members: list[list] = []  # group id -> [params, frontier nodes]
    root_params = []
    for p in params:
        acc = get_gradient_edge(p).node
        if acc not in seen:
            continue  # not used by this chunk's outputs
        gid = len(link)
        link.append(gid)
        members.append([[p], []])
        reaches_root_off_path = False
        stack, visited = [acc], {acc}
        while stack:
            node = stack.pop()
            if node in on_path:
                members[gid][1].append(node)
            other = owner.get(node)
            if other is not None and find(other) != find(gid):
                link[find(other)] = find(gid)
            owner[node] = gid
            if node in on_path:
                continue
            ups = parents.get(node, ())
            if not ups and node in roots:
                reaches_root_off_path = True
            for parent in ups:
                if parent not in visited:
                    visited.add(parent)
                    stack.append(parent)
        if reaches_root_off_path:  # an output that does not depend on the inputs
            root_params.append(p)
    groups: dict[int, _Group] = {}
    for gid, (ps, frontier) in enumerate(members):
        grp = groups.setdefault(find(gid), _Group())
        for p in ps:
            if not any(p is q for q in root_params):
                grp.params.append(p)
        for node in frontier:
            if node not in grp.frontier:
                grp.frontier.append(node)

    captured: dict = {}
    handles = []

    def capture(node):
        def hook(grads):
            captured[node] = grads
        return hook

    try:
        for grp in groups.values():
            for node in grp.frontier:
                handles.append(node.register_prehook(capture(node)))
        grads = torch.autograd.grad(outputs, [inputs[i] for i in want], grad_outputs,
                                    retain_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    for i, g in zip(want, grads):
        result[i] = g
    state = WeightGradState([g for g in groups.values() if g.params], captured,
                            outputs if root_params else None,
                            grad_outputs if root_params else None, root_params)
    return result, state


def backward_weight(state: WeightGradState) -> None:
    """W: accumulate the weight gradients B left behind; frees the state."""
    if state.root_params:
        grads = torch.autograd.grad(state.outputs, state.root_params, state.grad_outputs,
                                    retain_graph=bool(state.groups), allow_unused=True)
        _accumulate(state.root_params, grads)
    for grp in state.groups:
        edges, seeds = [], []
        for node in grp.frontier:
            for i, g in enumerate(state.captured.get(node, ())):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    seeds.append(g)
        if not edges:
            continue
        handles = []
        try:
            if len(grp.frontier) > 1:
                for node in grp.frontier:
                    saved = state.captured.get(node)
                    if saved is not None:
                        handles.append(node.register_prehook(lambda _grads, s=saved: s))
            grads = torch.autograd.grad(edges, grp.params, seeds, retain_graph=True, allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        _accumulate(grp.params, grads)
    state.groups.clear()
    state.captured.clear()
    state.outputs = state.grad_outputs = None
    state.root_params = []
