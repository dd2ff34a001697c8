"""The Plan page's Launch in words (`app/plan_launch.py`): the schedule name a row
is saved under, and what of its layout the queue runs (the queue's own rule:
a row asking for tp runs one pipeline, and the page says so before the click)."""
from __future__ import annotations

from app.plan_launch import default_name, what_runs
from mpipe_core.runs.layout import RunLayout
from mpipe_core.runs.run_spec import RunSpec

DOC = {"model": {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 128, "vocab": 1000, "ffn": 1024},
       "device": "a100", "cluster": "dgx-a100"}


def test_a_row_the_queue_runs_whole():
    spec = RunSpec("1f1b(p=2, m=4)", DOC, RunLayout(pp=2, dp=2, distributed_optimizer=True))
    assert what_runs(spec) == "Queues tp=1 cp=1 pp=2 dp=2 distributed_optimizer (4 ranks)."
    assert default_name("saved:tiny mllm@1", spec) == "plan-saved-tiny-mllm-1-pp2-dp2"


def test_a_row_asking_for_tp_says_it_runs_one_pipeline():
    spec = RunSpec("1f1b(p=2, m=4)", DOC, RunLayout(tp=2, sp=True, pp=2, dp=4))
    assert what_runs(spec) == (
        "Queues tp=1 cp=1 pp=2 dp=1 (2 ranks); the row asks for tp=2 sp cp=1 pp=2 dp=4 (16 ranks): the queue cannot "
        "yet tell whether the model it runs has a tensor-parallel plan, so the run executes one pipeline and says "
        "what it dropped (mpipe run --spec runs the whole layout).")
    assert default_name("internvl-26b", spec) == "plan-internvl-26b-tp2-pp2-dp4"
