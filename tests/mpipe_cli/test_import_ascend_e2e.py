"""An Ascend cluster's profiler output, from a real run: a real
`torch.distributed.pipelining` training on 2 gloo ranks (`torch_trace_job.py`,
as the Kineto end-to-end test runs it) profiled on CPU, its Kineto traces
rewritten in the Ascend layout (`tests/ascend_layout.py`: one `*_ascend_pt`
folder per rank, named so their sort order is not the rank order, a bare
`trace_view.json` with string `ts`, kernels on `Ascend Hardware`, `hcom_`
events on `HCCL`), then `mpipe import-trace` of the job's folder.

The imported per-rank orders are torch's `pipeline_order`; each op's time is
its range's kernels (first start to last end), computed here from the raw
Kineto events; the send/receive ranges come back as communication rows; the
step_trace_time.csv beside each trace comes back as the run's step summary;
and the three malformed folders are one error line each, nothing saved."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ascend_layout import LAG, folder_name, write_ascend_folder, write_job
from cli_runner import run_cli

from mpipe_core.formats.torch_csv import FROM_TORCH

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TERM = "interleaved(p=2, m=4)"
# One profiling window of two steps: one profiler folder per rank, as torch_npu writes them.
SPEC = {"layers": 4, "d": 64, "vocab": 64, "seq": 16, "batch": 2, "windows": 1, "active": 2, "warmup": 0}


def cli(*argv: str):
    out = run_cli(list(argv))
    assert out.traceback is None, out.traceback
    return out


@pytest.fixture(scope="module")
def kineto(tmp_path_factory):
    """The real run's Kineto documents, rank order, and torch's loaded order (folder)."""
    root = tmp_path_factory.mktemp("ascend-e2e")
    (root / "w.json").write_text(json.dumps({"llm": {"layers": SPEC["layers"]}}))
    got = cli("export", TERM, "-w", str(root / "w.json"), "--format", "torchtitan", "-o", str(root / "config"))
    assert got.code == 0, got.err
    (root / "out").mkdir()
    case = {"name": "interleaved", "toml": str(root / "config" / "torchtitan.toml"), "out": str(root / "out"),
            "order": str(root / "torch_order.json"), "microbatches": 4}
    (root / "spec.json").write_text(json.dumps(dict(SPEC, cases=[case])))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "0", str(HERE / "torch_trace_job.py"), str(root / "spec.json")],
                          cwd=str(root), env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (window,) = [p for p in (root / "out").iterdir() if p.name.startswith("iteration_")]
    docs = [json.loads((window / f"rank{r}_trace.json").read_text()) for r in range(2)]
    return root, docs


def torch_order(root: Path) -> list[list[tuple]]:
    doc = json.loads((root / "torch_order.json").read_text())
    return [[("llm", FROM_TORCH[a[1]], int(a[0]), int(a[2:])) for a in doc[str(r)]] for r in range(len(doc))]


def device_times(docs: list[dict]) -> dict[tuple, tuple[float, float]]:
    """(step, rank, op) -> (first kernel start, last kernel end), us on the ranks' shared clock, from the
    raw Kineto events: a compute PP: range's kernels are the torch ops (of any thread) launched inside it,
    run LAG us later on the device (linked to their launch by async_npu flows)."""
    out = {}
    base = min(d["baseTimeNanoseconds"] for d in docs)
    for rank, doc in enumerate(docs):
        shift = (doc["baseTimeNanoseconds"] - base) / 1000
        xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        marks = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
                       for e in xs if e["name"].startswith("ProfilerStep#"))
        for e in xs:
            name = e["name"]
            if e.get("cat") != "user_annotation" or not name.startswith("PP:") or "_" in name \
                    or name[4:5] not in "FIWB" or not name[5:6].isdigit():
                continue
            end = e["ts"] + e["dur"]
            kids = [c for c in xs if c.get("cat") == "cpu_op" and e["ts"] <= c["ts"] <= end]
            assert kids, name
            step = next(n for a, b, n in marks if a <= e["ts"] <= b)
            op = ("llm", FROM_TORCH[name[4]], int(name[3]), int(name[5:]))
            out[(step, rank, op)] = (min(c["ts"] for c in kids) + LAG + shift,
                                     max(c["ts"] + c["dur"] for c in kids) + LAG + shift)
    return out


def runs_count(db: str) -> int:
    got = cli("runs", "list", "--db", db, "--json")
    assert got.code == 0, got.err
    return len(json.loads(got.out))


def test_an_ascend_job_imports_in_torchs_order_with_device_times_and_communication(kineto, tmp_path):
    root, docs = kineto
    job = write_job(docs, tmp_path / "job")
    names = sorted(p.name for p in job.iterdir())
    assert names == [folder_name(1, 2), folder_name(0, 2)]  # the folders sort in the reverse of the rank order
    db = str(tmp_path / "m.db")
    got = cli("import-trace", str(job), "--db", db, "--json")
    assert got.code == 0, got.err
    doc = json.loads(got.out)
    assert doc["format"] == "ascend" and doc["term"] == TERM and doc["term_inferred"]
    assert doc["device_side"] is True
    expected = torch_order(root)
    rows = json.loads(cli("runs", "show", str(doc["id"]), "--db", db, "--timings", "--json").out)["timings"]
    steps = sorted({r["step"] for r in rows})
    assert steps == [0, 1]
    for step in steps:
        for rank, want in enumerate(expected):
            got_order = [(t["module"], t["kind"], t["chunk"], t["microbatch"])
                         for t in sorted((t for t in rows if t["step"] == step and t["device"] == rank),
                                         key=lambda t: t["start"])]
            assert got_order == want, (step, rank)
    want = device_times(docs)
    first_step = min(n for n, _, _ in want)
    origin = min(a for a, _ in want.values())
    assert len(rows) == len(want)
    for t in rows:
        a, b = want[(first_step + t["step"], t["device"], (t["module"], t["kind"], t["chunk"], t["microbatch"]))]
        assert abs(t["start"] * 1e6 - (a - origin)) < 1.0, t
        assert abs(t["end"] * 1e6 - (b - origin)) < 1.0, t
    # every PP: send and receive range of the run is a communication row of its kind
    sends = [sum(1 for e in d["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("PP:")
                 and "SEND" in e["name"]) for d in docs]
    receives = [sum(1 for e in d["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("PP:")
                    and "RECV" in e["name"]) for d in docs]
    assert doc["communication_per_rank"] == [{"receive": receives[r], "send": sends[r]} for r in range(2)]
    assert min(sends) > 0 and min(receives) > 0
    print(f"\nascend layout: {doc['ops_per_rank']} ops per rank in torch's order, communication "
          f"{doc['communication_per_rank']}")
    # the step_trace_time.csv beside each trace is the run's step summary: compare-run sets it beside a prediction
    got = cli("compare-run", str(doc["id"]), "--against", TERM, "-w", "uniform", "--db", db, "--json")
    assert got.code == 0, got.err
    ranks = json.loads(got.out)["step_summary"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["verdict"] for r in ranks)
    receive_ms = [sum(e["dur"] for e in d["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("PP:")
                      and "RECV" in e["name"]) / 1e3 / 2 for d in docs]  # mean over the two steps
    assert [r["bubble_ms"] for r in ranks] == pytest.approx(receive_ms, abs=1e-3)
    print(cli("compare-run", str(doc["id"]), "--against", TERM, "-w", "uniform", "--db", db).out)


@pytest.mark.parametrize("case", ["cut", "no-info", "same-rank"])
def test_malformed_ascend_folders_are_one_error_and_save_nothing(kineto, tmp_path, case):
    _, docs = kineto
    db = str(tmp_path / "m.db")
    job = tmp_path / "job"
    job.mkdir()
    write_ascend_folder(docs[0], job, folder_name(0, 2))
    bad = folder_name(1, 2)
    if case == "cut":
        write_ascend_folder(docs[1], job, bad, cut=True)
        message = f"error: {job / bad / 'ASCEND_PROFILER_OUTPUT' / 'trace_view.json'}: cut off mid-write (no closing ']'); re-export the profiler data"
    elif case == "no-info":
        write_ascend_folder(docs[1], job, bad, with_info=False)
        message = f"error: {job / bad}: no profiler_info_<rank>.json in this profiler folder; cannot tell its rank"
    else:
        other = json.loads(json.dumps(docs[1]))
        other["distributedInfo"]["rank"] = 0
        write_ascend_folder(other, job, bad)
        message = (f"error: two files for rank 0: {job / bad / 'ASCEND_PROFILER_OUTPUT' / 'trace_view.json'} and "
                   f"{job / folder_name(0, 2) / 'ASCEND_PROFILER_OUTPUT' / 'trace_view.json'}")
    before = runs_count(db)
    got = cli("import-trace", str(job), "--db", db)
    assert got.code == 2
    assert got.error_lines == [message]
    assert runs_count(db) == before == 0
    shutil.rmtree(job)
