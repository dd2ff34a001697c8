"""The LLM schedule generators against torch 2.13's own schedules, and on their own.

torch's schedule classes are built without a process group: a mock stage
carries only the attributes their constructors read (`submod`, `num_stages`,
`group_size`, `group_rank`, `group`, plus `stage_index` for readability).
"""
from __future__ import annotations

import pytest
import torch.distributed.pipelining.schedules as torch_schedules

from benchmarks.torch_construction import MockStage  # also quiets torch's per-schedule log line
from mpipe_core.algebra.generators import GENERATORS, REQUIRED, GeneratorSpec
from mpipe_core.errors import ArgumentError
from mpipe_core.ir.ops import BW, COMPUTE_KINDS, LLM, B, F, Op, W

# torch kind -> ours: torch's I is our B (input grad only), torch's B our BW (fused).
TORCH_KIND = {"F": F, "I": B, "W": W, "B": BW}


def build_torch(cls, p: int, m: int, v: int, placement: str):
    """Rank 0's view of `cls` for p ranks, v stages per rank (v=0: a single-stage class)."""
    if v == 0:
        return cls(MockStage(0, p, p), m)
    if placement == "loop":
        indices = [local * p for local in range(v)]  # rank 0 holds 0, p, 2p, ...
    else:
        indices = [0, 2 * p - 1]  # rank 0 holds the first and the last stage of the V
    return cls([MockStage(i, p * v, p) for i in indices], m)


def torch_compute_orders(schedule) -> list[list[tuple[int, str, int]]]:
    """torch's pipeline_order as (chunk, our kind, mb), Nones dropped, overlaps flattened."""
    order = schedule.pipeline_order
    result = []
    for rank in range(len(order)):
        ops = []
        for action in order[rank]:
            if action is None:
                continue
            for part in action.sub_actions or (action,):
                if part.is_compute_op:
                    ops.append((part.stage_index, TORCH_KIND[part.computation_type.value], part.microbatch_index))
        result.append(ops)
    return result


def our_orders(schedule) -> list[list[tuple[int, str, int]]]:
    return [[(op.chunk, op.kind, op.mb) for op in order] for order in schedule.orders]


# (our name, our keyword arguments, torch class, stages per rank (0: single-stage class), placement)
TORCH_TWINS = [
    ("gpipe", {}, torch_schedules.ScheduleGPipe, 0, "loop"),
    ("interleaved", {"v": 1}, torch_schedules.ScheduleInterleaved1F1B, 1, "loop"),
    ("interleaved", {"v": 2}, torch_schedules.ScheduleInterleaved1F1B, 2, "loop"),
    ("interleaved", {"v": 3}, torch_schedules.ScheduleInterleaved1F1B, 3, "loop"),
    ("looped_bfs", {"v": 2}, torch_schedules.ScheduleLoopedBFS, 2, "loop"),
    ("looped_bfs", {"v": 3}, torch_schedules.ScheduleLoopedBFS, 3, "loop"),
    ("zb_h1", {}, torch_schedules.ScheduleInterleavedZeroBubble, 1, "loop"),
    ("zbv", {}, torch_schedules.ScheduleZBVZeroBubble, 2, "v"),
    ("dualpipev", {}, torch_schedules.ScheduleDualPipeV, 2, "v"),
]
RANKS = (1, 2, 3, 4, 8)


def microbatch_counts(p: int) -> list[int]:
    """m in {p, 2p, 3p, 8, 12, 32} plus the edges torch treats specially (m < p, m = 2p-1, ...)."""
    return sorted({1, max(1, p - 1), p, p + 1, 2 * p - 1, 2 * p, 3 * p, 8, 9, 12, 32})


TORCH_GRID = [
    pytest.param(name, kwargs, cls, v, placement, p, m, id=f"{name}{kwargs.get('v', '')}-p{p}-m{m}")
    for name, kwargs, cls, v, placement in TORCH_TWINS
    for p in RANKS
    for m in microbatch_counts(p)
]


