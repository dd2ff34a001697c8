"""What the third newcomer pass found wrong in the app (issue 32), each driven
through AppTest: a saving praised for a schedule that cannot fit, suggestions
that fail when clicked, the Tune page showing less than the CLI, labels that drop
the parallel settings, the Runs page, and device counts that ignore tp."""
from __future__ import annotations

import shlex

from app_helpers import button, errors, figure, metric, open_page, shown, start_app, table_of

from mpipe_core.api import evaluate
from mpipe_core.compare import compare
from mpipe_core.workloads.units import quantity, seconds
from mpipe_core.workloads.workload import load_workload, with_parallel

INTERNVL_TP8_SP = with_parallel(load_workload("internvl-26b"), {"tp": 8, "sp": True})


def figure_title(at, index: int = 0) -> str:
    return figure(at, index)["layout"]["title"]["text"]


def term_errors(at) -> list[str]:
    """The page's errors but the memory verdict (a schedule that does not fit still evaluates)."""
    return [e for e in errors(at) if not e.startswith("Does not fit in ")]


def _internvl_tp8_sp(at, key: str = "wl"):
    """The picker set to InternVL-26B with tp=8 and sequence parallelism."""
    at.selectbox(key=f"{key}.preset").select("internvl-26b").run()
    at.number_input(key=f"{key}.parallel.tp").set_value(8)
    at.checkbox(key=f"{key}.parallel.sp").check()
    return at.run()


# --- 2. Before / after gives the fit verdict beside the saving ----------------------------------

def test_before_after_says_first_that_a_transposed_schedule_over_the_devices_memory_does_not_fit(db_url):
    at = start_app()
    at.text_area(key="designer.term").input("zbv(p=8, m=16)")
    at = _internvl_tp8_sp(at)
    at = open_page(at, "before_after")
    assert not at.exception
    after = "transpose(zbv(p=8, m=16), mode=dynamic)"
    assert at.text_input(key="ba.after").value == after
    ev = evaluate(after, INTERNVL_TP8_SP)
    peak = max(ev.metrics.peak_memory)
    assert quantity(peak, "GB") == "147.6 GB" and ev.workload.capacity == 64
    # No green saving for a schedule that cannot run: the verdict is red, and its first line is the fit.
    assert not at.success
    verdicts = [shown(e.value) for e in at.error if "transpose saves" in e.value]
    assert len(verdicts) == 1
    first, second = verdicts[0].split("  \n")
    over = sum(1 for p in ev.metrics.peak_memory if p > 64)
    worst = max(range(8), key=ev.metrics.peak_memory.__getitem__)
    assert first == (f"{after} does not fit in 64 GB: device {worst} needs 147.6 GB, "
                     f"{quantity(peak - 64, 'GB')} over ({over} of 8 devices over)")
    [_, row] = compare(["zbv(p=8, m=16)", after], INTERNVL_TP8_SP)
    assert row.transpose.saved > 0 and second == f"Were memory no limit: {row.transpose.verdict()}"
    # Beside the speedup card: the fit of both sides.
    before = evaluate("zbv(p=8, m=16)", INTERNVL_TP8_SP).timeline.makespan
    assert metric(at, "Speedup") == f"{before / ev.timeline.makespan:.3g}x" == "3.38x"
    assert metric(at, "Fits after") == "no"
    assert errors(at)[:2] == [f"After: {first}.", "Before: zbv(p=8, m=16) does not fit in 64 GB: device 0 needs "
                              "338.1 GB, 274.1 GB over (1 of 8 devices over)."]
    assert len(errors(at)) == 3


# --- 3. every suggestion evaluates before it is offered ----------------------------------------

def test_a_balanced_term_is_not_offered_a_transpose_that_fails_but_its_body_transposed(db_url):
    at = start_app()
    at.text_area(key="designer.term").input("balanced(zbv(p=8, m=16))")
    at = _internvl_tp8_sp(at)
    assert not at.exception and not errors(at)
    labels = [b.label for b in at.button]
    assert not any(label.startswith("Transpose it:") for label in labels), labels
    assert any(shown(c.value) == "transpose(balanced(zbv(p=8, m=16)), mode=dynamic) is not offered: transpose: "
               "balanced(...) already folded the encoders into the LLM chunks (transpose the inner term "
               "instead, or use partition)" for c in at.caption)
    body = "transpose(zbv(p=8, m=16), mode=dynamic)"
    button(at, f"Transpose its body instead: {body}").click().run()
    assert not at.exception and not term_errors(at)
    assert at.text_area(key="designer.term").value == body
    assert metric(at, "Makespan") == quantity(evaluate(body, INTERNVL_TP8_SP).timeline.makespan, "ms")
    # Before / after on the balanced term: the balanced term (what you would run) against its body
    # transposed, never the transpose of balanced(...) that fails.
    at.text_area(key="designer.term").input("balanced(zbv(p=8, m=16))").run()
    at = open_page(at, "before_after")
    assert not at.exception
    assert (at.text_input(key="ba.before").value, at.text_input(key="ba.after").value) == \
        ("balanced(zbv(p=8, m=16))", body)
    assert any(b.label == "Take both from the Designer's term" for b in at.button)


