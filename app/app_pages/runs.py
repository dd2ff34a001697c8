"""Runs: launch a saved schedule version on real devices, follow its measured
timeline while it runs, then compare it with the simulator's prediction
(one step or the mean of steps), and calibrate a workload from it; who
launched and cancelled what.  Runs another stack made come in as uploaded
traces (`app.trace_upload`) and are shown like any run, marked as imported.
Launching, cancelling, calibrating and profiling are an operator's, importing
traces a designer's (`app.auth`)."""
import re

import numpy as np
import pandas as pd
import streamlit as st

from app import auth, run_comm, run_steps, run_summary_view, state, trace_upload, widgets
from app.bars import from_records, from_timings
from app.database import database_or_stop
from app.evaluation import Stopped, evaluate_version, version_label, version_units
from app.figures import add_step_boundaries, gantt_figure, overlay_figure
from app.formatting import fmt, human, pct, plain, signed, steps_text, when
from app.measured import MEAN, compare_bars, step_view
from app.own_models import check_own_model, merged_options, model_picker, profile_workload, spec_options
from executor.analysis.compare_run import LAUNCHED
from mpipe_core.errors import MpipeError
from mpipe_core.runs.model_spec import ModelSpec, is_own_model, preset_mismatch, spec_from_options
from mpipe_core.runs.run_identity import dropped_layout, same_model, workload_devices, workload_model
from mpipe_core.runs.run_options import (
    BACKENDS,
    RUN_OPTIONS,
    RunOptionError,
    check_run_options,
    devices_text,
    encoder_devices_of,
    option_problems,
    parse_option_pairs,
)
from storage import (
    authorize,
    cancel_run,
    enqueue,
    get_version,
    history,
    list_audit,
    list_runs,
    list_schedules,
    list_workloads,
    run_events,
    save_workload,
    saved_workload_ref,
    timing_count,
    timings_for,
)
from storage.library import check_name
from storage.runs import GRADIENTS_DIFFER, is_finished, shown_status

LIVE_REFRESH_S = 1.0  # the runs' table and the picked run, together, while any run goes
# While a run goes, draw only its latest steps up to this many ops: the chart
# is redrawn every second and must finish rendering well within that.
LIVE_MAX_OPS = 1_500
LIVE_MAX_STEPS = 8
REPEAT_WINDOW_S = 10  # an identical run queued this recently asks for confirmation
PENDING = "runs.pending"  # launch options waiting for "Launch again"
QUERY_SEEN = "_runs.query_seen"
CALIBRATED = "_runs.calibrated"  # the calibration message, shown after the rerun that lists it
RUN_ACTIONS = ("launch", "cancel", "calibrate", "profile", "import-trace")

st.title("Runs")
db = database_or_stop()


def model_text(options: dict, version) -> str:
    """The model a run with `options` trains, in words."""
    options = options or {}
    own = spec_from_options(options)
    if own is not None:
        shape = own.shape
        return (f"own model {own}: microbatches of {shape.microbatch_size} sample(s), "
                f"{shape.text_len} text tokens and {shape.images} image(s) each")
    preset = options.get("model")
    if preset:
        return f"model preset {preset}"
    wl = version.workload or {}
    layers = (wl.get("llm") or {}).get("layers")
    encoders = [e.get("name", "?") + (" (trainable)" if e.get("trainable") else " (frozen)")
                for e in wl.get("encoders") or [] if isinstance(e, dict)]
    return ("the executor's small model sized from the workload: "
            + (f"{layers} LLM layers" if layers else "LLM layers as chunks")
            + (f", encoder {', '.join(encoders)}" if encoders else ", no encoder"))


def is_imported(run) -> bool:
    """A run another stack made, imported from its traces (not launched here)."""
    return run.source == "imported"


def _recent_twin(version_ref: str, backend: str, nproc: int, steps: int, options: dict):
    """An identical run (options too) queued in the last few seconds (by anyone), or None.
    An imported run is none: it was never queued."""
    name = version_ref.split("@")[0]
    for r in list_runs(db, schedule=name, limit=20):
        if ((r.ref, r.backend, r.nproc, r.steps, r.options or {}) == (version_ref, backend, nproc, steps, options)
                and r.created_at and not is_imported(r)):
            age = (pd.Timestamp.now(tz="UTC") - pd.Timestamp(r.created_at)).total_seconds()
            if age < REPEAT_WINDOW_S:
                return r
    return None


