"""The iteration lines of Megatron-LM/MindSpeed, MindSpeed-MM FSDP and torchtitan
logs (mpipe_core/formats/training_log.py), on text written as each stack writes it."""
import pytest

from mpipe_core.formats.training_log import (MEGATRON, MINDSPEED_MM, TORCHTITAN, LogFormatError,
                                             parse_training_log)
from training_logs import megatron_log, megatron_line, mindspeed_mm_log, torchtitan_log


def test_megatron_lines_give_each_iteration_time_its_throughput_and_the_world_size():
    log = parse_training_log(megatron_log([2500.0, 1420.3, 1419.9], tflops=[80.0, 137.1, 137.2]))
    assert log.format == MEGATRON and log.world_size == 16
    assert [x.step_ms for x in log.lines] == [2500.0, 1420.3, 1419.9]
    assert [x.tflops for x in log.lines] == [80.0, 137.1, 137.2]
    assert [x.iteration for x in log.lines] == [1, 2, 3]
    assert [x.line for x in log.lines] == [3, 4, 5]  # after the two start-up lines
    assert log.incomplete == ()


def test_megatron_without_log_throughput_has_no_tflops():
    log = parse_training_log(megatron_log([1000.0, 1001.0], world=None))
    assert log.format == MEGATRON and log.world_size is None
    assert [x.tflops for x in log.lines] == [None, None]


def test_mindspeed_mm_fsdp_lines_are_told_from_megatron_by_their_fields():
    log = parse_training_log(mindspeed_mm_log([900.0, 512.5, 511.0]))
    assert log.format == MINDSPEED_MM and log.world_size is None
    assert [x.step_ms for x in log.lines] == [900.0, 512.5, 511.0]
    assert "MindSpeed-MM" in log.label


def test_torchtitan_lines_are_read_after_their_colour_codes_and_validation_is_not_a_step():
    log = parse_training_log(torchtitan_log([1234.0, 5120.0, 5100.0]))
    assert log.format == TORCHTITAN and log.world_size == 16
    assert [x.tokens_per_s for x in log.lines] == [1234.0, 5120.0, 5100.0]  # "5,120" with its comma
    assert [x.iteration for x in log.lines] == [1, 2, 3]
    assert log.lines[0].tflops == 100.0 and log.lines[0].mfu == pytest.approx(0.30)


def test_a_truncated_last_line_is_left_out_and_counted():
    text = megatron_log([2000.0, 1000.0, 1000.0])
    last = megatron_line(4, 4, 1500.0)
    cut = text + last[:last.index("(ms): ") + 8]  # the job died mid-line: "... (ms): 15"
    assert cut.endswith("elapsed time per iteration (ms): 15")
    log = parse_training_log(cut)
    assert [x.step_ms for x in log.lines] == [2000.0, 1000.0, 1000.0]
    assert log.incomplete == (6,)
    titan = torchtitan_log([1000.0, 2000.0]).rstrip("\n").rsplit("\n", 1)[0]  # (without the validation line)
    log = parse_training_log(titan + "\n" + "step: 3  loss: 7.0  tps: 2,000  tflops: 100.00  mfu: 3")
    assert [x.tokens_per_s for x in log.lines] == [1000.0, 2000.0] and len(log.incomplete) == 1


@pytest.mark.parametrize("text, message", [
    ("", "no iteration line of a known format"),
    ("> building GPT model ...\n[after training is done] datetime: 2026-12-07\n", "no iteration line of a known format"),
    ("iteration 1/10 | elapsed time per iteration (ms): 12", "no complete iteration line (line 1 is cut short)"),
])
def test_a_log_without_iteration_lines_is_refused(text, message):
    with pytest.raises(LogFormatError) as err:
        parse_training_log(text)
    assert str(err.value).startswith(message)