@pytest.mark.parametrize("name, kwargs, cls, v, placement, p, m", TORCH_GRID)
def test_compute_order_equals_torch(name, kwargs, cls, v, placement, p, m):
    try:
        reference = build_torch(cls, p, m, v, placement)
    except ValueError as torch_error:
        # torch rejects these sizes in its constructor; so must we, naming the argument.
        with pytest.raises(ArgumentError) as ours:
            GENERATORS[name].function(p=p, m=m, **kwargs)
        assert ours.value.argument == "m", (torch_error, ours.value)
        return
    assert our_orders(GENERATORS[name].function(p=p, m=m, **kwargs)) == torch_compute_orders(reference)


def test_the_grid_is_mostly_accepted_by_torch():
    """Guard against a grid that only exercises rejections."""
    accepted = 0
    for name, kwargs, cls, v, placement in TORCH_TWINS:
        for p in RANKS:
            for m in microbatch_counts(p):
                try:
                    build_torch(cls, p, m, v, placement)
                    accepted += 1
                except ValueError:
                    pass
    assert accepted > 0.8 * len(TORCH_GRID)


# --- 1F1B: written out by hand, not compared with torch ----------------------
# torch 2.13's Schedule1F1B.pipeline_order is wrong on the last rank: it starts
# at F1 and never runs F0 (its own _validate_schedule rejects the order), so the
# textbook order below is the reference.  The last test of this block pins
# that torch bug down, and that torch agrees with us on every other rank.

def parse_order(text: str, chunk: int) -> list[tuple[int, str, int]]:
    ops = []
    for word in text.split():
        kind = word.rstrip("0123456789")
        ops.append((chunk, kind, int(word[len(kind):])))
    return ops


TEXTBOOK_1F1B = {
    (2, 3): [
        "F0 F1 BW0 F2 BW1 BW2",
        "F0 BW0 F1 BW1 F2 BW2",
    ],
    (3, 4): [
        "F0 F1 F2 BW0 F3 BW1 BW2 BW3",
        "F0 F1 BW0 F2 BW1 F3 BW2 BW3",
        "F0 BW0 F1 BW1 F2 BW2 F3 BW3",
    ],
}


@pytest.mark.parametrize("p, m", sorted(TEXTBOOK_1F1B))
def test_1f1b_is_the_textbook_order(p, m):
    expected = [parse_order(text, rank) for rank, text in enumerate(TEXTBOOK_1F1B[p, m])]
    assert our_orders(GENERATORS["1f1b"].function(p=p, m=m)) == expected


@pytest.mark.parametrize("p, m", [(2, 3), (3, 4), (4, 8), (8, 12)])
def test_1f1b_differs_from_torch_only_by_torchs_last_rank_bug(p, m):
    ours = our_orders(GENERATORS["1f1b"].function(p=p, m=m))
    theirs = torch_compute_orders(build_torch(torch_schedules.Schedule1F1B, p, m, 0, "loop"))
    assert ours[:-1] == theirs[:-1]
    assert (p - 1, F, 0) not in theirs[-1]  # torch 2.13 never runs F0 on the last rank
    assert ours[-1][:2] == [(p - 1, F, 0), (p - 1, BW, 0)]


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_1f1b_rejects_what_torch_rejects(p):
    with pytest.raises(ValueError):
        build_torch(torch_schedules.Schedule1F1B, p, p - 1, 0, "loop")
    with pytest.raises(ArgumentError) as error:
        GENERATORS["1f1b"].function(p=p, m=p - 1)
    assert error.value.argument == "m"


# --- every generator on its own ------------------------------------------------

def all_generator_cases():
    for name, spec in GENERATORS.items():
        vs = (1, 2, 3) if "v" in spec.params else (None,)
        for v in vs:
            for p in (1, 2, 3, 4, 5):
                for m in (1, 2, 3, p, 2 * p, 2 * p + 1, 4 * p, 10):
                    kwargs = {"p": p, "m": m} if v is None else {"p": p, "m": m, "v": v}
                    try:
                        schedule = spec.function(**kwargs)
                    except ArgumentError:
                        continue
                    yield name, kwargs, schedule