def _preset_mismatch(version, model: str | None) -> str | None:
    """Why built-in preset `model` cannot train `version`'s workload (its encoder
    missing, extra, frozen where the workload's is trainable or the other way round),
    by the worker's own rule; None when it can, or `model` is no preset."""
    from mpipe_core.workloads.workload import load_workload

    if not model or is_own_model(model):
        return None
    try:
        encoders = [(e.name, e.trainable) for e in load_workload(version.workload).encoders]
    except MpipeError:
        return None  # the workload's own error is the worker's to report
    return preset_mismatch(model, encoders)


def _run_options(options: dict) -> dict:
    """The Options field's KEY=VALUE text and the picked model's options, merged and
    checked by the worker's rules (a preset against the schedule's workload too):
    one RunOptionError that names every bad option."""
    problems: list[str] = []
    typed = parse_option_pairs((p.strip() for p in options["options"].split(",") if p.strip()), problems)
    merged = merged_options(typed, ModelSpec.from_dict(options["model"]) if options["model"] else None)
    problems += option_problems(merged)
    mismatch = _preset_mismatch(get_version(db, options["ref"]), merged.get("model"))
    if mismatch is not None:
        problems.append(mismatch)
    if problems:
        raise RunOptionError("; ".join(problems), problems)
    return merged


def _launch(options: dict) -> None:
    """Queue the run `options` describe; its run options are checked by the rules the
    worker applies, so a bad one is refused here, inline.  An own model is first built
    and checked against the schedule in a subprocess (torch, never in the app's
    process); the run is then queued here, like any other, under the session's actor."""
    try:
        run_options = _run_options(options)
        if is_own_model(run_options.get("model")):
            # The check below builds the model: refused before it starts if the role may not launch.
            authorize(db, "launch", options["ref"])
            check_run_options(run_options)  # the one-line refusal, before paying for a subprocess
            version = get_version(db, options["ref"])
            with st.spinner("Checking that the model loads and fits the schedule..."):
                check_own_model(version.term, version.workload, run_options)
        run = enqueue(db, options["ref"], backend=options["backend"], nproc=options["nproc"],
                      steps=options["steps"], options=run_options)
    except MpipeError as error:
        widgets.show_error(error)
    else:
        st.session_state.pop(PENDING, None)
        state.select_run(run.id)
        st.success(plain(f"Queued run #{run.id} of {run.ref}"))


def _profile(spec) -> None:
    """Profile the picked model (`mpipe profile`, in a subprocess) into a saved workload."""
    if spec is None:
        return
    cols = st.columns([2, 1])
    name = cols[0].text_input("Save its profile as workload", key="runs.profile_name", placeholder="e.g. my-model-cpu",
                              help="mpipe profile measures the picked model's per-layer costs on this machine's CPU")
    if widgets.write_button("Profile this model", "profile", key="runs.profile", target=f"workload {name.strip()}",
                            where=cols[1]):
        lines: list[str] = []
        box = st.empty()

        def show(line: str) -> None:
            lines.append(line)
            box.code("\n".join(lines[-12:]), language=None)

        try:
            check_name(name.strip(), "workload")
            authorize(db, "profile", f"workload {name.strip()}")  # profiling runs the model: refused before it starts
            with st.spinner(plain(f"Profiling {spec}...")):
                doc = profile_workload(spec, show)
            info = save_workload(db, name.strip(), doc, message=f"profiled from {spec} (mpipe profile)",
                                 action="profile")
        except MpipeError as error:
            widgets.show_error(error)
        else:
            st.success(plain(f"Saved workload {info.ref}: pick {saved_workload_ref(info.name)} in the "
                             f"Designer's saved workloads"))


