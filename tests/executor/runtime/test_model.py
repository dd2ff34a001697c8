import pytest
import torch

from executor.errors import ExecutorError
from executor.runtime.model import (
    MLLM,
    LanguageModel,
    ModelConfig,
    VisionEncoder,
    make_microbatch,
    shard_bounds,
    tokens_per_step,
)
from executor.runtime.partition import build_rank_model, make_chunks, split_layers


def test_split_layers_even_with_remainder_first():
    assert [len(r) for r in split_layers(8, 3)] == [3, 3, 2]
    assert [list(r) for r in split_layers(4, 4)] == [[0], [1], [2], [3]]
    with pytest.raises(ExecutorError, match="8 LLM layers but the schedule needs 16 chunks"):
        split_layers(8, 16)


def test_shard_bounds_cover_images_in_order():
    assert shard_bounds(5, 2) == [(0, 3), (3, 5)]
    assert shard_bounds(1, 3) == [(0, 1), (1, 1), (1, 1)]


def test_partial_models_hold_the_reference_values():
    cfg = ModelConfig()
    full = MLLM(cfg)
    part = LanguageModel(cfg, layers=[5], embed=False, head=True)
    ref = dict(full.named_parameters())
    for name, p in part.named_parameters():
        assert torch.equal(p, ref[f"llm.{name}"]), name
    enc = VisionEncoder(cfg)
    for name, p in enc.named_parameters():
        assert torch.equal(p, ref[f"vision.{name}"]), name


def test_data_is_deterministic_and_images_vary():
    cfg = ModelConfig(images_min=1, images_max=4, batch=2, images_seed=3)
    a, b = make_microbatch(cfg, 1, 2, 8), make_microbatch(cfg, 1, 2, 8)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.images, b.images)
    counts = cfg.image_counts(8)
    assert len(set(counts)) > 1
    assert make_microbatch(cfg, 0, 5, 8).images.shape[0] == counts[5]
    # Image positions hold the features; targets exist only on text.
    mb = make_microbatch(cfg, 0, 0, 8)
    assert len(mb.image_index[0]) == counts[0] * cfg.tokens_per_image
    assert int((mb.targets >= 0).sum()) == cfg.batch * (cfg.text_len - 1)


def test_chunks_chained_equal_the_whole_model():
    cfg = ModelConfig(images_min=2, images_max=2)
    full = MLLM(cfg)
    chunks = make_chunks(cfg, 3)
    lm = build_rank_model(cfg, chunks)
    mb = make_microbatch(cfg, 0, 0, 1)
    n = tokens_per_step(cfg, 1)
    feats = full.vision(mb.images)
    x = None
    for ch in chunks:
        x = ch.forward(lm, x, feats if ch.first else None, mb, n)
    assert torch.equal(x, full.microbatch_loss(mb, n))


def test_a_stated_split_gives_each_chunk_its_layers():
    from executor.runtime.plan import build_plan
    from mpipe_core.api import evaluate

    plan = build_plan(evaluate("partition(1f1b(p=2, m=2), [2, 6])", {"llm": {"layers": 8}}).schedule)
    assert plan.layers == (2, 6)
    assert [list(r) for r in split_layers(8, 2, plan.layers)] == [[0, 1], [2, 3, 4, 5, 6, 7]]
    with pytest.raises(ExecutorError, match=r"splits the LLM as \[2, 6\] but the model has 4 layers"):
        split_layers(4, 2, plan.layers)


def test_the_core_knows_every_model_preset_a_run_option_may_name():
    """`mpipe_core.runs.run_options` cannot import the executor; it keeps the names in step."""
    from executor.runtime.model import MODEL_PRESETS
    from mpipe_core.runs.run_options import MODEL_PRESET_NAMES

    assert MODEL_PRESET_NAMES == tuple(MODEL_PRESETS)


def test_the_core_knows_every_model_presets_encoder_frozen_or_trainable():
    """The app refuses a preset that cannot train a schedule's workload before queueing, from the core's copy."""
    from executor.runtime.model import MODEL_PRESETS
    from mpipe_core.runs.model_spec import PRESET_ENCODERS

    assert PRESET_ENCODERS == {name: (cfg.encoder, cfg.trainable_encoder) if cfg.encoder else None
                               for name, cfg in MODEL_PRESETS.items()}