def test_the_designer_offers_only_the_examples_that_evaluate_on_the_workload(db_url):
    from app.widgets import EXAMPLES

    at = start_app()
    at.selectbox(key="wl.preset").select("llama2-7b").run()  # no encoders: no transpose, no encoder_stage
    offered = at.selectbox(key="designer.example").options[1:]
    assert offered == [name for name, term in EXAMPLES.items() if "transpose" not in term and "encoder" not in term]
    assert len(offered) == 5
    assert any(shown(c.value) == "4 of the 9 examples do not evaluate on llama2-7b and are not offered."
               for c in at.caption)
    for name in offered:
        at.selectbox(key="designer.example").select(name).run()
        assert not at.exception and not term_errors(at), (name, errors(at))
        assert metric(at, "Makespan") == quantity(evaluate(EXAMPLES[name], "llama2-7b").timeline.makespan, "ms")


# --- 4. the Tune page shows what the CLI prints ------------------------------------------------

def test_tune_shows_every_baseline_the_cli_prints_one_count_and_both_bounds_named(db_url):
    import json

    from mpipe_cli.tune_commands import render
    from mpipe_core.search.tune import tune
    from mpipe_core.workloads.presets import preset_document

    # vit-heavy-small on devices of 9: all five baselines, candidates over the cap, and own bounds that differ.
    doc = {**preset_document("vit-heavy-small"), "device": {"memory": 9}}
    at = open_page(start_app(), "tune")
    at.radio(key="tune.wl.source").set_value("JSON").run()
    at.text_area(key="tune.wl.json").input(json.dumps(doc)).run()
    at.number_input(key="tune.devices").set_value(2)
    at.number_input(key="tune.microbatches").set_value(4)
    at.slider(key="tune.limit").set_value(5)
    button(at, "Search").click().run()
    assert not at.exception and not errors(at), errors(at)
    expected = tune(doc, 2, 4, 9, 5.0, cap_is_capacity=True)
    assert expected.not_tried == 0  # the whole search: the page's is the same
    # The CLI's baseline block: one line per baseline, its name padded to 26 characters, the term after "x  ".
    lines = render(expected.as_dict()).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("baseline "))
    end = next(i for i, line in enumerate(lines) if line.startswith("(speedup"))
    cli = [(line[:26].strip(), line.split("x  ", 1)[1].split("  (")[0]) for line in lines[start + 1:end]]
    assert [name for name, _ in cli] == ["fused", "balanced", "colocated (Megatron MIMO)", "disaggregated (best)",
                                         "transpose (best)"]
    baselines = table_of(at, "baseline")
    assert list(zip(baselines["baseline"], baselines["term"])) == cli
    assert list(baselines["speedup over fused"]) == [f"{expected.fused.makespan / c.makespan:.2f}x"
                                                     for c in expected.baselines().values()]
    # One count, with its parts (not "7 candidates" beside "125 candidates over the cap").
    fit, over = len(expected.candidates), len(expected.over_cap)
    assert fit and over
    assert any(shown(c.value).startswith(f"{fit + over} candidates evaluated: {fit} within the memory cap, {over} "
                                         f"over it; ") for c in at.caption)
    assert not any("candidates over the cap" in shown(c.value) for c in at.caption)
    # Both lower bounds, each named: the search's (tune's column) and the term's own (eval's, the Designer's).
    best = expected.best
    assert metric(at, "Efficiency vs the search's LB") == f"{expected.lower_bound / best.makespan:.1%}"
    assert metric(at, "Efficiency vs its own LB") == f"{evaluate(best.term, doc).metrics.efficiency:.1%}"
    rows = table_of(at, "term")
    search_eff = [f"{expected.lower_bound / c.makespan:.1%}" for c in expected.candidates]
    own_eff = [f"{evaluate(c.term, doc).metrics.efficiency:.1%}" for c in expected.candidates]
    assert list(rows["eff. vs the search's LB"]) == search_eff and list(rows["eff. vs its own LB"]) == own_eff
    assert sum(a != b for a, b in zip(search_eff, own_eff)) == 8  # the same schedule, two figures: both named


