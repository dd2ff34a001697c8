"""`mpipe run` without launching: in-process runs and refusals."""
import json

from mpipe_cli.main import main


def test_in_process_run_prints_json(capsys):
    rc = main(["run", "transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)", "--in-process",
               "--check-grads", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["grad_check"]["ok"]
    assert {r["kind"] for r in out["timeline"]} >= {"BCAST", "AR", "F", "BW"}


def test_unrunnable_terms_are_refused_before_launch(capsys):
    assert main(["run", "repeat(1f1b(p=2, m=2), n=2)", "--model", "tiny-text"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert main(["run", "interleaved(p=4, m=4, v=4)", "--model", "tiny-text"]) == 2
    assert "16 chunks" in capsys.readouterr().err
    assert main(["run", "1f1b(p=2, m=2)", "--model", "nope"]) == 2
    assert "unknown model preset" in capsys.readouterr().err


def test_hccl_without_torch_npu_is_a_clear_error(capsys):
    assert main(["run", "1f1b(p=2, m=2)", "--model", "tiny-text", "--backend", "hccl"]) == 2
    assert "torch_npu" in capsys.readouterr().err
