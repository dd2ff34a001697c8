"""`mpipe library|runs|db`: exit codes and exact messages, in-process and as a real command."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpipe_cli.main import main
from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from bounds import EVENT_S

ROOT = Path(__file__).resolve().parents[2]


def _runner(url, capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--db", url])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def cli(db_url, capsys):
    """Run `mpipe ... --db URL` on each database; returns (exit code, stdout, stderr)."""
    return _runner(db_url, capsys)


@pytest.fixture
def sqlite_cli(sqlite_url, capsys):
    """The same on SQLite only, for messages that do not depend on the database."""
    return _runner(sqlite_url, capsys)


def test_library_commands_end_to_end(cli, tmp_path):
    code, out, err = cli("library", "save", "zb", "zb_h1( p=4, m=8 )", "-t", "zero-bubble", "-m", "first")
    assert (code, err) == (0, "")
    assert out == "saved zb@1: zb_h1(p=4, m=8) (makespan 27, bubble ratio 11.1%, efficiency 88.9%)\n"
    assert cli("library", "save", "zb", "zb_h1(p=4, m=16)", "--update")[0] == 0
    code, out, _ = cli("library", "list", "--json")
    [entry] = json.loads(out)
    assert (entry["name"], entry["latest"]["number"], entry["tags"]) == ("zb", 2, ["zero-bubble"])
    code, out, _ = cli("library", "list")
    assert out.splitlines()[0].split() == ["NAME", "VER", "MAKESPAN", "BUBBLE", "EFF", "FITS", "TAGS", "AUTHOR",
                                           "UPDATED", "TERM"]
    code, out, _ = cli("library", "show", "zb@1")
    assert out.splitlines()[1] == "term      zb_h1(p=4, m=8)"
    assert json.loads(cli("library", "show", "zb", "--json")[1])["version"]["term"] == "zb_h1(p=4, m=16)"
    assert len(json.loads(cli("library", "history", "zb", "--json")[1])) == 2
    code, out, _ = cli("library", "diff", "zb@1", "zb@2")
    assert "-zb_h1(p=4, m=8)\n+zb_h1(p=4, m=16)" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[out.splitlines().index("") + 2:]}
    assert rows["makespan"] == ["27", "51", "+24"] and rows["bubble_ratio"] == ["11.1%", "5.9%", "-5.2", "pp"]
    assert cli("library", "fork", "zb@1", "mine")[1] == "forked zb@1 into mine@1\n"
    assert cli("library", "tag", "mine", "fast", "-r", "zero-bubble")[1] == "mine: fast\n"
    assert cli("library", "archive", "mine")[1] == "mine: archived\n"
    assert cli("library", "list")[1].count("\n") == 2  # header + zb
    assert cli("library", "archive", "mine", "--restore")[1] == "mine: restored\n"
    exported = tmp_path / "lib.json"
    code, out, err = cli("library", "export", "-o", str(exported))
    assert (code, err) == (0, f"wrote {exported}: 2 schedule(s), 3 version(s), 0 workload(s)\n")
    code, out, err = cli("library", "import", str(exported))
    assert code == 2
    assert err == ("error: import refused, the library already has: schedule 'mine', schedule 'zb'; "
                   "nothing was imported (import with rename to take them under new names)\n")
    code, out, _ = cli("library", "import", str(exported), "--rename")
    assert out == (f"imported 2 schedule(s) and 0 workload(s) from {exported}\n"
                   "  mine -> mine-2\n  zb -> zb-2\n")
    assert cli("library", "workload", "save", "vit", "vit-heavy-small")[1] == (
        "saved workload vit@1; use it with --workload saved:vit\n")
    assert cli("library", "save", "v", "1f1b(p=2, m=4)", "-w", "saved:vit")[0] == 0
    assert json.loads(cli("library", "show", "v", "--json")[1])["version"]["workload_label"] == "saved:vit@1"


@pytest.mark.parametrize("argv, message", [
    (["library", "save", "a", "1f1b(p=2, m=2)"], "schedule 'a' already exists; update it to add a "
                                                 "version, or choose another name"),
    (["library", "show", "b"], "no schedule named 'b'"),
    (["library", "show", "aa"], "no schedule named 'aa'; did you mean 'a'?"),
    (["library", "show", "a@4"], "schedule 'a' has no version 4 (versions 1..1)"),
    (["library", "show", "a@0"], "bad version reference 'a@0': expected NAME or NAME@NUMBER (from 1)"),
    (["library", "save", "c", "1f1b(p=2, m=2)", "--update"], "no schedule named 'c'"),
    (["library", "fork", "a", "a"], "schedule 'a' already exists; choose another name"),
    (["library", "tag", "a", "bad tag"], "invalid tag 'bad tag': use letters, digits and . _ : + - "
                                         "(starting with a letter or digit, at most 64 characters)"),
    (["library", "import", "/nonexistent/lib.json"], "/nonexistent/lib.json: no such file"),
    (["runs", "enqueue", "a", "--nproc", "3"], "a@1 runs on 2 devices; 3 ranks (nproc) do not match"),
    (["runs", "enqueue", "zzz"], "no schedule named 'zzz'"),
    (["runs", "enqueue", "a", "-o", "novalue"], "option 'novalue': expected KEY=VALUE"),
    (["runs", "show", "77"], "no run 77"),
    (["runs", "cancel", "77"], "no run 77"),
    (["library", "workload", "show"], "library workload show: give a NAME"),
])
def test_bad_input_exits_2_with_one_clear_line(sqlite_cli, argv, message):
    cli = sqlite_cli
    assert cli("library", "save", "a", "1f1b(p=2, m=2)")[0] == 0
    code, out, err = cli(*argv)
    assert (code, out, err) == (2, "", f"error: {message}\n")


@pytest.mark.parametrize("nproc", ["2", "4"])
def test_enqueueing_disaggregate_on_too_few_or_many_ranks_names_p_and_k(sqlite_cli, nproc):
    cli = sqlite_cli
    assert cli("library", "save", "d", "disaggregate(1f1b(p=2, m=4), encoder_devices=1)", "-w", "llava-7b")[0] == 0
    assert cli("runs", "enqueue", "d", "--nproc", nproc) == (
        2, "", f"error: d@1 runs on 3 devices (p + k = 2 LLM + 1 encoder device of disaggregate); {nproc} ranks "
               f"(nproc) do not match\n")
    code, out, _ = cli("runs", "enqueue", "d")
    assert code == 0 and "on 3 x gloo" in out


@pytest.mark.parametrize("term", ["1f1b(p=2, m=", "1f1b(p=2, m=2, q=1)", "unknown_gen(p=2)"])
def test_invalid_terms_exit_2_with_the_core_message(sqlite_cli, term):
    cli = sqlite_cli
    with pytest.raises(MpipeError) as core:
        evaluate(term)
    assert cli("library", "save", "t", term) == (2, "", f"error: {core.value.message}\n")
    assert cli("library", "list")[1] == "no schedules yet\n"


def test_malformed_import_file_exits_2(sqlite_cli, tmp_path):
    cli = sqlite_cli
    path = tmp_path / "lib.json"
    path.write_text('{"format": "something-else"}')
    assert cli("library", "import", str(path)) == (
        2, "", "error: malformed library file: top level: 'format' must be 'mpipe-library' "
               "(is this an mpipe library export?)\n")


def test_runs_commands(cli):
    cli("library", "save", "a", "1f1b(p=2, m=2)")
    code, out, _ = cli("runs", "enqueue", "a", "--steps", "3", "-o", "lr=0.5", "-o", "check_grads=true")
    assert (code, out) == (0, "queued run 1: a@1 on 2 x gloo, 3 step(s)\n")
    run = json.loads(cli("runs", "show", "1", "--json")[1])
    assert run["run"]["options"] == {"lr": 0.5, "check_grads": True}
    assert [e["to_status"] for e in run["events"]] == ["queued"] and run["timing_count"] == 0
    assert [r["id"] for r in json.loads(cli("runs", "list", "--json")[1])] == [1]
    assert cli("runs", "cancel", "1")[1] == "run 1 cancelled\n"
    assert cli("runs", "cancel", "1") == (2, "", "error: run 1 already cancelled; nothing to cancel\n")
    out = cli("runs", "list", "--status", "cancelled")[1]
    assert out.splitlines()[1].split()[:3] == ["1", "cancelled", "a@1"]
    assert cli("runs", "list", "--status", "queued")[1] == "no runs\n"
    assert "queued -> cancelled  by tester" in cli("runs", "show", "1")[1]


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["runs", "show", "notanumber"])
    assert caught.value.code == 2
    assert "error: argument RUN: expected an integer, got 'notanumber'" in capsys.readouterr().err


def test_real_command_exit_code_and_stderr(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPIPE_DB_URL": str(tmp_path / "lib.db")}
    done = subprocess.run([sys.executable, "-m", "mpipe_cli.main", "library", "show", "nothing"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=EVENT_S)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "error: no schedule named 'nothing'\n")
    assert (tmp_path / "lib.db").exists()  # MPIPE_DB_URL as a plain path: an SQLite file