# --- devices in all: tp × pp (× dp), never the pipeline's alone ----------------------------------

def test_pages_count_every_device_tp_times_pp_times_dp_with_the_parts(db, db_url):
    from storage import save_schedule

    term = "zbv(p=8, m=16)"
    ops = evaluate(term, INTERNVL_TP8_SP).metrics.ops
    at = start_app()
    at.text_area(key="designer.term").input(term)
    at = _internvl_tp8_sp(at)
    # not "8 · 768"; InternVL's device is a 910C die: two to an NPU
    assert (metric(at, "Devices in all (tp 8 × pp 8; 32 NPUs, 2 dies each)"), metric(at, "Ops")) == ("64", f"{ops:,}")
    summary = evaluate(term, INTERNVL_TP8_SP).summary()
    assert summary["devices_total"] == 64  # the cluster model's count, the same
    # The cluster model's figures lead: MFU and the step time before the makespan.
    assert [m.label for m in at.metric[:4]] == ["Step time", "MFU", "Devices in all (tp 8 × pp 8; 32 NPUs, 2 dies each)", "Tokens / s"]
    assert metric(at, "MFU") == f"{summary['mfu']:.1%}"
    assert metric(at, "Step time") == seconds(summary['step_time_s'])
    at.number_input(key="wl.parallel.dp").set_value(4).run()
    assert metric(at, "Devices in all (tp 8 × pp 8 × dp 4; 128 NPUs, 2 dies each)") == "256"
    at.number_input(key="wl.parallel.dp").set_value(1).run()
    at = open_page(at, "before_after")
    metrics = table_of(at, "")
    assert list(metrics.loc[metrics[""] == "devices", "before"]) == ["64 (tp 8 × pp 8; 32 NPUs, 2 dies each)"]
    at = open_page(at, "compare")
    at.text_area(key="cmp.terms").input(f"{term}\n1f1b(p=4, m=16)").run()
    times = table_of(at, "schedule")
    assert list(times["devices"]) == ["64 (tp 8 × pp 8; 32 NPUs, 2 dies each)", "32 (tp 8 × pp 4; 16 NPUs, 2 dies each)"]
    assert list(times.columns[:3]) == ["schedule", "step time", "MFU"]
    assert times["MFU"][0] == f"{summary['mfu']:.1%}"
    assert any("different device counts (32, 64)" in shown(i.value) for i in at.info)
    # A saved workload keeps its settings: the library's diff counts them too.
    doc = INTERNVL_TP8_SP.to_dict()
    save_schedule(db, "wide", term, workload=doc)
    save_schedule(db, "wide", "zbv(p=4, m=16)", workload=doc, update=True)
    at = open_page(at, "library")
    diff = table_of(at, "metric")
    row = diff[diff["metric"] == "devices"].iloc[0]
    assert (row["wide@1"], row["wide@2"], row["change"]) == ("64 (tp 8 × pp 8; 32 NPUs, 2 dies each)",
                                                             "32 (tp 8 × pp 4; 16 NPUs, 2 dies each)", "-32")
    at = open_page(at, "tune")
    at.selectbox(key="tune.wl.preset").select("internvl-26b").run()
    at.number_input(key="tune.wl.parallel.tp").set_value(8).run()
    at.number_input(key="tune.devices").set_value(8).run()
    assert any(shown(c.value).startswith("Devices in all: 64 (tp 8 × pp 8; 32 NPUs, 2 dies each)") for c in at.caption)


# --- 6. the Runs page ------------------------------------------------------------------------

def _finished(db, name: str, term: str, spans: list[float], *, options=None, log_tail: str = "",
              status: str = "succeeded", error: str | None = None):
    """A run of `term` the worker finished: step k's timeline is the simulated one x spans[k] ms per unit."""
    from storage import add_timings, claim_next_run, enqueue, finish_run, save_schedule

    save_schedule(db, name, term, workload="vit-heavy-small")
    run = enqueue(db, name, steps=len(spans), options=options or {})
    claim_next_run(db, "w", 60)
    ev, rows, t0 = evaluate(term, "vit-heavy-small"), [], 100.0
    for step, scale in enumerate(spans):
        rows += [r._replace(step=step, start=t0 + r.start * scale / 1000, end=t0 + r.end * scale / 1000)
                 for r in ev.timeline.records()]
        t0 += ev.timeline.makespan * scale / 1000 + 0.01
    add_timings(db, run.id, rows)
    finish_run(db, run.id, "w", status, exit_code=0, log_tail=log_tail, error=error)
    return run, ev


