"""`mpipe plan --emit STACK` never throws the plan away: it prints the table,
then the launch configuration of the fastest layout the stack can run and how
much slower it is than the winner; `--runnable-by STACK` ranks only what the
stack can run; and a refusal never sends the user to a stack that refuses the
same layout."""
from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.formats.launch_config import LAUNCH_TARGETS, emit, launch_files, refusal_of
from mpipe_core.search.plan import plan

# The plan tests' tiny dense model and MLLM on one DGX A100 node: the whole space is searched.
TINY = {"model": {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 128, "vocab": 1000, "ffn": 1024},
        "device": "a100", "cluster": "dgx-a100"}
TINY_MLLM = dict(TINY, encoders=[{"name": "vision", "trainable": True,
                                  "vit": {"hidden": 128, "layers": 2, "heads": 2, "patches_per_image": 16,
                                          "image_size": 64}}])
ARGS = ["--devices", "4", "--global-batch", "8"]


def _runs(candidate, target: str) -> bool:
    """Independently of `formats.runnable`: the exporter on a full evaluation."""
    try:
        emit(candidate.document, candidate.term, 8, target)
    except MpipeError:
        return False
    return True


def _plan(workload, **kw):
    return plan(workload, 4, 8, top=5, time_limit=600, **kw)


@pytest.mark.parametrize("workload, target, label", [(TINY, "megatron", "Megatron-LM"),
                                                     (TINY_MLLM, "mindspeed-mm", "MindSpeed-MM")])
def test_emit_prints_the_table_then_the_fastest_layout_the_stack_runs(tmp_path, workload, target, label):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload))
    got = run_cli(["plan", "-w", str(path), *ARGS, "--emit", target])
    assert got.code == 0 and got.traceback is None, got.err
    expected = _plan(workload)
    assert expected.searched["not_tried"] == 0
    fitting = [c for c in expected.candidates if c.within_cap]
    index = next(i for i, c in enumerate(fitting) if _runs(c, target))
    assert index > 0  # the winner is a schedule the stack does not run: the case the issue met
    chosen = fitting[index]
    table = got.out.split("\n# ")[0]
    assert f" 1 {fitting[0].step_time_s:>8.4g}" in table and fitting[0].term in table  # the plan is kept
    slower = chosen.step_time_s / fitting[0].step_time_s - 1
    skipped = "#1" if index == 1 else f"#1–#{index}"
    head = (f"# {target}: {label} cannot run {skipped}; #{index + 1} is {slower:.1%} slower: "
            f"{chosen.step_time_s:.4g} s, {chosen.layout.label()}  {chosen.term}")
    assert head in got.out.splitlines()
    assert got.out.rstrip("\n").endswith(emit(chosen.document, chosen.term, 8, target).rstrip("\n"))


def test_emit_json_names_the_candidate_and_its_slowdown(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(TINY))
    got = run_cli(["plan", "-w", str(path), *ARGS, "--emit", "megatron", "--json"])
    assert got.code == 0, got.err
    doc = json.loads(got.out)["emit"]
    fitting = [c for c in _plan(TINY).candidates if c.within_cap]
    chosen = fitting[doc["candidate"] - 1]
    assert doc["term"] == chosen.term and _runs(chosen, "megatron")
    assert not any(_runs(c, "megatron") for c in fitting[:doc["candidate"] - 1])
    assert doc["slower"] == chosen.step_time_s / fitting[0].step_time_s - 1
    assert doc["text"] == emit(chosen.document, chosen.term, 8, "megatron")


def test_runnable_by_ranks_only_what_the_stack_runs_and_its_best_is_emit_s_choice(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(TINY_MLLM))
    got = run_cli(["plan", "-w", str(path), *ARGS, "--runnable-by", "mindspeed-mm", "--top", "4", "--json"])
    assert got.code == 0, got.err
    doc = json.loads(got.out)
    assert doc["runnable_by"] == "mindspeed-mm" and len(doc["candidates"]) == 4
    for c in doc["candidates"]:
        emit(c["workload"], c["term"], 8, "mindspeed-mm")  # raises if the stack cannot run it
    fitting = [c for c in _plan(TINY_MLLM).candidates if c.within_cap]
    first = next(c for c in fitting if _runs(c, "mindspeed-mm"))
    assert (doc["best"]["term"], doc["best"]["step_time_s"]) == (first.term, first.step_time_s)