# --- launch --------------------------------------------------------------------------------
with st.expander("Launch a run", expanded=True):
    schedules = list_schedules(db) if auth.may("launch") else None
    if schedules is None:
        st.caption(plain(auth.needs("launch", "Launching runs")))
    elif not schedules:
        st.info("No saved schedules yet: save one from the Designer first.")
    else:
        cols = st.columns([2, 1])
        name = cols[0].selectbox("Schedule", [s.name for s in schedules], key="runs.schedule")
        versions = list(reversed(history(db, name)))
        ref = cols[1].selectbox("Version", [v.ref for v in versions], key="runs.version")
        version = versions[[v.ref for v in versions].index(ref)]
        devices = int(version.metric("devices") or 1)
        needed = devices_text(devices, encoder_devices_of(version.term))  # p + k under disaggregate
        st.caption(plain(f"{version.term} on {version_label(version)}: {needed}, predicted makespan "
                         f"{fmt(version.metric('makespan'), version_units(version)[0])}."))
        # Plain widgets and a button, not a form: pressing Enter in a field must not queue a run.
        cols = st.columns(3)
        backend = cols[0].selectbox("Backend", BACKENDS, key="runs.backend",
                                    help="gloo: CPU processes; nccl: CUDA; hccl: Ascend NPU")
        nproc = cols[1].number_input("Devices (ranks)", min_value=1, step=1, value=devices,
                                     key=f"runs.nproc.{ref}", help="must equal the schedule's device count")
        steps = cols[2].number_input("Training steps", min_value=1, max_value=1000, value=3, step=1,
                                     key="runs.steps")
        run_options = st.text_input(
            "Options", key="runs.options", placeholder="e.g. check_grads=true, lr=0.05, timeout_s=600",
            help="KEY=VALUE, comma separated: " + ", ".join(RUN_OPTIONS) + " (checked by the rules the "
                 "worker applies)")
        spec = model_picker("runs.model")
        options = {"ref": ref, "backend": backend, "nproc": int(nproc), "steps": int(steps),
                   "options": run_options.strip(), "model": spec.to_dict() if spec else None}
        st.caption(plain(f"Trains {model_text(spec_options(spec), version)}."))
        mismatch = _preset_mismatch(version, spec_options(spec).get("model"))
        if mismatch is not None:
            st.warning(plain(f"{mismatch}: pick another model (or the one sized from the workload) to launch it."))
        if widgets.write_button("Launch", "launch", type="primary", key="runs.launch", target=ref, schedule=name):
            try:
                parsed = _run_options(options)
            except RunOptionError as error:
                widgets.show_problems(error.problems, "run option")
            except MpipeError as error:
                widgets.show_error(error)
            else:
                if int(nproc) != devices:
                    st.error(plain(f"{ref} runs on {needed}; set Devices to {devices}."))
                else:
                    twin = _recent_twin(ref, backend, int(nproc), int(steps), parsed)
                    if twin is not None:
                        st.session_state[PENDING] = dict(options, twin=twin.id)
                    else:
                        _launch(options)
        pending = st.session_state.get(PENDING)
        if pending is not None:
            if {k: pending[k] for k in options} != options:
                st.session_state.pop(PENDING)
            else:
                st.warning(plain(f"An identical run (#{pending['twin']}: {ref}, {backend} × {nproc}, {steps} steps) "
                                 f"was queued seconds ago. Queue another one?"))
                c = st.columns([1, 1, 4])
                if widgets.write_button("Launch again", "launch", key="runs.launch_again", target=ref, schedule=name,
                                        where=c[0]):
                    _launch(options)
                if c[1].button("Don't", key="runs.launch_cancel"):
                    st.session_state.pop(PENDING)
                    st.rerun()
        _profile(spec)
        st.caption("Queued runs wait until a worker claims them: the app starts one beside itself "
                   "unless told not to; more workers can join from other machines.")

# --- import --------------------------------------------------------------------------------
with st.expander("Import traces (a run another stack made)"):
    trace_upload.import_form(db)

# --- list ----------------------------------------------------------------------------------
def recent_activity() -> None:
    with st.expander("Recent activity on runs"):
        widgets.audit_table(list_audit(db, actions=RUN_ACTIONS, limit=50), key="runs.recent")


runs = list_runs(db, limit=200)
if not runs:
    st.info("No runs yet.")
    recent_activity()
    st.stop()


def _runs_table(current) -> None:
    """All runs, from the same read as the selected run's header (one status everywhere)."""
    st.subheader("All runs")
    st.dataframe(pd.DataFrame([{
        "run": r.id, "schedule version": r.ref, "status": shown_status(r),
        "source": "imported traces" if is_imported(r) else "launched here",
        "backend × devices": f"{r.backend} × {r.nproc}", "steps": r.steps,
        "model": "–" if is_imported(r) else (r.options or {}).get("model", "from the workload"),
        "launched by": r.launched_by, "created": when(r.created_at), "finished": when(r.finished_at),
        "worker": r.worker_id or "",
    } for r in current]), hide_index=True, key="runs.table", width="stretch")


def _resolve_selection(ids: list[int]) -> int:
    """The run to show: a link's (from the library, once), else the one picked, else the newest."""
    query = st.query_params.get("run")
    if query and query.isdigit() and int(query) in ids and st.session_state.get(QUERY_SEEN) != query:
        state.select_run(int(query))
        st.session_state[QUERY_SEEN] = query
    if state.selected_run() not in ids:
        state.select_run(ids[0])
    return state.selected_run()


