"""disaggregate(...) on 3 gloo ranks under torchrun (2 LLM ranks + 1 encoder rank):
the built-in MLLM and HF tiny LLaVA, trainable and frozen, in ONE launch (starting
ranks costs seconds here), with colocated's barriers and a grouped transpose on
the same 3 ranks (their tokens and gathered features over real gloo channels);
the rest runs in-process (test_layouts.py)."""
import pytest

from executor.service.launch import LaunchOptions, launch

from layouts_matrix import DISAGGREGATED, MODELS, figures, layout_job

pytestmark = pytest.mark.slow
THREE_COLOCATED = "colocated(1f1b(p=3, m=6))"
THREE_GROUPED = "encoder_batch(transpose(1f1b(p=3, m=6)), 2)"


def test_disaggregate_over_torchrun_matches_the_unpipelined_model(tmp_path):
    jobs = [layout_job(DISAGGREGATED, model, frozen) for model in MODELS for frozen in (False, True)]
    others = [layout_job(term, "builtin", False) for term in (THREE_COLOCATED, THREE_GROUPED)]
    results = launch(jobs + others, LaunchOptions(nproc=3, stall_s=120, run_dir=str(tmp_path / "run")))
    assert [r.name for r in results] == [j.name for j in jobs + others]
    print("\n" + "\n".join(figures(r) for r in results))
    bad = [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in results if not r.grad_check["ok"]]
    assert not bad
    colocated = results[len(jobs)]
    assert {row.kind for row in colocated.timeline if row.module == "vision"} == {"F", "GATHER", "SCATTER", "BW", "AR"}
    for r, j in zip(results, jobs):
        assert r.devices == 3 and len(r.clock_offsets) == 3
        assert {row.module for row in r.timeline if row.device == 2} == {"vision"}
        assert {row.module for row in r.timeline if row.device < 2} == {"llm"}
        assert {row.kind for row in r.timeline if row.device == 2} == ({"F"} if "frozen" in j.name else {"F", "BW"})