def test_a_stack_that_runs_none_still_prints_the_plan_then_one_error_line(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(TINY_MLLM))
    got = run_cli(["plan", "-w", str(path), *ARGS, "--emit", "megatron"])
    assert got.code == 2 and got.traceback is None
    assert got.out.startswith("4 devices on dgx-a100, global batch 8")  # the plan, not thrown away
    evaluated = len([c for c in _plan(TINY_MLLM).candidates if c.within_cap])
    assert got.error_lines == [
        f"error: --emit megatron: Megatron-LM can run none of the {evaluated} layouts the plan evaluated within "
        f"the memory cap (#1: --format megatron cannot express this workload: Megatron-LM's launch arguments "
        f"place no encoder, and the workload has vision)"]
    got = run_cli(["plan", "-w", str(path), *ARGS, "--runnable-by", "megatron"])
    assert got.code == 2 and got.error_lines == [
        "error: --runnable-by megatron: Megatron-LM's launch arguments place no encoder, and the workload has "
        "vision"]


@pytest.mark.parametrize("term, workload", [
    ("1f1b(p=4, m=8)", "internvl-26b"),  # Megatron places no encoder; MindSpeed-MM and torchtitan do
    ("zbv(p=4, m=8)", "internvl-26b"),  # only torchtitan runs a V
    ("transpose(1f1b(p=4, m=8))", "internvl-26b"),  # nobody runs the encoder off the first stage
    ("gpipe(p=4, m=8)", "llama2-7b"),
])
def test_a_refusal_names_only_targets_that_run_the_layout(term, workload):
    ev = evaluate(term, workload)
    for target in LAUNCH_TARGETS:
        try:
            launch_files(ev, 8, target)
        except MpipeError as error:
            message = error.message
            assert "use --emit" not in message and "--format mindspeed-mm" not in message.split(": ", 1)[1]
            hint = message.rsplit(" (", 1)[1].removesuffix(" can run it)") if message.endswith("can run it)") else ""
            named = [t for t in hint.split(" and ") if t]
            assert named == [t for t in LAUNCH_TARGETS if t != target and refusal_of(ev, 8, t) is None], message


def test_emit_mpipe_writes_the_winner_as_a_run_spec_that_run_reads(tmp_path):
    from mpipe_core.runs.run_spec import read_run_spec

    path = tmp_path / "w.json"
    path.write_text(json.dumps(TINY_MLLM))
    spec_path = tmp_path / "run.json"
    got = run_cli(["plan", "-w", str(path), *ARGS, "--emit", "mpipe", "-o", str(spec_path)])
    assert got.code == 0 and got.traceback is None, got.err
    best = _plan(TINY_MLLM).best
    spec = read_run_spec(spec_path)  # what `mpipe run --spec` reads
    assert spec.term == best.term and spec.workload == best.document
    assert spec.layout.world == best.layout.tp * best.layout.cp * best.layout.pp * best.layout.dp
    assert f"# mpipe: #1 written as a run spec to {spec_path} ({spec.layout.world} ranks)" in got.out
    assert f" 1 {best.step_time_s:>8.4g}" in got.out.split("\n# ")[0]  # the table first


@pytest.mark.parametrize("argv, message", [
    (["--emit", "mpipe"], "error: --emit mpipe writes the winner as a run spec file: give -o FILE"),
    (["--emit", "megatron", "-o", "x.json"],
     "error: -o FILE is where --emit mpipe writes its run spec; the stacks' files print on stdout"),
])
def test_emit_mpipe_options_are_checked_before_the_search(tmp_path, monkeypatch, argv, message):
    import mpipe_core.search.plan as plan_module

    def no_search(*args, **kwargs):
        raise AssertionError("searched before refusing the options")

    monkeypatch.setattr(plan_module, "plan", no_search)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(TINY_MLLM))
    got = run_cli(["plan", "-w", str(path), *ARGS, *argv])
    assert (got.code, got.err.strip(), got.traceback) == (2, message, None)
