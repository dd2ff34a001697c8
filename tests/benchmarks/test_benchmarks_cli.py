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
    assert done.stdout.startswith("python -m benchmarks [core|mllm|app|executor|profile|memory|worker|all]")
    assert "core:" not in done.stdout and done.stderr == ""  # no table, no progress


def test_an_unknown_part_is_one_line_and_exit_2():
    done = _run("engine")
    assert done.returncode == 2
    assert done.stderr == ("error: unknown benchmark 'engine' (choose from core, mllm, app, executor, profile, "
                           "memory, worker, all)\n")