def _pick_run(current) -> int:
    """The run picker over `current`, the run shown in the address."""
    ids = [r.id for r in current]
    _resolve_selection(ids)
    by_id = {r.id: r for r in current}
    run_id = st.selectbox("Run", ids, key=state.SELECTED_RUN, format_func=lambda i: (
        f"#{i} {by_id[i].ref} ({'imported by ' if is_imported(by_id[i]) else ''}{by_id[i].launched_by}, "
        f"{when(by_id[i].created_at)})"))
    st.query_params["run"] = str(run_id)
    st.session_state[QUERY_SEEN] = str(run_id)
    return run_id


# --- one run -------------------------------------------------------------------------------
# The worker's summary line of a gradient check (executor.service.queue_worker), and its failure's
# error: "ran; gradients differ: worst tensor ..." (before issue 38: "gradient check failed: ...").
GRAD_LINE = re.compile(r"^grad check (PASS|FAIL): (.*)$", re.MULTILINE)
GRAD_FAILED = ("gradient check failed", GRADIENTS_DIFFER)


def grad_verdict(run) -> tuple[str, str] | None:
    """The gradient check's (PASS or FAIL or "not reached", its figures) of a run
    that asked for one (`check_grads`), or None: from the worker's summary at the
    end of the log tail, or the error a failed check ends a run with."""
    if not (run.options or {}).get("check_grads"):
        return None
    lines = GRAD_LINE.findall(run.log_tail or "")
    if lines:
        word, figures = lines[-1]
        return word, figures.removeprefix(GRADIENTS_DIFFER).lstrip(": ")
    for prefix in GRAD_FAILED:
        if (run.error or "").startswith(prefix):
            return "FAIL", run.error.removeprefix(prefix).lstrip(": ")
    return ("not reached", f"the run ended {run.status} before the check") if is_finished(run.status) else None


def is_same_model(run, version) -> bool:
    """Whether the run's launched workload describes the model that ran (`run_identity.same_model`)."""
    return is_imported(run) or same_model(version.workload, (run.options or {}).get("model") or "")


def _model_warning(run, version) -> None:
    """Say loudly when the run's workload is another model's, or its layout was dropped."""
    dropped = dropped_layout(version.workload)
    parts = []
    if not is_same_model(run, version):
        parts.append(f"The workload {workload_model(version.workload)} is another model than the one that ran: a "
                     f"comparison with it is across models, not a prediction of this run")
    if dropped:
        parts.append(f"Of the workload's layout, {', '.join(dropped)} was dropped: it spans "
                     f"{workload_devices(version.workload, run.nproc)} devices, this run executed the "
                     f"{run.nproc}-device pipeline")
    if parts:
        st.warning(plain(". ".join(parts) + "."))


def _header(run, version) -> None:
    st.subheader(plain(f"Run #{run.id}: {run.ref}" + (" · imported traces" if is_imported(run) else "")))
    verdict = grad_verdict(run)
    if verdict is not None:
        word, figures = verdict
        colour = {"PASS": "green", "FAIL": "red"}.get(word, "gray")
        icon = {"PASS": ":material/check_circle:", "FAIL": ":material/error:"}.get(word, ":material/help:")
        label = "Ran; gradients differ" if word == "FAIL" else f"Gradient check {word}"
        st.badge(label, icon=icon, color=colour)
        st.caption(plain(f"Gradient check against single-process references (float32 and float64): {figures}."))
    cols = st.columns(5)
    cols[0].metric("Status", shown_status(run))
    cols[1].metric("Backend × devices", f"{run.backend} × {run.nproc}")
    cols[2].metric("Steps", run.steps)
    cols[3].metric("Started", when(run.started_at)[-8:] if run.started_at else "–")
    cols[4].metric("Finished", when(run.finished_at)[-8:] if run.finished_at else "–")
    if is_imported(run):
        st.caption(plain(f"Imported by {run.launched_by} from another stack's traces (source: imported; "
                         f"files' sha256 {run.source_digest}); the files, the term and how the clocks were "
                         f"aligned are in the import report below. It was not launched here: nothing to "
                         f"cancel or launch again. Compare and calibrate it like any run."))
    else:
        st.caption(plain(f"Trains {model_text(run.options, version)}."))
        _model_warning(run, version)
    st.page_link("app_pages/library.py", label=plain(f"Schedule version {run.ref} in the library"),
                 icon=":material/menu_book:",
                 query_params={"schedule": run.schedule, "version": run.ref})


def _expected_ops(version, steps: int) -> int | None:
    try:
        return evaluate_version(version).schedule.num_ops * steps
    except (MpipeError, Stopped):
        return None


