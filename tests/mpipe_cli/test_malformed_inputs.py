"""The malformed-input corpus (`malformed_corpus.py`) against `mpipe`, on SQLite and
on PostgreSQL: every case ends with exit 2 and one `error:` line, or succeeds
with the right output; nothing escapes as a traceback.

It prints `corpus on DB: tried N, clean C, wrong W` and lists every wrong case.
The time and memory bounds below catch a hang or an unbounded read (like
`-w /dev/zero` reading until memory runs out), not speed: a case that ends
cleanly takes well under a second here."""
from __future__ import annotations

import os

import pytest

from cli_runner import Outcome, run_cli
from malformed_corpus import PART_LENGTH, Case, all_cases, seed_database

HANG_S = 30.0
MEMORY_MB = 400.0


@pytest.fixture(autouse=True)
def _isolated(no_ambient_db, monkeypatch):
    monkeypatch.delenv("MPIPE_MODELS", raising=False)


def _materialise(case: Case, tmp: str) -> list[str]:
    folder = os.path.join(tmp, case.id)
    os.makedirs(folder)
    for name, content in case.files.items():
        path = os.path.join(folder, name)
        if callable(content):
            content(path)
        else:
            with open(path, "wb") as f:
                f.write(content)
    return folder


def judge(case: Case, outcome: Outcome, folder: str = "", db_url: str = "") -> str | None:
    """Why the outcome is wrong for the case, or None when it is right (`folder`: the case's
    scratch folder, put in for `{tmp}` in the expected error; `db_url`, for `{db}`)."""
    if outcome.traceback:
        return "traceback: " + outcome.traceback.strip().splitlines()[-1]
    if "Traceback" in outcome.err:
        return "traceback printed on stderr"
    if outcome.seconds > HANG_S:
        return f"took {outcome.seconds:.0f} s"
    if outcome.peak_growth_mb > MEMORY_MB:
        return f"peak memory grew {outcome.peak_growth_mb:.0f} MB"
    if case.error is None:
        if outcome.code != 0:
            return f"expected success, exit {outcome.code}: {outcome.err.strip()[-300:]}"
        try:
            ok = case.check is None or case.check(outcome.out)
        except Exception as error:  # noqa: BLE001 - a check that cannot read the output says no
            ok, outcome.err = False, f"{outcome.err}check raised {error!r}"
        return None if ok else f"wrong output: {outcome.out[:300]!r}"
    if outcome.code != 2:
        return f"exit {outcome.code} (expected 2); stdout {outcome.out[:200]!r} stderr {outcome.err[:200]!r}"
    lines = outcome.error_lines
    if len(lines) != 1:
        return f"{len(lines)} error lines: {outcome.err[:300]!r}"
    expected = case.error.replace("{tmp}", folder).replace("{db}", db_url)
    if case.part:
        if expected not in lines[0]:
            return f"error line lacks {expected!r}: {lines[0][:400]!r}"
    elif lines[0] != f"error: {expected}":
        return f"error line is not exactly {expected!r}: {lines[0][:400]!r}"
    return None


def test_every_expected_error_is_a_whole_line_or_a_distinctive_part():
    cases = [c for c in all_cases() if c.error is not None]
    assert cases and all(len(c.error) >= PART_LENGTH for c in cases if c.part)
    assert all(not c.error.startswith("error:") for c in cases)  # the judge adds it


def test_malformed_inputs(db_url, tmp_path):
    seed_database(db_url)
    cases = all_cases()
    assert len(cases) >= 150
    wrong = []
    for case in cases:
        folder = _materialise(case, str(tmp_path))
        argv = [a.replace("{db}", db_url).replace("{tmp}", folder) for a in case.argv]
        why = judge(case, run_cli(argv), folder, db_url)
        if why:
            wrong.append(f"{case.id}: {why}")
    dialect = db_url.split(":", 1)[0]
    print(f"\ncorpus on {dialect}: tried {len(cases)}, clean {len(cases) - len(wrong)}, wrong {len(wrong)}")
    assert not wrong, "\n".join(wrong)
