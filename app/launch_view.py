"""The Plan page's launch arguments: for each stack `plan --emit` writes for,
the picked candidate's files, or, where the stack cannot run it, why not and
the fastest candidate it can run with how much slower that is than the winner
(`formats.runnable`, what `mpipe plan --emit` prints)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.formats.launch_config import LAUNCH_TARGETS
from mpipe_core.formats.runnable import RunnableChoice, best_runnable, files_of, refusal

LANGUAGES = {"json": "json", "toml": "toml", "csv": "text"}


@dataclass
class LaunchSection:
    label: str  # the stack, e.g. "MindSpeed-MM"
    note: str | None  # what the page says first (a refusal, the slowdown), None when it runs the pick
    files: dict[str, str] = field(default_factory=dict)  # what to launch it with (empty: nothing it runs)

    @staticmethod
    def language(name: str) -> str:
        return LANGUAGES.get(name.rsplit(".", 1)[-1], "bash")


def launch_sections(result: Any, picked: int, choices: dict[str, RunnableChoice | MpipeError]) -> list[LaunchSection]:
    """One section per launch target for candidate `picked` of the plan; `choices`
    keeps each target's runnable best between reruns (the page's own store)."""
    chosen = result.candidates[picked]
    out = []
    for name, target in LAUNCH_TARGETS.items():
        why = refusal(chosen, name, result.global_batch)
        if why is None:
            out.append(LaunchSection(target.label, None, files_of(chosen, name, result.global_batch)))
            continue
        if name not in choices:
            try:
                choices[name] = best_runnable(result, name)
            except MpipeError as error:
                choices[name] = error
        choice = choices[name]
        if isinstance(choice, MpipeError):
            out.append(LaunchSection(target.label, f"{target.label} cannot run #{picked + 1}: {why}. "
                                                   f"{choice.message.split(': ', 1)[1]}"))
            continue
        c = choice.candidate
        if picked == 0:
            note = f"{choice.summary()}: {c.layout.label()} {c.term}. #1: {why}"
        elif choice.index == 0:
            note = f"{target.label} cannot run #{picked + 1}: {why}. It runs #1, the winner: {c.term}"
        else:
            note = (f"{target.label} cannot run #{picked + 1}: {why}. The fastest layout it can run is "
                    f"#{choice.index + 1}, {choice.slower:.1%} slower than #1: {c.layout.label()} {c.term}")
        if choice.index >= choice.top:
            note += (f" (the fastest of the layouts the search evaluated: it pruned against its top {choice.top}; "
                     f"`mpipe plan --runnable-by {name}` ranks what {target.label} can run exactly)")
        out.append(LaunchSection(target.label, note, choice.files))
    return out
