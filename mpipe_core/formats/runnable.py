"""Which of a plan's candidates a training stack can run: the fastest one
(`mpipe plan --emit STACK`, the Plan page's launch arguments) and the plan
ranked among them only (`mpipe plan --runnable-by STACK`).

A candidate is runnable by a stack when `launch_config.launch_files` writes
its files, so the answer is the exporter's own, refusals included.  The check
builds the candidate's schedule without simulating it (the exporters read the
order and the layer split, never the timeline), and parses each layout's
workload document once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.formats.launch_config import LAUNCH_TARGETS, launch_files, refusal_of


@dataclass(frozen=True)
class RunnableChoice:
    """The fastest candidate (within the cap) that `target` can run."""
    target: str
    index: int  # in the plan's candidates (0: the winner)
    candidate: Any  # PlanCandidate
    files: dict[str, str]
    slower: float  # its step time over the winner's, minus 1
    first_refusal: str | None  # why the winner cannot be run (None: it can)
    top: int  # the plan's K: beyond it, the search pruned against others' step times

    @property
    def label(self) -> str:
        return LAUNCH_TARGETS[self.target].label

    def summary(self) -> str:
        """E.g. "MindSpeed-MM cannot run #1–#11; #12 is 7.0% slower"."""
        if self.index == 0:
            return f"{self.label} runs #1, the winner"
        skipped = "#1" if self.index == 1 else f"#1–#{self.index}"
        return f"{self.label} cannot run {skipped}; #{self.index + 1} is {self.slower:.1%} slower"


class _Schedules:
    """Schedule-only evaluations of candidates, each layout's workload parsed once."""

    def __init__(self) -> None:
        self.workloads: dict[int, Any] = {}

    def evaluation(self, candidate: Any) -> Any:
        from mpipe_core.algebra.evaluate import evaluate_term
        from mpipe_core.algebra.terms import parse
        from mpipe_core.api import Evaluation, costed
        from mpipe_core.workloads.workload import parse_workload

        key = id(candidate.document)
        if key not in self.workloads:
            self.workloads[key] = parse_workload(candidate.document)
        ast = parse(candidate.term)
        wl = costed(ast, self.workloads[key])
        return Evaluation(str(ast), ast, wl, evaluate_term(ast, wl), None)  # type: ignore[arg-type]


def refusal(candidate: Any, target: str, global_batch: int, schedules: _Schedules | None = None) -> str | None:
    """Why `target` cannot run the candidate, or None when it can."""
    spec = LAUNCH_TARGETS[target]
    why = spec.workload_refusal(candidate.document)
    if why is not None:
        return f"--format {target} cannot express this workload: {why}"
    return refusal_of((schedules or _Schedules()).evaluation(candidate), global_batch, target)


def best_runnable(result: Any, target: str) -> RunnableChoice:
    """The fastest candidate within the cap that `target` can run; an MpipeError
    (naming the winner's refusal) when it can run none."""
    schedules = _Schedules()
    candidates = [c for c in result.candidates if c.within_cap]
    first: str | None = None
    for index, c in enumerate(candidates):
        why = refusal(c, target, result.global_batch, schedules)
        if why is None:
            ev = schedules.evaluation(c)
            files = launch_files(ev, result.global_batch, target)
            return RunnableChoice(target, index, c, files, c.step_time_s / candidates[0].step_time_s - 1, first,
                                  result.top)
        first = first or why
    label = LAUNCH_TARGETS[target].label
    raise MpipeError(f"--emit {target}: {label} can run none of the {len(candidates)} layouts the plan evaluated "
                     f"within the memory cap (#1: {first})")


def runnable_only(result: Any, target: str) -> Any:
    """The plan's result without the candidates `target` cannot run, in the same
    order: its table, best, Pareto front and each family's best are all checked
    runnable.  (Checking every candidate would take as long as the search; the
    others passed the search's `term_filter` and only count toward nothing shown.)"""
    schedules = _Schedules()
    verdicts: dict[int, str | None] = {}

    def why(c: Any) -> str | None:
        if id(c) not in verdicts:
            verdicts[id(c)] = refusal(c, target, result.global_batch, schedules)
        return verdicts[id(c)]

    kept = list(result.candidates)
    while kept:
        view = dataclasses.replace(result, candidates=kept)
        shown = view.shown() + view.pareto() + list(view.best_of_family().values())
        refused = {id(c) for c in shown if why(c) is not None}
        if not refused:
            return view
        kept = [c for c in kept if id(c) not in refused]
    label = LAUNCH_TARGETS[target].label
    first = why(result.candidates[0]) if result.candidates else ""
    raise MpipeError(f"--runnable-by {target}: {label} can run none of the {len(result.candidates)} layouts "
                     f"the plan evaluated (#1: {first})")


def term_filter(target: str, document: Any) -> Any:
    """The search's `keep` for `--runnable-by target`: the terms whose combinators
    the stack may run; an MpipeError first when it cannot run the workload at all."""
    from mpipe_core.formats.launch_config import may_run

    why = LAUNCH_TARGETS[target].workload_refusal(document)
    if why is not None:
        raise MpipeError(f"--runnable-by {target}: {why}")
    return lambda term: may_run(target, term)


def files_of(candidate: Any, target: str, global_batch: int) -> dict[str, str]:
    """`target`'s launch files for one candidate (an MpipeError when it cannot run it)."""
    return launch_files(_Schedules().evaluation(candidate), global_batch, target)