CASES = list(all_generator_cases())


def expected_chunks(name: str, p: int, v: int, rank: int) -> set[int]:
    if name in ("zbv", "dualpipev"):
        return {rank, 2 * p - 1 - rank}
    return set(range(rank, p * v, p))


def deps(op: Op, last_chunk: int, backward_kind: dict) -> list[tuple[str, int, int]]:
    """The dataflow of docs/architecture.md: F(c-1)->F(c), F(c)->back(c), back(c+1)->back(c), B(c)->W(c)."""
    c, mb = op.chunk, op.mb
    if op.kind == F:
        return [(F, c - 1, mb)] if c > 0 else []
    if op.kind == W:
        return [(B, c, mb)]
    before = [(F, c, mb)]
    if c < last_chunk:
        before.append((backward_kind[c + 1, mb], c + 1, mb))
    return before


def simulate(schedule, cost: dict[str, int]) -> dict[tuple[str, int, int], int]:
    """Start time of every op when each device runs its order as early as the dataflow allows.

    Raises AssertionError on a deadlock (no device can start its next op).
    """
    last_chunk = schedule.pipelines[0].chunks - 1
    backward_kind = {(op.chunk, op.mb): op.kind for op in schedule.ops() if op.kind in (B, BW)}
    start, end = {}, {}
    heads = [0] * schedule.devices
    free = [0] * schedule.devices
    placed = 0
    while placed < schedule.num_ops:
        progressed = False
        for device, order in enumerate(schedule.orders):
            while heads[device] < len(order):
                op = order[heads[device]]
                needed = deps(op, last_chunk, backward_kind)
                if any(key not in end for key in needed):
                    break
                key = (op.kind, op.chunk, op.mb)
                start[key] = max([free[device]] + [end[k] for k in needed])
                end[key] = free[device] = start[key] + cost[op.kind]
                heads[device] += 1
                placed += 1
                progressed = True
        assert progressed, f"deadlock: heads {heads}"
    return start


@pytest.mark.parametrize("name, kwargs, schedule", CASES, ids=[f"{n}-{sorted(k.items())}" for n, k, _ in CASES])
def test_every_op_once_on_its_chunks_rank_and_deadlock_free(name, kwargs, schedule):
    p, m, v = kwargs["p"], kwargs["m"], kwargs.get("v", 2 if name in ("zbv", "dualpipev") else 1)
    assert schedule.devices == p
    assert schedule.pipelines[0].chunks == p * v
    assert schedule.pipelines[0].microbatches == m

    kinds: dict[tuple[int, int], list[str]] = {}
    for rank, order in enumerate(schedule.orders):
        assert {op.chunk for op in order} == expected_chunks(name, p, v, rank)
        for op in order:
            assert op.module == LLM and op.step == 0 and op.kind in COMPUTE_KINDS
            kinds.setdefault((op.chunk, op.mb), []).append(op.kind)
    assert set(kinds) == {(c, mb) for c in range(p * v) for mb in range(m)}
    for chunk_mb, ks in kinds.items():
        assert sorted(ks) in ([BW, F], [B, F, W]), (chunk_mb, ks)

    simulate(schedule, {F: 1, B: 1, W: 1, BW: 2})


@pytest.mark.parametrize("p, m", [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 5, 2 * p - 1, 3 * p, 20)])
def test_zb_h2_warmup_and_parallelogram(p, m):
    schedule = GENERATORS["zb_h2"].function(p=p, m=m)
    for rank, order in enumerate(schedule.orders):
        first_b = next(i for i, op in enumerate(order) if op.kind == B)
        assert all(op.kind == F for op in order[:first_b])
        assert first_b == min(m, 2 * (p - rank) - 1)
    if m >= 2 * p - 1:
        # With F = B = W = 1, rank r is busy without a gap from time r to r + 3m.
        start = simulate(schedule, {F: 1, B: 1, W: 1, BW: 2})
        for rank, order in enumerate(schedule.orders):
            assert [start[op.kind, op.chunk, op.mb] for op in order] == list(range(rank, rank + 3 * m))