def test_a_preset_model_that_cannot_train_the_workload_is_refused_before_queueing(db, db_url):
    from storage import list_runs, save_schedule

    save_schedule(db, "frozen", "1f1b(p=2, m=2)", workload="vit-heavy-small")  # its encoder: vision, frozen
    at = open_page(start_app(), "runs")
    at.radio(key="runs.model.kind").set_value("Built-in preset").run()
    at.selectbox(key="runs.model.preset").select("tiny").run()
    message = "model preset 'tiny' has encoder vision (trainable), but the schedule's workload has vision (frozen)"
    assert [shown(w.value) for w in at.warning] == [
        f"{message}: pick another model (or the one sized from the workload) to launch it."]
    button(at, "Launch").click().run()
    assert errors(at) == [message] and list_runs(db) == []  # refused here, never queued
    at.selectbox(key="runs.model.preset").select("tiny-frozen").run()
    assert not at.warning
    button(at, "Launch").click().run()
    assert not errors(at) and [r.options for r in list_runs(db)] == [{"model": "tiny-frozen"}]


def test_the_gradient_checks_verdict_is_a_badge_in_the_runs_header(db, db_url):
    from storage import list_runs

    # The line the worker writes under "--- worker ---" (executor.service.queue_worker), and a failed check's error.
    passed, _ = _finished(db, "g", "1f1b(p=2, m=2)", [1.0, 1.0], options={"check_grads": True},
                          log_tail="rank 0 ok\n--- worker ---\ngrad check PASS: max abs error 2.4e-07, max rel "
                                   "error 3.1e-06, loss error 0\n")
    failed, _ = _finished(db, "h", "1f1b(p=2, m=2)", [1.0, 1.0], options={"check_grads": True}, status="failed",
                          error="gradient check failed: the pipelined gradients differ from the reference "
                                "(max rel error 0.5); step 0: llm.h.0.attn.w on rank 1")
    plain_run, _ = _finished(db, "k", "1f1b(p=2, m=2)", [1.0, 1.0])
    differ, _ = _finished(db, "m", "1f1b(p=2, m=2)", [1.0, 1.0], options={"check_grads": True}, status="failed",
                          log_tail="--- worker ---\ngrad check FAIL: ran; gradients differ: worst tensor vision.pos "
                                   "(gradient, step 2, rank 0): off by 7.9e-11, 3.2x the allowed 2.5e-11\n",
                          error="ran; gradients differ: worst tensor vision.pos (gradient, step 2, rank 0): off by "
                                "7.9e-11, 3.2x the allowed 2.5e-11")
    assert [r.id for r in list_runs(db)] == [differ.id, plain_run.id, failed.id, passed.id]
    at = open_page(start_app(), "runs")
    badges = lambda: [m.value for m in at.markdown if "-badge[" in m.value]  # noqa: E731
    at.selectbox(key="runs.selected").set_value(plain_run.id).run()
    assert badges() == []  # no check asked for, no badge
    at.selectbox(key="runs.selected").set_value(passed.id).run()
    assert badges() == [":green-badge[:material/check_circle: Gradient check PASS]"]
    assert any(shown(c.value) == "Gradient check against single-process references (float32 and float64): max abs "
               "error 2.4e-07, max rel error 3.1e-06, loss error 0." for c in at.caption)
    at.selectbox(key="runs.selected").set_value(failed.id).run()
    # A run whose gradients differ ran to the end: not shown as a crash ("failed"), and its worst tensor is named.
    assert badges() == [":red-badge[:material/error: Ran; gradients differ]"]
    assert any(shown(c.value).startswith("Gradient check against single-process references (float32 and "
                                         "float64): the pipelined gradients differ") for c in at.caption)
    assert metric(at, "Status") == "ran; gradients differ"
    at.selectbox(key="runs.selected").set_value(differ.id).run()
    assert badges() == [":red-badge[:material/error: Ran; gradients differ]"]
    assert any(shown(c.value) == "Gradient check against single-process references (float32 and float64): worst "
               "tensor vision.pos (gradient, step 2, rank 0): off by 7.9e-11, 3.2x the allowed 2.5e-11."
               for c in at.caption)
    assert metric(at, "Status") == "ran; gradients differ"
    frame = table_of(at, "run", has="status")
    statuses = dict(zip(frame["run"], frame["status"]))
    assert statuses[differ.id] == statuses[failed.id] == "ran; gradients differ" and statuses[passed.id] == "succeeded"


