"""Trace readers on traces built here from the documented formats (Chrome/Kineto
with torch's `PP:` names, device-side ranges, gzip, torchtitan's folder layout,
the mpipe: label convention and --label-pattern, Megatron's simulator JSON):
which ranges become ops, when an op starts and ends, steps, clocks, the term."""
from __future__ import annotations

import gzip
import json
import math

import pytest
from kineto_traces import BASE_NS, X, pipelining_traces, trace_doc

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.formats.kineto import parse_kineto
from mpipe_core.formats.label_pattern import LabelPattern
from mpipe_core.formats.pp_actions import parse_action
from mpipe_core.formats.rank_layout import parse_layout
from mpipe_core.formats.trace_files import TraceFile, read_paths, read_uploads
from mpipe_core.formats.trace_import import assemble, check_term, default_workload, infer_term

BASE = BASE_NS


def doc(rank, events, world=2, base=BASE, info=True):
    return trace_doc(rank, events, world=world, base=base, info=info, host_name="node0")


def torch_trace(term: str, step_gap: float = 1000.0, steps: int = 2, device: bool = False,
                wait: float = 5.0, base=BASE, marks: bool = True, offset: float = 0.0):
    """Per-rank traces of `term` as torch's runtime would record them: each compute
    action a `PP:` range that waits `wait` us before its first child op (a cpu_op),
    then computes 10 us; a SEND after forwards; ProfilerStep marks around steps;
    with `device`, the same ranges on the device stream, shifted by 2 us."""
    return pipelining_traces(term, lambda op, step: 10.0, steps=steps, wait=wait, after=1.0, step_gap=step_gap,
                             first_step=5, sends=True, device=device, marks=marks, offset=offset,
                             child="aten::linear", base=base, host_name="node0")


def files_of(docs, names=None, group=""):
    return [TraceFile(names[i] if names else f"rank{i}_trace.json", json.dumps(d).encode(), group)
            for i, d in enumerate(docs)]


# --------------------------------------------------------------------------- torch's names

def test_torchs_action_names_map_to_mpipe_ops():
    assert [tuple(a) for a in parse_action("PP:2F0")] == [("compute", "F", 2, 0)]
    assert [tuple(a) for a in parse_action("PP:0I3")] == [("compute", "B", 0, 3)]
    assert [tuple(a) for a in parse_action("PP:1W4")] == [("compute", "W", 1, 4)]
    assert [tuple(a) for a in parse_action("PP:3B2")] == [("compute", "BW", 3, 2)]
    assert [tuple(a) for a in parse_action("PP:1SEND_F1")] == [("transfer", "SEND_F", 1, 1)]
    assert [tuple(a) for a in parse_action("PP:0UNSHARD")] == [("other", "UNSHARD", 0, -1)]
    assert [tuple(a) for a in parse_action("PP:(4F4;3B0)OVERLAP_F_B")] == [("compute", "F", 4, 4),
                                                                           ("compute", "BW", 3, 0)]
    assert parse_action("PP:junk") is None and parse_action("aten::mm") is None


def test_an_op_runs_from_its_first_child_op_to_the_end_of_its_range():
    events = [X("PP:1F0", 100.0, 50.0), X("aten::linear", 130.0, 5.0, cat="cpu_op"),
              X("aten::add", 140.0, 1.0, cat="cpu_op"), X("PP:1B0", 200.0, 20.0),  # no child: taken whole
              X("aten::other_thread", 101.0, 1.0, cat="cpu_op", tid=2)]
    t = parse_kineto(doc(1, events), "rank1.json")
    assert [(o.kind, o.start, o.end, o.span_start) for o in t.ops] == [("F", 130.0, 150.0, 100.0),
                                                                      ("BW", 200.0, 220.0, 200.0)]


def test_overlap_f_b_shares_its_span_in_order():
    t = parse_kineto(doc(0, [X("PP:(4F4;3B0)OVERLAP_F_B", 0.0, 30.0), X("aten::mm", 10.0, 1.0, cat="cpu_op")],
                         world=1), "r.json")
    assert [(o.chunk, o.kind, o.microbatch, o.start, o.end) for o in t.ops] == [(4, "F", 4, 10.0, 20.0),
                                                                              (3, "BW", 0, 20.0, 30.0)]