def test_zb_h2_beats_zb_h1_when_f_plus_b_exceeds_2w():
    cost = {F: 2, B: 2, W: 1, BW: 3}

    def makespan(name):
        schedule = GENERATORS[name].function(p=8, m=16)
        start = simulate(schedule, cost)
        return max(start[op.kind, op.chunk, op.mb] + cost[op.kind] for op in schedule.ops())

    assert makespan("zb_h2") < makespan("zb_h1") < makespan("1f1b")


def test_unit_cost_makespans_match_the_engineering_notes():
    cost = {F: 1, B: 1, W: 1, BW: 2}

    def makespan(name, p, m):
        schedule = GENERATORS[name].function(p=p, m=m)
        start = simulate(schedule, cost)
        return max(start[op.kind, op.chunk, op.mb] + cost[op.kind] for op in schedule.ops())

    assert makespan("gpipe", 4, 8) == makespan("1f1b", 4, 8) == 33
    assert makespan("zb_h1", 4, 8) == 3 * 8 + 3
    assert makespan("zb_h1", 8, 32) == 3 * 32 + 7
    assert makespan("zbv", 4, 8) == 51
    assert makespan("zbv", 8, 32) == 199


def test_dualpipev_flattens_overlapped_actions_to_forward_then_backward():
    reference = build_torch(torch_schedules.ScheduleDualPipeV, 4, 8, 2, "v")
    overlaps = [a for a in reference.pipeline_order[0] if a is not None and a.sub_actions]
    assert overlaps, "torch's DualPipeV should contain OVERLAP_F_B actions"
    ours = our_orders(GENERATORS["dualpipev"].function(p=4, m=8))[0]
    first = overlaps[0].sub_actions
    pair = [(a.stage_index, TORCH_KIND[a.computation_type.value], a.microbatch_index) for a in first]
    at = ours.index(pair[0])
    assert ours[at:at + 2] == pair
    assert [kind for _, kind, _ in pair] == [F, BW]


# --- the registry and argument errors --------------------------------------------

def test_registry_names_and_parameters():
    assert set(GENERATORS) == {"gpipe", "1f1b", "interleaved", "looped_bfs", "zb_h1", "zb_h2", "zbv", "dualpipev"}
    for name, spec in GENERATORS.items():
        assert isinstance(spec, GeneratorSpec) and spec.name == name and spec.description
        assert list(spec.params)[:2] == ["p", "m"]
        assert spec.params["p"] is REQUIRED and spec.params["m"] is REQUIRED
    assert GENERATORS["interleaved"].params["v"] == 2
    assert GENERATORS["looped_bfs"].params["v"] == 2
    assert GENERATORS["interleaved"](p=2, m=4).pipelines[0].chunks == 4


@pytest.mark.parametrize(
    "name, argument", [(name, arg) for name in sorted(GENERATORS) for arg in GENERATORS[name].params]
)
def test_sizes_below_one_are_refused_with_the_argument_named(name, argument):
    spec = GENERATORS[name]
    kwargs = {"p": 2, "m": 8, "v": 2}
    kwargs = {key: kwargs[key] for key in spec.params}
    kwargs[argument] = 0
    with pytest.raises(ArgumentError) as error:
        spec.function(**kwargs)
    assert error.value.argument == argument
    assert f"{argument} must be >= 1 (got 0)" in error.value.message


def test_dualpipev_needs_m_at_least_2p():
    with pytest.raises(ArgumentError, match=r"m >= 2p.*m=7, p=4"):
        GENERATORS["dualpipev"].function(p=4, m=7)


def test_interleaved_rounds_rule_message():
    with pytest.raises(ArgumentError, match=r"m=9, p=4: 2 rounds") as error:
        GENERATORS["interleaved"].function(p=4, m=9)
    assert error.value.argument == "m"
    GENERATORS["interleaved"].function(p=4, m=6)  # one round of 6: torch accepts it too
