"""The plug-in protocol's parts, chained in one process, against the models themselves:
the HF adapters must reproduce the HF model's own loss and every gradient."""
import pytest
import torch

from executor.runtime.models.loader import load_model
from executor.runtime.models.protocol import ModelError, chained_loss, encoder_trainable
from executor.runtime.reference import compare_tensors
from mpipe_core.runs.model_spec import BatchShape, ModelSpec

SHAPE = BatchShape(microbatch_size=2, images=2, text_len=8)


def _grads(model):
    out = {n: p.grad.clone() for n, p in model.root.named_parameters() if p.grad is not None}
    model.root.zero_grad(set_to_none=True)
    return out


def _loss_and_grads(model, fn):
    total = 0.0
    n = sum(model.target_count(model.make_batch(0, m, 2)) for m in range(2))
    for m in range(2):
        loss = fn(model.make_batch(0, m, 2), n)
        loss.backward()
        total += float(loss.detach())
    return total, _grads(model)


@pytest.mark.parametrize("name", ["hf:llava", "hf:qwen2_5_vl"])
@pytest.mark.parametrize("config", ["tiny", "tiny-frozen"])
def test_hf_parts_reproduce_the_hf_model(name, config):
    model = load_model(ModelSpec(name, config, SHAPE))
    assert encoder_trainable(model) == (config == "tiny")
    ref_loss, ref = _loss_and_grads(model, model.reference_loss)
    loss, got = _loss_and_grads(model, lambda b, n: chained_loss(model, b, n))
    assert abs(loss - ref_loss) <= 1e-6 * abs(ref_loss)
    assert set(got) == set(ref) and len(ref) > 20
    assert any(k.startswith("model.language_model.layers.3.") for k in ref)
    assert any("vision" in k or "visual" in k for k in ref) == (config == "tiny")
    for k in ref:
        assert compare_tensors(got[k], ref[k])[2], k


@pytest.mark.parametrize("name", ["hf:llava", "hf:qwen2_5_vl"])
def test_hf_masks_and_positions_matter(name):
    """Padding and image tokens are really in the batch, and the rotary tables
    depend on positions: changing the positions changes the loss."""
    model = load_model(ModelSpec(name, "tiny", SHAPE))
    batch = model.make_batch(0, 0, 1)
    assert (batch["attention_mask"] == 0).any()
    assert (batch["input_ids"] == model.image_token_id).sum() == 4 * model.tokens_per_image
    ctx = model.context(batch)
    cos, _ = ctx.rope
    assert not torch.allclose(cos[..., 1, :], cos[..., 2, :])


def test_checkpoint_round_trip(tmp_path):
    model = load_model(ModelSpec("hf:qwen2_5_vl", "tiny", SHAPE))
    model.root.save_pretrained(tmp_path / "ckpt")
    again = load_model(ModelSpec(f"hf:{tmp_path / 'ckpt'}", None, SHAPE))
    assert type(again.root).__name__ == "Qwen2_5_VLForConditionalGeneration"
    batch = model.make_batch(0, 0, 1)
    n = model.target_count(batch)
    got = float(chained_loss(again, batch, n).detach())
    assert got == pytest.approx(float(model.reference_loss(batch, n).detach()), rel=1e-6)
    frozen = load_model(ModelSpec(f"hf:{tmp_path / 'ckpt'}", "frozen", SHAPE))
    assert not encoder_trainable(frozen)


def test_example_plugin_has_its_own_structure():
    model = load_model(ModelSpec("examples.tiny_mllm:build", None, SHAPE))
    batch = model.make_batch(0, 0, 1)
    # Features are a prefix: the hidden sequence is longer than the text.
    assert model.hidden_shape(batch)[1] == 2 * 3 + 8
    assert (batch["targets"] == -1).any()  # padded texts
    x = model.embedding(batch, model.encoder(batch.images))
    assert tuple(x.shape) == model.hidden_shape(batch)
    assert not encoder_trainable(load_model(ModelSpec("examples.tiny_mllm:build", "frozen", SHAPE)))