def _live(run, version, live_limit: int | None = LIVE_MAX_OPS) -> None:
    """The measured timeline as it fills in (all of it with `live_limit=None`)."""
    count = timing_count(db, run.id)
    # An imported run's ops were all stored at once: there is no recording to follow.
    expected = None if is_imported(run) else _expected_ops(version, run.steps)
    if run.status == "queued":
        st.info("Queued: waiting for a worker to claim it.")
    elif run.cancel_requested:
        st.warning("Cancel requested: the worker stops it at its next heartbeat.")
    if expected:
        st.progress(min(1.0, count / expected), text=f"{count:,} of {expected:,} op timings recorded")
    if count:
        bars = from_timings(timings_for(db, run.id), run.nproc)
        title = "Measured, all steps" if is_finished(run.status) else "Measured so far, all steps"
        steps = np.unique(bars.step)
        warm = None
        if live_limit and (len(bars) > live_limit or len(steps) > LIVE_MAX_STEPS):
            per_step = max(1, len(bars) // len(steps))
            keep = steps[-max(1, min(LIVE_MAX_STEPS, live_limit // per_step)):]
            bars = bars.select(np.isin(bars.step, keep))
            title = (f"Measured so far: latest steps {keep[0]}–{keep[-1]} of {run.steps} "
                     f"(every step in a tab once the run ends)")
            bars = bars.shifted(float(bars.start.min()))
        elif live_limit is None and len(steps) > 1 and steps[0] == 0:
            # The warm-up step (allocations, first connections) can take many times a later step:
            # it gets a chart of its own, so the steps every comparison uses keep a readable scale.
            warm = bars.select(bars.step == 0)
            bars = bars.select(bars.step != 0)
            bars = bars.shifted(float(bars.start.min()))
            title = (f"Measured: steps {steps[1]}–{steps[-1]} after the warm-up "
                     f"(dashed lines: where each step starts)")
        _step_chart(bars, title, f"runs.live.{run.id}")
        if warm is not None:
            _step_chart(warm.shifted(float(warm.start.min())), "Warm-up step 0 (left out of every comparison)",
                        f"runs.warmup.{run.id}")


def _step_chart(bars, title: str, key: str) -> None:
    """A measured Gantt chart with a dashed line where each step starts."""
    fig, notice = gantt_figure(bars, title=title, show_idle=False)
    add_step_boundaries(fig, bars)
    if notice:
        st.warning(plain(notice))
    st.plotly_chart(fig, key=key, config={"displaylogo": False})


def _calibrate(run) -> None:
    """Fit a workload to this run's measured op times and save it to the library."""
    from executor.analysis.calibrate import calibrate_run
    from storage import save_workload

    cols = st.columns([2, 1])
    name = cols[0].text_input("Save the calibrated workload as", value=f"cal-run-{run.id}",
                              key=f"runs.cal_name.{run.id}")
    if widgets.write_button("Calibrate from this run", "calibrate", key=f"runs.calibrate.{run.id}",
                            target=f"workload {name.strip()}", run_id=run.id, where=cols[1]):
        try:
            with st.spinner("Calibrating..."):
                cal = calibrate_run(db, run.id, name=name.strip())
                info = save_workload(db, name.strip(), cal.workload, action="calibrate", run_id=run.id,
                                     message=f"calibrated from run {run.id} ({cal.term})")
        except MpipeError as error:
            widgets.show_error(error)
        else:
            # Rerun so the workload list of the comparison tab offers it at once.
            st.session_state[CALIBRATED] = (
                f"Saved workload {info.ref}: predicted {fmt(cal.predicted_ms, 'ms')} vs measured "
                f"{fmt(cal.measured_ms, 'ms')} ({cal.error:+.1%}). Pick it under “Measured vs predicted” "
                f"to predict with it.")
            st.rerun()
    if CALIBRATED in st.session_state:
        st.success(plain(st.session_state.pop(CALIBRATED)))


RUN_WORKLOAD = LAUNCHED  # the workload the run was launched with
FIT = "fit"  # the workload calibrated from this very run


def _workload_choices(run) -> tuple[list[str], dict[str, str]]:
    """What "Predict on the workload" offers, the run's own workload first (the default)."""
    version = get_version(db, run.ref)
    saved = [saved_workload_ref(w.ref) for w in list_workloads(db)]
    if not is_same_model(run, version):  # another model's workload: never the default, never "a prediction"
        labels = {RUN_WORKLOAD: f"the run's own: {version_label(version)} (another model: across models)",
                  FIT: "fit on this run (not a prediction)"}
        return [FIT, RUN_WORKLOAD, *saved], labels
    labels = {RUN_WORKLOAD: f"the run's own: {version_label(version)} (a prediction)",
              FIT: "fit on this run (not a prediction)"}
    return [RUN_WORKLOAD, FIT, *saved], labels


def _spread(cmp, run, spans: list[float]) -> None:
    """How much the same run varies: its steps (`spans`, sorted), and the previous run of its version."""
    from executor.analysis.compare_run import previous_run

    prev = previous_run(db, run.id)
    parts = [f"steps {steps_text(cmp.steps)} of this run: min {fmt(spans[0], 'ms')} · median "
             f"{fmt(float(np.median(spans)), 'ms')} · max {fmt(spans[-1], 'ms')}"]
    if cmp.spread is not None:
        parts[0] += f" (max − min = {pct(cmp.spread)} of the median)"
    if prev is None:
        parts.append(f"no earlier run of {run.ref} to compare with")
    else:
        parts.append(f"the previous run of {run.ref} (#{prev.run_id}) measured {fmt(prev.makespan_ms, 'ms')} "
                     f"({percent_change(prev.makespan_ms, cmp.measured_ms)} from this run's "
                     f"{fmt(cmp.measured_ms, 'ms')})")
    st.caption(plain("Run-to-run spread, to weigh any prediction error against: " + "; ".join(parts) + "."))


def percent_change(value: float, base: float) -> str:
    return f"{value / base - 1:+.1%}" if base else "–"


ONE_STEP = "one step"


def _step_picker(run, cmp) -> int | str:
    """The mean of the steps, or one step on a slider (it scales to any number of
    steps) with the first, the median and the last a click away; the median is the
    step whose makespan is the median."""
    steps = list(cmp.steps)
    if len(steps) < 2:
        return MEAN  # one step: its mean is itself
    view = st.radio("Show", [MEAN, ONE_STEP], horizontal=True, key=f"runs.view.{run.id}",
                    format_func=lambda v: f"mean of steps {steps_text(steps)}" if v == MEAN else v)
    if view == MEAN:
        return MEAN
    key = f"runs.step.{run.id}"
    if st.session_state.get(key) not in steps:
        st.session_state[key] = steps[0]
    by_span = sorted(zip(cmp.step_makespans_ms, steps))
    marks = {"first": steps[0], "median": by_span[(len(by_span) - 1) // 2][1], "last": steps[-1]}
    cols = st.columns([5, 1, 1, 1])
    step = cols[0].select_slider("Step", steps, key=key, help=f"{len(steps)} steps after the warm-up")
    for col, (name, value) in zip(cols[1:], marks.items()):
        col.button(f"{name} ({value})", key=f"{key}.{name}", on_click=state.set_kept, args=(key, value),
                   help=f"the {name} step" + (" by makespan" if name == "median" else ""))
    return step


def _comparison(run) -> None:
    """Measured vs predicted (or vs another run): one step or the mean of steps,
    chart and tables from the same bars.  By default the prediction is the run's
    own workload's; a fit on the run itself is offered, and labelled as no prediction."""
    from executor.analysis.compare_run import compare_run, is_run_reference

    c = st.columns([2, 2])
    against = c[0].text_input(
        "Compare against", key=f"runs.against.{run.id}", placeholder="(empty: its own term) — or a term, "
        "or another run's id")
    choices, labels = _workload_choices(run)
    workload = c[1].selectbox("Predict on the workload", choices, key=f"runs.workload.{run.id}",
                              format_func=lambda w: labels.get(w, w),
                              help="The run's own workload predicts it; a saved calibration of another run "
                                   "tests whether that predicts this one; a fit on this run only tests the "
                                   "simulator's structure, with this run's own op times")
    other_run = is_run_reference(against.strip())
    try:
        with st.spinner("Comparing..."):
            cmp = compare_run(db, run.id, against.strip() or None,
                              workload=None if other_run or workload == FIT else workload,
                              explain=not against.strip())
    except MpipeError as error:
        widgets.show_error(error)
        return
    side = ("fit" if cmp.fitted else "predicted") if cmp.kind == "prediction" else "other run"
    if side == "predicted" and workload == RUN_WORKLOAD and not is_same_model(run, get_version(db, run.ref)):
        side = "across models"
    step = _step_picker(run, cmp)
    measured = step_view(from_timings(timings_for(db, run.id), run.nproc), step, cmp.steps)
    other = from_records(cmp.other_timeline, run.nproc)
    result = compare_bars(measured, other)
    what = f"mean of steps {steps_text(cmp.steps)}" if step == MEAN else f"step {step}"
    if cmp.fitted:
        st.info("Fit on this run: these costs were measured from this very run, so the figures below say how "
                "well the simulator's structure (order, dependencies, transfers) explains it, not how well it "
                "predicts a run. Pick the run's own workload, or a calibration of another run, for a "
                "prediction.")
    cols = st.columns(4)
    cols[0].metric(f"Measured makespan ({what})", fmt(result.makespan, "ms"))
    other_name = {"fit": "Fit (not a prediction)", "predicted": "Predicted", "other run": "Other run",
                  "across models": "Another model's"}[side]
    cols[1].metric(f"{other_name} makespan", fmt(result.other_makespan, "ms"))
    error = result.other_makespan / result.makespan - 1 if result.makespan else None
    error_label = {"fit": "Fit error (no prediction)", "predicted": "Prediction error",
                   "other run": "Other run vs this one", "across models": "Across models (no prediction)"}[side]
    cols[2].metric(error_label, f"{error:+.1%}" if error is not None else "–",
                   help=f"{side} / measured − 1, of the makespans shown")
    spans = sorted(cmp.step_makespans_ms)
    cols[3].metric("Run-to-run spread", pct(cmp.spread) if cmp.spread is not None else "–",
                   help=f"(slowest − fastest step) / median step, of the steps used here: "
                        f"{human(spans[0])}–{fmt(spans[-1], 'ms')} (none with one step); the caption below "
                        f"has the previous run of this version")
    _spread(cmp, run, spans)
    if cmp.kind == "prediction" and not cmp.prediction_unit:
        remedy = ("An imported run keeps unit costs unless a workload was given at import: pick a calibration "
                  "of another run for a prediction in ms (calibrating this one gives a fit)" if is_imported(run)
                  else "Profile the model (under Launch a run) or calibrate an earlier run for a workload in ms")
        st.warning(plain(f"{cmp.workload} declares no time unit: its costs are read as milliseconds "
                         f"(1 unit = 1 ms), which means something only if they were written in ms. "
                         f"{remedy}; the bubble ratios below compare without units."))
    bubble = [_bubble(result.devices["idle"], result.makespan),
              _bubble(result.devices["other idle"], result.other_makespan)]
    gap = (f"Measured op times include this run's mean dispatch gap between ops ({fmt(cmp.overhead_ms, 'ms')}); "
           + (f"the other run's include its own ({fmt(cmp.workload_dispatch_ms, 'ms')})" if side == "other run"
              else f"the workload's costs include the one it was calibrated with "
                   f"({fmt(cmp.workload_dispatch_ms, 'ms')})" if cmp.workload_dispatch_ms
              else "the workload charges no dispatch gap of its own"))
    st.caption(plain(f"Against {cmp.against}" + (f" on workload {cmp.workload}" if cmp.workload else "")
                     + f". The chart and both tables show the measured {what} (the steps' own makespans "
                     f"average {fmt(cmp.measured_ms, 'ms')}, which the gap by cause below explains). "
                     f"Bubble ratio: measured {bubble[0]}, {side} {bubble[1]}. {gap}. "
                     f"{cmp.matched_ops} ops matched, {cmp.unmatched_ops} on one side only."))
    st.plotly_chart(overlay_figure(measured, other, other_label=side,
                                   title=f"Measured {what} (lower half of each row) vs {side} (upper half, faded)"),
                    key=f"runs.overlay.{run.id}", config={"displaylogo": False})
    st.markdown(f"**Per device** ({what})")
    devices = result.devices
    st.dataframe(pd.DataFrame({
        "device": devices["device"], "measured busy": [fmt(x, "ms") for x in devices["busy"]],
        "measured idle": [fmt(x, "ms") for x in devices["idle"]],
        f"{side} busy": [fmt(x, "ms") for x in devices["other busy"]],
        f"{side} idle": [fmt(x, "ms") for x in devices["other idle"]],
    }), hide_index=True, key=f"runs.devices.{run.id}", width="stretch")
    st.markdown(f"**Ops whose measured time differs most** ({what})")
    ops = result.ops
    st.dataframe(pd.DataFrame({
        "op": ops["op"], "device": ops["device"], "measured": [fmt(x, "ms") for x in ops["measured"]],
        side: [fmt(x, "ms") for x in ops["other"]], "difference": [signed(x, "ms") for x in ops["difference"]],
        "ends at": [fmt(x, "ms") for x in ops["ends at"]],
    }), hide_index=True, key=f"runs.ops.{run.id}", width="stretch")
    if cmp.explanation is not None:
        st.markdown(f"**Where the gap goes: measured − {side} by cause, along the measured critical "
                    "path, mean over the steps**")
        st.dataframe(pd.DataFrame([{
            "cause": e["cause"], "path ops": fmt(e["ops"]), "measured": fmt(e["measured_ms"], "ms"),
            side: fmt(e["predicted_ms"], "ms"), "difference": signed(e["gap_ms"], "ms"),
            "of which contention": fmt(e["contention_ms"], "ms"),
        } for e in cmp.explanation]), hide_index=True, key=f"runs.explain.{run.id}", width="stretch")


def _bubble(idle, makespan: float) -> str:
    """sum(idle) / (devices × makespan) of one side's per-device idle times."""
    idle = np.asarray(idle, dtype=float)
    return pct(float(idle.sum()) / (len(idle) * makespan)) if makespan and len(idle) else "–"


def _details(run) -> None:
    if run.error:
        st.error(plain(run.error))
    if is_imported(run):
        with st.expander("Import report (files, term, clocks, steps)", expanded=True):
            st.code(run.log_tail or "(no report)", language=None)
    else:
        with st.expander("Log tail", expanded=run.status == "failed"):
            st.code(run.log_tail or "(no log yet)", language=None)
    with st.expander("Status history"):
        st.dataframe(pd.DataFrame([{
            "at": when(e.at), "from": e.from_status or "", "to": e.to_status, "worker": e.worker_id or "",
            "note": e.note,
        } for e in run_events(db, run.id)]), hide_index=True, key=f"runs.events.{run.id}", width="stretch")
    with st.expander("Activity (who launched, imported, cancelled, calibrated)"):
        widgets.audit_table(list_audit(db, run_id=run.id, limit=100), key=f"runs.activity.{run.id}")


page_run_id = _resolve_selection([r.id for r in runs])
page_run = next(r for r in runs if r.id == page_run_id)
started_live = not is_finished(page_run.status)


@st.fragment(run_every=LIVE_REFRESH_S if any(not is_finished(r.status) for r in runs) else None)
def runs_now() -> None:
    """The table, the picker and the picked run's header (and, while it runs, what
    it has recorded) from one read of the runs, refreshed while any run is queued
    or running: the table and the run never disagree on a status."""
    current = list_runs(db, limit=200)
    _runs_table(current)
    run_id = _pick_run(current)
    run = next(r for r in current if r.id == run_id)
    if run_id != page_run_id or (started_live and is_finished(run.status)):
        st.rerun()  # the whole page draws this run (a finished one without the timer)
    version = get_version(db, run.ref)
    _header(run, version)
    if not started_live:
        return
    if not is_imported(run):
        if widgets.write_button("Cancel this run", "cancel", key=f"runs.cancel.{run.id}",
                                target=f"run {run.id}", run_id=run.id):
            try:
                cancel_run(database_or_stop(), run.id)  # as the user of this request (a fragment rerun)
            except MpipeError as error:
                widgets.show_error(error)
            else:
                st.rerun()
    _live(run, version)
    _details(run)


runs_now()
if not started_live:  # a finished run does not change: drawn once, outside the timer
    if timing_count(db, page_run.id):
        per_step = ["Per step: measured vs planned"] if page_run.step_plans else []  # a data run's plans
        comm_tab = ["Communication"] if timing_count(db, page_run.id, pipeline=None, rows="comm") else []
        tabs = st.tabs(["Measured vs predicted", "Measured, all steps"] + per_step + comm_tab
                       + (["Calibrate"] if auth.may("calibrate") else []))
        with tabs[0]:
            _comparison(page_run)
        with tabs[1]:
            _live(page_run, get_version(db, page_run.ref), live_limit=None)
        if per_step:
            with tabs[2]:
                run_steps.section(page_run, from_timings(timings_for(db, page_run.id), page_run.nproc),
                                  version_units(get_version(db, page_run.ref))[0])
        if comm_tab:
            with tabs[2 + len(per_step)]:
                run_comm.section(db, page_run, get_version(db, page_run.ref))
        if len(tabs) > 2 + len(per_step) + len(comm_tab):
            with tabs[-1]:
                _calibrate(page_run)
    elif not run_summary_view.has_parts(db, page_run):
        st.info(f"The run ended {page_run.status} without recording timings.")
    run_summary_view.section(db, page_run)  # an imported Ascend run's step summary and communication rows
    _details(page_run)
recent_activity()