def test_device_side_ranges_are_used_when_present():
    docs = torch_trace("1f1b(p=2, m=2)", device=True)
    trace = assemble(files_of(docs))
    assert trace.device_side
    first = [r for r in trace.records if r.device == 0 and r.step == 0]
    # CPU ranges start at 0 (first child at 5 us); device ranges 2 us after the child, 10 us long
    assert first[0].start == pytest.approx(0.0) and first[0].end == pytest.approx(10e-6)
    cpu = assemble(files_of(torch_trace("1f1b(p=2, m=2)")))
    assert not cpu.device_side and cpu.orders == trace.orders


def test_steps_from_profiler_marks_and_the_term_inferred():
    trace = assemble(files_of(torch_trace("interleaved(p=2, m=4)")))
    assert [s["profiler_step"] for s in trace.steps] == [5, 6] and trace.ranks == 2
    assert trace.ops_per_rank == [32, 32] and trace.transfers == [16, 16]
    assert infer_term(trace, default_workload(trace)) == "interleaved(p=2, m=4)"
    assert check_term(trace, "interleaved(p=2, m=4, v=2)", None) == "interleaved(p=2, m=4)"
    with pytest.raises(MpipeError, match=r"rank 0, op 2: the traces ran llm:2F0 where the term runs llm:0F2"):
        check_term(trace, "looped_bfs(p=2, m=4)", None)
    # clocks: one base, so the first op (rank 0's first child) is time 0
    assert min(r.start for r in trace.records) == 0.0 and trace.clock.startswith("as recorded")


def test_without_marks_the_kth_occurrence_of_an_op_is_step_k():
    trace = assemble(files_of(torch_trace("zb_h1(p=2, m=3)", marks=False, steps=3)))
    assert len(trace.steps) == 3 and all(s["profiler_step"] is None for s in trace.steps)
    assert infer_term(trace, None) == "zb_h1(p=2, m=3)"


def test_rank_from_the_file_name_and_clocks_from_each_files_base():
    docs = torch_trace("1f1b(p=2, m=2)")
    for d in docs:
        d.pop("distributedInfo")
    docs[1]["baseTimeNanoseconds"] = BASE + 3_000  # rank 1's clock started 3 us later
    trace = assemble(files_of(docs, ["a/rank0_trace.json", "a/rank_1.json"]))
    same = assemble(files_of(torch_trace("1f1b(p=2, m=2)")))
    shift = {(r.device, r.step, r.kind, r.chunk, r.microbatch): r.start for r in same.records}
    for r in trace.records:
        expect = shift[(r.device, r.step, r.kind, r.chunk, r.microbatch)] + (3e-6 if r.device == 1 else 0.0)
        assert r.start == pytest.approx(expect, abs=1e-9)
    assert "own baseTimeNanoseconds" in trace.clock


def test_align_on_a_collective_every_rank_leaves_together():
    docs = torch_trace("1f1b(p=2, m=2)")
    for r, d in enumerate(docs):  # rank 1 recorded 40 us late: its barrier ends at 540, rank 0's at 500
        d["traceEvents"].append(X("gloo:barrier", -100.0 + 40 * r, 600.0))
        if r == 1:
            for e in d["traceEvents"]:
                if e["name"] != "gloo:barrier":
                    e["ts"] += 40.0
    aligned = assemble(files_of(docs), align_on="gloo:barrier")
    plain = assemble(files_of(torch_trace("1f1b(p=2, m=2)")))
    assert [round(r.start, 9) for r in aligned.records] == [round(r.start, 9) for r in plain.records]
    assert "aligned on the end" in aligned.clock
    with pytest.raises(MpipeError, match="no event named 'nccl:all_reduce'"):
        assemble(files_of(docs), align_on="nccl:all_reduce")


# --------------------------------------------------------------------------- labels

def test_the_mpipe_label_convention_marks_encoder_ops():
    events = [X("mpipe:vision:F:0", 0.0, 10.0), X("PP:0F0", 11.0, 5.0), X("mpipe:vision:F:1", 17.0, 10.0),
              X("PP:0F1", 28.0, 5.0), X("PP:0B0", 40.0, 5.0), X("PP:0B1", 46.0, 5.0)]
    t = assemble([TraceFile("rank0.json", json.dumps(doc(0, events, world=2)).encode()),
                  TraceFile("rank1.json", json.dumps(doc(1, [X("PP:1F0", 20.0, 5.0), X("PP:1B0", 30.0, 5.0),
                                                             X("PP:1F1", 36.0, 5.0), X("PP:1B1", 42.0, 5.0)],
                                                            world=2)).encode())])
    assert t.encoders == {"vision": False}
    assert infer_term(t, default_workload(t)) == "1f1b(p=2, m=2)"
    assert [str(op) for op in t.orders[0][:2]] == ["vision:0F0", "llm:0F0"]