def test_a_long_runs_step_picker_is_a_slider_with_first_median_and_last(db, db_url):
    spans = [3.0] + [1.0 + (k * 37 % 149) / 1000 for k in range(1, 150)]  # 150 steps, each its own makespan
    run, ev = _finished(db, "long", "1f1b(p=2, m=2)", spans)
    at = open_page(start_app(), "runs")
    assert not at.exception and not errors(at), errors(at)
    assert [r.key for r in at.radio if len(r.options) > 5] == []  # not 150 radio buttons (the model picker has 5)
    assert at.radio(key=f"runs.view.{run.id}").options == ["mean of steps 1–149", "one step"]
    assert metric(at, "Measured makespan (mean of steps 1–149)")
    at.radio(key=f"runs.view.{run.id}").set_value("one step").run()
    slider = at.select_slider(key=f"runs.step.{run.id}")
    assert slider.options == [str(s) for s in range(1, 150)] and slider.value == 1
    median = sorted(range(1, 150), key=lambda s: spans[s])[74]
    for label, step in (("last (149)", 149), (f"median ({median})", median), ("first (1)", 1)):
        button(at, label).click().run()
        assert at.select_slider(key=f"runs.step.{run.id}").value == step
        assert metric(at, f"Measured makespan (step {step})") == quantity(ev.timeline.makespan * spans[step], "ms")


def test_the_runs_table_and_the_runs_header_agree_whenever_the_worker_claims_the_run(db, db_url, monkeypatch):
    """The worker may claim a queued run at any moment while the page draws: the
    table and the header must come from one read, so they show one status."""
    import storage
    from storage import claim_next_run, enqueue, save_schedule

    save_schedule(db, "q", "1f1b(p=2, m=2)")
    real = {name: getattr(storage, name) for name in ("list_runs", "get_run")}
    for claim_after in range(1, 6):
        run = enqueue(db, "q")
        reads = []

        def counted(name):
            def read(*args, **kwargs):
                out = real[name](*args, **kwargs)
                reads.append(name)
                if len(reads) == claim_after:
                    claim_next_run(db, "w", 60)  # the worker claims it, between two of the page's reads
                return out
            return read

        for name in real:
            monkeypatch.setattr(storage, name, counted(name))
        at = open_page(start_app(), "runs")
        for name, function in real.items():
            monkeypatch.setattr(storage, name, function)
        assert not at.exception
        table = table_of(at, "run")
        [in_table] = list(table.loc[table["run"] == run.id, "status"])
        assert (in_table, metric(at, "Status")) in (("queued", "queued"), ("running", "running")), (
            claim_after, reads, in_table, metric(at, "Status"))


# --- 5. library labels name the full workload ---------------------------------------------------

def test_library_labels_name_the_parallel_settings_and_give_the_command_that_reevaluates(db, db_url):
    import json
    import subprocess
    import sys

    from app_helpers import REPO
    from storage import get_version

    term = "zbv(p=8, m=16)"
    at = start_app()
    at.text_area(key="designer.term").input(term)
    at = _internvl_tp8_sp(at)
    assert figure_title(at).endswith(" on internvl-26b tp=8,sp")  # the name the library and the CLI use
    at.text_input(key="designer.save_name").input("wide")
    button(at, "Save").click().run()
    stored = get_version(db, "wide@1")
    at = open_page(at, "library")
    assert not at.exception and not errors(at), errors(at)
    assert list(table_of(at, "name")["workload"]) == ["internvl-26b tp=8,sp"]  # not "internvl-26b"
    assert list(table_of(at, "version")["workload"]) == ["internvl-26b tp=8,sp"]
    assert any(shown(c.value).startswith("workload internvl-26b tp=8,sp · makespan ") for c in at.caption)
    command = "mpipe eval 'zbv(p=8, m=16)' -w internvl-26b --parallel tp=8,sp"
    assert [c.value for c in at.code if c.value.startswith("mpipe eval")] == [command]
    # The command gives the stored figures (eval on the bare preset gave another makespan).
    out = subprocess.run([sys.executable, "-m", "mpipe_cli.main", *command.split()[1:2], term,
                          *command.split("'")[2].split(), "--json"], cwd=REPO, capture_output=True, text=True,
                         timeout=300, check=True)
    assert json.loads(out.stdout)["makespan"] == stored.metric("makespan")
    assert evaluate(term, "internvl-26b").timeline.makespan != stored.metric("makespan")


