"""A queued run's data file (`-o data=PATH`) must be under the operator's data root:
refused with one line before queueing, and again by the worker."""
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "mpipe_cli"))  # cli_runner
from cli_runner import run_cli  # noqa: E402

from executor.service.run_setup import RunSpec  # noqa: E402
from mpipe_core.runs.model_registry import load_registry  # noqa: E402
from mpipe_core.runs.run_options import RunOptionError  # noqa: E402
from storage.runs import ClaimedRun  # noqa: E402


def _allow_list(folder: Path, data_root: Path | None) -> Path:
    path = folder / "models.toml"
    path.write_text("entry_points = false\n" + (f"data_root = {str(data_root)!r}\n" if data_root else ""))
    return path


@pytest.fixture
def roots(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    (root / "ok.jsonl").write_text('{"images": 0, "tiles": [], "text_tokens": 4}\n')
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"images": 0, "tiles": [], "text_tokens": 4}\n')
    (root / "link.jsonl").symlink_to(outside)  # inside by name, outside in fact
    return tmp_path, root, outside


def test_enqueue_refuses_data_outside_the_root_in_one_line(roots):
    tmp, root, outside = roots
    models = _allow_list(tmp, root)
    db = str(tmp / "q.db")
    for path, why in [(outside, f"not under the data root {root}"),
                      (root / "link.jsonl", f"not under the data root {root} (it resolves to {outside})")]:
        out = run_cli(["runs", "enqueue", "s", "-o", f"data={path}", "--models", str(models), "--db", db])
        assert (out.code, out.err.strip().splitlines(), out.traceback) == (
            2, [f"error: run option data: {path}: {why}"], None)
    out = run_cli(["runs", "enqueue", "s", "-o", f"data={root}/ok.jsonl", "--models", str(_allow_list(tmp, None)),
                   "--db", db])
    assert out.code == 2
    assert out.err.strip().splitlines() == [
        f"error: run option data: {root}/ok.jsonl: data files are refused here: the operator has set no data root "
        "(data_root in the allow-list, $MPIPE_MODELS)"]


def test_the_worker_refuses_it_again_and_admits_a_file_under_the_root(roots):
    tmp, root, outside = roots
    registry = load_registry(str(_allow_list(tmp, root)))

    def claimed(data: str) -> ClaimedRun:
        return ClaimedRun(id=7, schedule="s", version=1, term="1f1b(p=2, m=2)", workload=None, backend="gloo",
                          nproc=2, steps=1, options={"data": data}, attempt=1,
                          lease_expires_at=datetime.now(timezone.utc))

    with pytest.raises(RunOptionError) as info:
        RunSpec.from_claimed(claimed(str(outside)), registry)  # e.g. written to the database by hand
    assert info.value.message == f"run option data: {outside}: not under the data root {root}"
    assert RunSpec.from_claimed(claimed(f"{root}/ok.jsonl"), registry).data == f"{root}/ok.jsonl"