def test_a_label_pattern_reads_other_stacks_ranges():
    pattern = LabelPattern(r"(?P<kind>fwd|bwd)_stage(?P<chunk>\d+)_mb(?P<microbatch>\d+)")
    events = [X("fwd_stage0_mb0", 0.0, 5.0), X("fwd_stage0_mb1", 6.0, 5.0), X("bwd_stage0_mb0", 30.0, 5.0),
              X("bwd_stage0_mb1", 36.0, 5.0)]
    t = parse_kineto(doc(0, events, world=1), "r.json", pattern)
    assert [(o.kind, o.chunk, o.microbatch) for o in t.ops] == [("F", 0, 0), ("F", 0, 1), ("BW", 0, 0), ("BW", 0, 1)]
    with pytest.raises(MpipeError, match="no named group 'kind'"):
        LabelPattern(r"fwd_(?P<microbatch>\d+)")
    with pytest.raises(MpipeError, match="not a regular expression"):
        LabelPattern(r"(?P<kind>")


def test_a_trace_without_pipeline_ranges_names_label_pattern():
    files = files_of([doc(0, [X("aten::mm", 0.0, 5.0, cat="cpu_op"), X("forward", 0.0, 9.0)], world=1)])
    with pytest.raises(MpipeError, match=r"rank0_trace.json: no pipeline ranges.*--label-pattern"):
        assemble(files)


# --------------------------------------------------------------------------- files

def test_gzip_and_torchtitans_folder_layout(tmp_path):
    docs = torch_trace("1f1b(p=2, m=2)")
    later = torch_trace("1f1b(p=2, m=2)", offset=1e6)
    for n, window in ((10, docs), (20, later)):
        folder = tmp_path / "profile_traces" / f"iteration_{n}"
        folder.mkdir(parents=True)
        for r, d in enumerate(window):
            data = json.dumps(d).encode()
            if r == 1:
                (folder / f"rank{r}_trace.json.gz").write_bytes(gzip.compress(data))
            else:
                (folder / f"rank{r}_trace.json").write_bytes(data)
    files = read_paths([tmp_path / "profile_traces"])
    assert [(f.group, f.order) for f in files] == [("iteration_10", 10)] * 2 + [("iteration_20", 20)] * 2
    trace = assemble(files)
    assert [(s["window"], s["profiler_step"]) for s in trace.steps] == [
        ("iteration_10", 5), ("iteration_10", 6), ("iteration_20", 5), ("iteration_20", 6)]
    assert trace.ops_per_rank == [16, 16]
    # one window given by itself keeps its name; the same bytes gzipped have the same digest
    one = read_paths([tmp_path / "profile_traces" / "iteration_10"])
    assert {f.group for f in one} == {"iteration_10"}
    uploads = read_uploads([("iteration_10/rank0_trace.json", gzip.compress(files[0].data)),
                            ("iteration_10/rank1_trace.json", files[1].data)])
    assert assemble(uploads).digest == assemble(one).digest


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["traceEvents"].__setitem__(0, dict(d["traceEvents"][0], dur=-3)), "event 0 ('PP:0F0'): dur -3 is negative"),
    (lambda d: d["traceEvents"].__setitem__(0, dict(d["traceEvents"][0], dur=math.nan)), "event 0 ('PP:0F0'): dur nan is not a finite number"),
    (lambda d: d.pop("traceEvents"), "not a Chrome/Kineto trace"),
])
def test_bad_events_name_the_file_and_the_event(mutate, message):
    docs = torch_trace("1f1b(p=2, m=2)")
    mutate(docs[0])
    with pytest.raises(MpipeError, match="rank0_trace.json: " + message.replace("(", r"\(").replace(")", r"\)")):
        assemble(files_of(docs))


def test_two_files_for_one_rank_and_a_missing_rank_are_refused():
    docs = torch_trace("1f1b(p=2, m=2)")
    with pytest.raises(MpipeError, match="two files for rank 0: rank0_trace.json and copy.json"):
        assemble(files_of([docs[0], docs[0], docs[1]], ["rank0_trace.json", "copy.json", "rank1_trace.json"]))
    with pytest.raises(MpipeError, match="no trace for rank 1 \\(world size 2; ranks given: 0\\)"):
        assemble(files_of([docs[0]]))