@pytest.mark.parametrize("spec,message", [
    (ModelSpec("examples.nope:build"), "--model examples.nope:build: cannot import module 'examples.nope': "
     "ModuleNotFoundError: No module named 'examples.nope'"),
    (ModelSpec("examples.tiny_mllm:nope"), "--model examples.tiny_mllm:nope: module 'examples.tiny_mllm' "
     "has no callable 'nope'"),
    (ModelSpec("examples.tiny_mllm:build", "huge"), "--model examples.tiny_mllm:build: the factory raised "
     "ValueError: unknown config 'huge' (tiny, frozen)"),
    (ModelSpec("hf:/no/such/dir"), "hf:/no/such/dir: the checkpoint folder does not exist"),
    (ModelSpec("hf:llava", "huge"), "hf:llava: unknown model config 'huge' (tiny, tiny-frozen, small, small-frozen)"),
    (ModelSpec("nonesuch"), "--model nonesuch: unknown model (presets: tiny,"),
])
def test_bad_models_are_one_clear_line(spec, message):
    with pytest.raises(ModelError) as info:
        load_model(spec)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- through the executor

def _failures(results):
    return [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in results
            if not r.grad_check["ok"]]


@pytest.mark.parametrize("model", ["llava", "qwen2_5_vl", "example"])
def test_schedule_matrix_in_process(model):
    """Ranks as threads: every schedule of the matrix equals the unpipelined model."""
    from own_model_matrix import matrix_jobs

    from executor.runtime.rank import run_local

    jobs = matrix_jobs(model)
    results = run_local(jobs, 2)
    assert len(results) == len(jobs) == 12
    assert not _failures(results)
    assert all(r.grad_check["steps"][0]["parameters"] for r in results)


def test_p4_where_cheap():
    from own_model_matrix import own_job, spec_for

    from executor.runtime.rank import run_local

    jobs = [own_job(t, spec_for("example", False)) for t in
            ("1f1b(p=4, m=4)", "transpose(1f1b(p=4, m=4), mode=prefix, backward=owner)")]
    assert not _failures(run_local(jobs, 4))


def test_a_model_with_fewer_layers_than_chunks_is_refused():
    from executor.runtime.models.workload import check_fits, model_workload
    from mpipe_core.workloads.workload import load_workload

    model = load_model(ModelSpec("examples.tiny_mllm:build", None, SHAPE))
    with pytest.raises(ModelError, match="has 4 layers but the schedule needs 8 chunks"):
        check_fits(model, load_workload(model_workload(model)), 8, 4)


def test_spec_helpers_for_the_app_are_torch_free():
    """The app may not import torch: what it needs to name a model, queue a run
    of it and profile it lives in `mpipe_core.runs.model_spec`."""
    import subprocess
    import sys

    code = ("import sys; from mpipe_core.runs.model_spec import ModelSpec, spec_from_options, BatchShape; "
            "s = ModelSpec('hf:llava', 'tiny', BatchShape(2, 1, 16)); "
            "assert spec_from_options(s.run_options()) == s; "
            "print(' '.join(s.profile_argv('w.json')[3:])); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["profile --model hf:llava --microbatch-size 2 --seq-len 16 --images 1 "
                                "--device cpu -o w.json --model-config tiny", "False"]


def test_every_generator_and_combinator_runs_the_plugin():
    from own_model_matrix import own_job, spec_for

    from executor.runtime.rank import run_local

    spec = spec_for("example", False)
    terms = ["gpipe(p=2, m=4)", "zb_h1(p=2, m=4)", "zb_h2(p=2, m=4)", "dualpipev(p=2, m=4)",
             "looped_bfs(p=2, m=4)", "defer_w(split_bw(1f1b(p=2, m=4)))",
             "transpose(dualpipev(p=2, m=4), mode=dynamic, shards=2, backward=owner)",
             "transpose(1f1b(p=2, m=4), mode=prefix, overflow=min)"]
    assert not _failures(run_local([own_job(t, spec) for t in terms], 2))
    assert not _failures(run_local([own_job("encoder_stage(1f1b(p=2, m=4))", spec)], 3))