def test_a_presets_document_edited_in_json_is_labelled_edited(db, db_url):
    import json

    from mpipe_core.workloads.presets import preset_document

    doc = preset_document("llava-7b")
    doc["encoders"][0]["trainable"] = True  # the preset's vision tower is frozen
    at = start_app()
    at.radio(key="wl.source").set_value("JSON").run()
    at.text_area(key="wl.json").input(json.dumps(doc)).run()
    assert not at.exception and not errors(at), errors(at)
    assert figure_title(at).endswith(" on llava-7b (edited)")
    at.text_input(key="designer.save_name").input("edited")
    at.button(key="designer.save").click().run()
    at = open_page(at, "library")
    assert list(table_of(at, "name")["workload"]) == ["llava-7b (edited)"]
    # No preset and settings rebuild it: the command reads the version's own document.
    assert [c.value for c in at.code if c.value.startswith("mpipe eval")] == \
        [f"mpipe eval 'transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)' -w version:edited@1 "
         f"--db {shlex.quote(db_url)}"]


def test_compare_divides_every_rows_makespan_by_one_lower_bound_on_one_workload(db_url):
    """Finding 9 on the page: on llava-7b the disaggregated layout runs slower than 1f1b(p=4) but
    had the higher efficiency against its own (lower) bound; against one bound the faster row is
    the more efficient, as `mpipe compare` prints."""
    terms = ["1f1b(p=4, m=8)", "disaggregate(1f1b(p=3, m=8), encoder_devices=1)"]
    at = open_page(start_app(), "compare")
    at.selectbox(key="wl.preset").select("llava-7b").run()
    at.text_area(key="cmp.terms").input("\n".join(terms)).run()
    assert not at.exception and not errors(at)
    rows = compare(terms, "llava-7b")
    bound = min(r.evaluation.metrics.lower_bound for r in rows)
    table = table_of(at, "schedule", has="efficiency")
    spans = [r.evaluation.timeline.makespan for r in rows]
    assert list(table["efficiency"]) == [f"{100 * bound / span:.1f}%" for span in spans]
    assert spans[0] < spans[1] and float(table["efficiency"][0][:-1]) > float(table["efficiency"][1][:-1])
    assert any("one bound for every row" in shown(c.value) for c in at.caption)


def test_a_run_of_another_models_workload_is_never_scored_as_a_prediction(db, db_url):
    # A version saved with InternVL-26B on 512 dies (tp=8, dp=16, a 4-stage pipeline) ran on the built-in
    # model on 4 CPU ranks: the page says so, compares with a fit by default, and labels the saved
    # workload's figures across models, never "Prediction error".
    from storage import add_timings, claim_next_run, enqueue, finish_run, save_schedule
    from mpipe_core.workloads.presets import preset_document

    term = "1f1b(p=4, m=8)"
    doc = dict(preset_document("internvl-26b"), parallel={"tp": 8, "dp": 16})
    save_schedule(db, "big", term, workload=doc)
    run = enqueue(db, "big", steps=2)
    claim_next_run(db, "w", 60)
    ev, rows, t0 = evaluate(term, doc), [], 100.0
    for step in range(2):  # the tiny model measures a thousandth of the big one's times
        rows += [r._replace(step=step, start=t0 + r.start / 1e6, end=t0 + r.end / 1e6) for r in ev.timeline.records()]
        t0 += ev.timeline.makespan / 1e6 + 0.01
    add_timings(db, run.id, rows)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    at = open_page(start_app(), "runs")
    assert not at.exception and not errors(at), errors(at)
    assert [shown(w.value) for w in at.warning] == [
        "The workload internvl-26b (model internlm2-20b on ascend-910c) is another model than the one that ran: a "
        "comparison with it is across models, not a prediction of this run. Of the workload's layout, tp=8, dp=16 "
        "was dropped: it spans 512 devices, this run executed the 4-device pipeline."]
    picker = at.selectbox(key=f"runs.workload.{run.id}")
    assert picker.value == "fit" and metric(at, "Fit error (no prediction)")
    picker.select("launched").run()
    assert metric(at, "Across models (no prediction)")
    assert not any(m.label == "Prediction error" for m in at.metric)
