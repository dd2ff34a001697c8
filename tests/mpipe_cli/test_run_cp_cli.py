"""`mpipe run ... --parallel cp=2` (issue 39 section 4): a pp x cp layout of the
built-in model passes the gradient check, its result carrying the timed K/V
gathers; cp with a model that has no context-parallel attention is one error line."""
import json

from cli_runner import run_cli


def test_a_cp_layout_runs_with_exact_gradients():
    out = run_cli(["run", "zbv(p=2, m=4)", "--parallel", "cp=2", "--model", "tiny-text", "--in-process",
                   "--check-grads", "--json"])
    assert out.code == 0, out.err
    doc = json.loads(out.out)
    assert doc["layout"]["cp"] == 2 and doc["grad_check"]["ok"]
    assert {"cp_comm", "dp_comm", "optimizer"} <= {c["kind"] for c in doc["comm"]}


def test_cp_with_a_model_without_cp_attention_is_refused():
    out = run_cli(["run", "1f1b(p=2, m=4)", "--parallel", "cp=2", "--model", "hf:llava"])
    assert (out.code, out.error_lines, out.traceback) == (
        2, ["error: layout cp=2: model hf:llava has no context-parallel attention (run it with cp=1)"], None)
