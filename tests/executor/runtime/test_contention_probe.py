"""The contention probe: its arithmetic, and one real (small) probe."""
from statistics import fmean, median

import pytest

from executor.runtime.contention_probe import ContentionProbe, probe_contention
from executor.runtime.model import ModelConfig
from bounds import EVENT_S


def test_contention_is_the_median_round_ratio_per_extra_device():
    # Rounds: together / alone = 1.5, 1.2, 3.0 -> median 1.5; two devices -> c = 0.5.
    probe = ContentionProbe(2, alone_ms=[[10, 10], [10, 10], [10, 10]], together_ms=[[15, 15], [12, 12], [30, 30]])
    assert probe.ratios == pytest.approx([1.5, 1.2, 3.0])
    assert probe.contention == pytest.approx(0.5)
    assert ContentionProbe(3, [[10.0]], [[20.0]]).contention == pytest.approx(0.5)  # 1 + 2c = 2
    assert ContentionProbe(2, [[10.0]], [[9.0]]).contention == 0.0  # never negative
    assert probe.fixed_ms == 0.0  # no half-batch timings
    # Halves of 6 against wholes of 10: fixed = 2 x 6 - 10 = 2 (each extra shard pays it).
    halved = ContentionProbe(2, [[10, 10], [10, 10]], [[15, 15], [15, 15]], half_ms=[[6, 6], [6, 6]])
    assert halved.fixed_ms == pytest.approx(2.0)
    assert halved.host() == {"devices": None, "contention": 0.5, "dispatch": 2.0}


def test_pairs_come_from_the_llm_stand_in_alone_beside_encoders_and_together():
    # LLM op 10 alone, 14 beside an encoder (c 0.4), 10.5 beside LLM ops (0.05); encoder 100 alone,
    # 103 beside LLM ops (0.03), 110 beside an encoder (0.1).
    probe = ContentionProbe(2, alone_ms=[[100.0, 100.0]], together_ms=[[110.0, 110.0]],
                            llm_alone_ms=[[10.0, 10.0]], llm_beside_encoder_ms=[[14.0, 14.0]],
                            llm_together_ms=[[10.5, 10.5]], encoder_beside_llm_ms=[[103.0, 103.0]])
    assert probe.pairs == {"llm": {"encoder": pytest.approx(0.4), "llm": pytest.approx(0.05)},
                           "encoder": {"encoder": pytest.approx(0.1), "llm": pytest.approx(0.03)}}
    assert probe.host()["pairs"] == probe.pairs
    assert "llm|encoder 0.40" in probe.format()
    # Three processes: beside one encoder the third runs LLM ops too, 1 + c_le + c_ll = 1.45 -> c_le 0.4.
    three = ContentionProbe(3, alone_ms=[[100.0]], together_ms=[[120.0]], llm_alone_ms=[[10.0]],
                            llm_beside_encoder_ms=[[14.5]], llm_together_ms=[[11.0]],
                            encoder_beside_llm_ms=[[106.0]])
    assert three.pairs["llm"] == {"encoder": pytest.approx(0.4), "llm": pytest.approx(0.05)}
    assert three.pairs["encoder"] == {"encoder": pytest.approx(0.1), "llm": pytest.approx(0.03)}
    assert "pairs" not in ContentionProbe(2, [[10.0]], [[12.0]]).host()  # no LLM timings: none


@pytest.mark.slow
def test_a_real_probe_times_the_encoder_alone_and_together():
    cfg = ModelConfig(trainable_encoder=False, images_min=2, images_max=2)
    probe = probe_contention(cfg, devices=2, rounds=2, timeout_s=120)
    assert len(probe.alone_ms) == len(probe.together_ms) == len(probe.half_ms) == 2
    assert all(len(r) == 2 and min(r) > 0 for r in probe.alone_ms + probe.together_ms + probe.half_ms)
    assert all(min(r) > 0 for r in probe.llm_alone_ms + probe.llm_beside_encoder_ms + probe.llm_together_ms)
    # The figures reported are these timings' (2 devices: c = median round ratio - 1; figures that come
    # out below 0, noise on an idle host, read as 0).
    def c(alone, beside):
        return max(0.0, median(fmean(b) / fmean(a) for a, b in zip(alone, beside)) - 1.0)

    assert probe.contention == pytest.approx(c(probe.alone_ms, probe.together_ms))
    assert probe.fixed_ms == pytest.approx(max(0.0, median(2 * fmean(h) - fmean(a)
                                                           for a, h in zip(probe.alone_ms, probe.half_ms))))
    assert probe.pairs == {
        "llm": {"encoder": pytest.approx(c(probe.llm_alone_ms, probe.llm_beside_encoder_ms), abs=1e-4),
                "llm": pytest.approx(c(probe.llm_alone_ms, probe.llm_together_ms), abs=1e-4)},
        "encoder": {"encoder": pytest.approx(probe.contention, abs=1e-4),
                    "llm": pytest.approx(c(probe.alone_ms, probe.encoder_beside_llm_ms), abs=1e-4)}}
    assert f"host contention {probe.contention:.2f}" in probe.format()


def test_a_model_without_encoder_is_refused_in_one_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "executor.runtime.contention_probe", "--model", "tiny-text"],
                         capture_output=True, text=True, timeout=EVENT_S)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: model 'tiny-text': the contention probe times the encoder: "
                                  "this model has none")