def test_truncated_json_and_gzip_bombs_are_refused(monkeypatch):
    data = json.dumps(torch_trace("1f1b(p=2, m=2)")[0]).encode()
    with pytest.raises(MpipeError, match=r"cut.json:1:\d+: not valid JSON"):
        assemble([TraceFile("cut.json", data[:len(data) // 2])])
    bomb = gzip.compress(b"\0" * (40 * 1024 * 1024), compresslevel=9)
    with pytest.raises(MpipeError, match="bomb.json.gz: inflates more than 200 times"):
        read_uploads([("bomb.json.gz", bomb)])
    monkeypatch.setenv("MPIPE_TRACE_LIMIT_MB", "0.001")
    with pytest.raises(MpipeError, match=r"big.json: larger than the limit of 0.001 MB"):
        read_uploads([("big.json", data)])


# --------------------------------------------------------------------------- Megatron

def megatron_files(term: str):
    """task_durations.json and pp_task_orders.json as Megatron's vpp_simulate writes them,
    for the orders `term` gives (stage = model_chunk_id * P + pp_rank)."""
    ev = evaluate(term)
    p = ev.schedule.devices
    durations, orders = {}, {}
    for r, order in enumerate(ev.schedule.orders):
        ids = []
        for op in order:
            kind = "forward" if op.kind == "F" else "backward"
            vc = op.chunk // p
            task = f"pp_{r}-mbs_{op.mb}-model_chunk_{vc}-task_type_{kind}"
            durations[task] = {"duration_ms": 1.0 if kind == "forward" else 2.0, "pp_rank": r,
                               "microbatch_id": op.mb, "model_chunk_id": vc, "task_type": kind}
            ids.append(task)
        orders[str(r)] = ids
    return [TraceFile("sim/task_durations.json", json.dumps(durations).encode()),
            TraceFile("sim/pp_task_orders.json", json.dumps(orders).encode())]


@pytest.mark.parametrize("term", ["interleaved(p=2, m=4)", "interleaved(p=4, m=8, v=1)", "1f1b(p=3, m=4)"])
def test_megatrons_simulator_output_is_one_step_built_by_its_analyzers_rule(term):
    trace = assemble(megatron_files(term))
    assert trace.format == "megatron-sim" and len(trace.steps) == 1
    assert infer_term(trace, None) == evaluate(term).term
    # with F = 1 ms and BW = 2 ms, no transfer time: the simulator's own makespan
    ev = evaluate(term, {"llm": {"layers": None, "f": 1.0, "b": 1.0, "w": 1.0}})
    assert max(r.end for r in trace.records) * 1000 == pytest.approx(ev.timeline.makespan)


def test_megatron_files_that_do_not_fit_are_refused():
    files = megatron_files("1f1b(p=2, m=2)")
    with pytest.raises(MpipeError, match="two files: task_durations.json and pp_task_orders.json"):
        assemble(files[:1])
    orders = json.loads(files[1].data)
    orders["0"][0] = "pp_0-mbs_9-model_chunk_0-task_type_forward"
    with pytest.raises(MpipeError, match="rank 0 position 0: task 'pp_0-mbs_9-model_chunk_0-task_type_forward' "
                                         "is not in sim/task_durations.json"):
        assemble([files[0], TraceFile("sim/pp_task_orders.json", json.dumps(orders).encode())])


# --------------------------------------------------------------------------- one pipeline of a larger world

def _as_rank(d, rank, world=8):
    """The same trace, as global rank `rank` of a `world`-rank job wrote it."""
    out = json.loads(json.dumps(d))
    out["distributedInfo"].update(rank=rank, world_size=world)
    return out


def test_one_pipeline_out_of_a_tp_dp_pp_world_imports_as_alone():
    docs = torch_trace("1f1b(p=2, m=2)")
    alone = assemble(files_of(docs))
    # tp=2, dp=2, pp=2 in tp-cp-dp-pp order: slice tp1/dp0 is ranks 1 and 1 + 2*2 = 5, slice tp1/dp1 is 3 and 7
    world = [_as_rank(docs[1], 7), _as_rank(docs[0], 3), _as_rank(docs[1], 5), _as_rank(docs[0], 1)]
    names = ["rank7_trace.json", "rank3_trace.json", "rank5_trace.json", "rank1_trace.json"]
    got = assemble(files_of(world, names), layout=parse_layout("tp=2,dp=2,pp=2"))
    assert got.ranks == 2 and got.global_ranks == [1, 5]
    assert got.orders == alone.orders
    assert [(r.device, r.kind, r.chunk, r.microbatch, r.start) for r in got.records] == \
        [(r.device, r.kind, r.chunk, r.microbatch, r.start) for r in alone.records]
    assert got.files == ["rank5_trace.json", "rank1_trace.json"]  # the digest covers the kept files only
    assert got.digest == assemble(files_of([world[3], world[2]], ["rank1_trace.json", "rank5_trace.json"]),
                                  layout=parse_layout("tp=2,dp=2,pp=2")).digest
    assert got.notes[0] == ("kept pipeline tp1/dp0 (tp=2, dp=2, pp=2, order tp-cp-dp-pp): ranks 1, 5 as stages "
                            "0..1; 2 file(s) of other pipelines ignored (ranks 3, 7)")
    # ranks from the file names when the files carry no distributedInfo (so no world size to check)
    bare = [doc(0, json.loads(json.dumps(d))["traceEvents"], info=False) for d in docs]
    got = assemble(files_of(bare, ["rank0_trace.json", "rank4_trace.json"]), layout=parse_layout("tp=2,dp=2,pp=2"))
    assert got.orders == alone.orders and got.global_ranks == [0, 4]
    # another order: pp fastest, so stage s of slice tp0/dp0 is rank s
    got = assemble(files_of([_as_rank(docs[0], 0), _as_rank(docs[1], 1)]),
                   layout=parse_layout("tp=2,dp=2,pp=2", "pp-tp-dp"))
    assert got.orders == alone.orders and got.global_ranks == [0, 1]


def test_bad_worlds_are_refused_in_one_line():
    docs = torch_trace("1f1b(p=2, m=2)")
    layout = parse_layout("tp=2,dp=2,pp=2")
    cases = [
        ([_as_rank(docs[0], 0, 64)], "--layout tp=2,dp=2,pp=2 makes 8 ranks, but the traces' world size is 64 "
                                     "(rank0_trace.json)"),
        ([_as_rank(docs[0], 0)], "the traces: no trace for stage 1 of pipeline tp0/dp0: global rank 4 "
                                 "(tp=2, dp=2, pp=2, order tp-cp-dp-pp; its ranks given: 0)"),
        ([_as_rank(docs[0], 0), _as_rank(docs[1], 4, 16)], "rank1_trace.json: world size 16, but rank0_trace.json "
                                                           "has 8"),
    ]
    for world, message in cases:
        with pytest.raises(MpipeError) as got:
            assemble(files_of(world), layout=layout)
        assert got.value.message == message
    bare = [doc(0, docs[0]["traceEvents"], info=False), doc(0, docs[1]["traceEvents"], info=False)]
    with pytest.raises(MpipeError) as got:
        assemble(files_of(bare, ["rank0_trace.json", "rank9_trace.json"]), layout=layout)
    assert got.value.message == "rank9_trace.json: rank 9 is outside the world of --layout tp=2,dp=2,pp=2 (8 ranks)"


def test_a_file_without_pipeline_ranges_is_named_before_missing_ranks():
    # one rank's trace of a 64-rank job, no PP: ranges: the ranges are the problem, not ranks 1..63
    files = files_of([doc(0, [X("aten::mm", 0.0, 5.0, cat="cpu_op"), X("forward", 0.0, 9.0)], world=64)])
    with pytest.raises(MpipeError) as got:
        assemble(files)
    assert got.value.message == ("rank0_trace.json: no pipeline ranges: no PP:<action> ranges of "
                                 "torch.distributed.pipelining, no mpipe:<module>:<kind>:<microbatch> labels; "
                                 "give --label-pattern REGEX for other names")
    # with its ranges, the missing rank is named, and --layout offered
    with pytest.raises(MpipeError) as got:
        assemble(files_of([_as_rank(torch_trace("1f1b(p=2, m=2)")[0], 0, 64)]))
    assert got.value.message == ("the traces: no trace for rank 1 (world size 64; ranks given: 0); for one "
                                 "pipeline of a larger world give --layout tp=..,dp=..,pp=..")
