"""`python -m benchmarks`'s own arguments: help and a wrong part name run nothing."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_help_prints_the_usage_and_runs_no_benchmark():
    done = _run("--help")
    assert done.returncode == 0
    assert done.stdout.startswith("python -m benchmarks [core|mllm|tune|app|executor|profile|memory|worker|all]")
    assert "core:" not in done.stdout and done.stderr == ""  # no table, no progress


def test_an_unknown_part_is_one_line_and_exit_2():
    done = _run("engine")
    assert done.returncode == 2
    assert done.stderr == ("error: unknown benchmark 'engine' (choose from core, mllm, tune, app, executor, "
                           "profile, memory, worker, worker-kill, published, all)\n")


def test_the_tune_benchmark_times_a_small_search_side_by_side(tmp_path):
    """A small instance, this tree against itself as the baseline: a table of
    both and the ratios (the figures themselves are the benchmark's, not the test's)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks", "tune", "-w", "vit-heavy-small", "-p", "2", "-m", "2",
                           "--baseline", str(REPO)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("mpipe tune -w vit-heavy-small -p 2 -m 2 --time-limit 100000, whole process")
    # run, wall, cpu, tried, not tried, best makespan, best term after the tree's name
    rows = [line[10:].split() for line in lines if line.startswith(("this tree  ", "baseline  "))]
    assert len(rows) == 2 and all(row[4] == "0" for row in rows)  # nothing left out
    assert rows[0][5:] == rows[1][5:]  # the same code finds the same best
    assert [line.split(":")[0] for line in lines if line.startswith("baseline / this tree")] == \
        ["baseline / this tree, best wall time of 1 run(s)", "baseline / this tree, best cpu time of 1 run(s)"]
