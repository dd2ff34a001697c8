"""`mpipe runs list` and `runs show` show a run that ran to the end with gradients that differ
from the reference as "ran; gradients differ", with its worst tensor, not as a crash."""
from __future__ import annotations

from mpipe_cli.main import main

ERROR = ("ran; gradients differ: worst tensor vision.pos (gradient, step 2, rank 0): off by 7.9e-11, "
         "3.2x the allowed 2.5e-11")


def test_a_run_whose_gradients_differ_is_not_shown_as_a_crash(tmp_path, capsys):
    from storage import claim_next_run, enqueue, finish_run, open_database, save_schedule

    url = f"sqlite:///{tmp_path / 'q.db'}"
    db = open_database(url)
    save_schedule(db, "s", "1f1b(p=2, m=2)")
    differ = enqueue(db, "s", options={"check_grads": True})
    crashed = enqueue(db, "s")
    claim_next_run(db, "w", 60)
    finish_run(db, differ.id, "w", "failed", exit_code=0, error=ERROR)
    claim_next_run(db, "w", 60)
    finish_run(db, crashed.id, "w", "failed", exit_code=1, error="rank 1 failed in op llm:1F0")
    db.close()
    assert main(["runs", "list", "--db", url]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert " ran; gradients differ " in rows[str(differ.id)] and " failed " in rows[str(crashed.id)]
    assert main(["runs", "show", str(differ.id), "--db", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"run {differ.id}: ran; gradients differ" and f"error     {ERROR}" in out
