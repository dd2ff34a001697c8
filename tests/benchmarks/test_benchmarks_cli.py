"""`python -m benchmarks`'s own arguments: help and a wrong part name run nothing."""
import subprocess
import sys
from pathlib import Path

import pytest
from bounds import EVENT_S

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=EVENT_S)


def test_help_prints_the_usage_and_runs_no_benchmark():
    done = _run("--help")
    assert done.returncode == 0
    assert done.stdout.startswith("python -m benchmarks [core|mllm|tune|plan|app|executor|profile|memory|worker|all]")
    assert "core:" not in done.stdout and done.stderr == ""  # no table, no progress


def test_an_unknown_part_is_one_line_and_exit_2():
    done = _run("engine")
    assert done.returncode == 2
    assert done.stderr == ("error: unknown benchmark 'engine' (choose from core, mllm, tune, plan, app, executor, "
                           "profile, memory, worker, worker-kill, published, per-batch, stragglers, layout, "
                           "build-memory, grad-check, comm-timing, all)\n")


def _baseline_tree(folder: Path) -> Path:
    """A copy of this tree's core and CLI whose search tries only the 1F1B body:
    an older tree that finds less, so the two rows must differ."""
    import shutil

    tree = folder / "baseline"
    for package in ("mpipe_core", "mpipe_cli"):
        shutil.copytree(REPO / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    search = tree / "mpipe_core" / "search" / "tune.py"
    text = search.read_text()
    bodies = text[text.index("BODIES = ("):text.index(")\n", text.index("BODIES = (")) + 2]
    search.write_text(text.replace(bodies, 'BODIES = (("1f1b", ""),)\n'))
    return tree


def test_the_tune_benchmark_runs_each_tree_s_own_search_side_by_side(tmp_path):
    """A small instance, this tree against a baseline whose search knows one body:
    a table of both, each row the figures of its own tree's search, and the ratios."""
    import json

    baseline = _baseline_tree(tmp_path)
    done = subprocess.run([sys.executable, "-m", "benchmarks", "tune", "-w", "vit-heavy-small", "-p", "2", "-m", "2",
                           "--baseline", str(baseline)], cwd=REPO, capture_output=True, text=True, timeout=EVENT_S)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("mpipe tune -w vit-heavy-small -p 2 -m 2 --time-limit 100000, whole process")
    # run, wall, cpu, tried, not tried, best makespan, best term after the tree's name
    rows = {line[:10].strip(): line[10:].split(None, 6) for line in lines
            if line.startswith(("this tree  ", "baseline  "))}
    assert set(rows) == {"this tree", "baseline"} and all(row[4] == "0" for row in rows.values())
    for name, tree in (("this tree", REPO), ("baseline", baseline)):  # each row is its own tree's search
        own = subprocess.run([sys.executable, "-m", "mpipe_cli.main", "tune", "-w", "vit-heavy-small", "-p", "2",
                              "-m", "2", "--json", "--time-limit", "100000", "--memory-cap", "none"],
                             cwd=tree, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)},
                             capture_output=True, text=True, timeout=EVENT_S)
        best = json.loads(own.stdout)["best"]
        assert rows[name][6] == best["term"] and float(rows[name][5]) == pytest.approx(best["makespan"], rel=1e-4)
        assert int(rows[name][3]) == own.stderr.count("tune: [")
    assert int(rows["baseline"][3]) < int(rows["this tree"][3])  # it tried one body, not nine
    assert "1f1b(" in rows["baseline"][6] and rows["baseline"][6] != rows["this tree"][6]
    assert [line.split(":")[0] for line in lines if line.startswith("baseline / this tree")] == \
        ["baseline / this tree, best wall time of 1 run(s)", "baseline / this tree, best cpu time of 1 run(s)"]
