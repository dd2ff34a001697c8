"""`mpipe run --data`: every step planned from its own drawn batch, run with
shaped messages, and checked against a single-process run on the same batches."""
import json

import pytest
import torch

from executor.runtime.rank import run_local
from executor.runtime.transport import LocalHub, LocalTransport
from executor.service.run_setup import RunSpec, prepare
from mpipe_core.workloads.batch_costs import drawn_batches

from data_samples import data_file  # noqa: F401 - a fixture

# Eight samples, cycled: 1-4 tiles an image, up to 3 images, one text-only, one video.
TERM = "per_batch(transpose(1f1b(p=2, m=6), mode=dynamic))"
BUDGET_MS = 60_000.0  # unbounded: the plans do not depend on how loaded the machine is


def _run_and_check(spec: RunSpec):
    prep = prepare(spec)
    (result,) = run_local([prep.job], prep.devices, timeout_s=120)
    plans = result.plans
    # Three steps, three different plans (schedule and microbatch order), every one checked.
    assert len({p["digest"] for p in plans}) == 3, [p["how"] for p in plans]
    check = result.grad_check
    assert check["ok"], [s["failures"] for s in check["steps"]]
    assert [s["ok"] for s in check["steps"]] == [True] * 3
    # Each step's reference loss is its own batch's: the steps' losses differ.
    assert len({round(s["reference_loss"], 6) for s in check["steps"]}) == 3
    return prep, result


def test_builtin_model_exact_over_three_steps_whose_plans_differ(data_file):
    prep, result = _run_and_check(RunSpec(term=TERM, data=data_file, steps=3, check_grads=True,
                                          plan_budget_ms=BUDGET_MS))
    plans = result.plans
    # What the core draws for the same data and term: the same packs, in the plan's order.
    from executor.service.run_setup import _with_data

    _, _, wl = _with_data(RunSpec(term=TERM, data=data_file))
    for plan, batch in zip(plans, drawn_batches(wl, 6, 3)):
        drawn = [p.tiles for p in batch.of(0)]
        assert plan["tiles"] == [drawn[i] for i in plan["order"]]
        assert plan["tokens"] == [batch.of(0)[i].tokens for i in plan["order"]]
    # Tiles per microbatch vary within a step and between steps.
    assert all(len(set(p["tiles"])) > 1 for p in plans)
    assert len({tuple(sorted(p["tiles"])) for p in plans}) > 1
    # The timeline has every step's ops; the built-in model got the data's longest pack.
    assert {r.step for r in result.timeline} == {0, 1, 2}
    assert prep.model.max_seq == 40 and prep.model.batch == 1
    assert any(p["how"].startswith("re-placed") for p in plans)  # one step's encoder ops placed again


@pytest.fixture
def one_thread():
    """One intra-op thread, as every torchrun rank has (OMP_NUM_THREADS=1): on CPU, SDPA's
    attention kernel blocks its work by the thread count, and with the ranks' threads and
    the reference's differing, LLaVA's query-projection gradients (tiny next to the
    rest) differ by 2e-6 of their largest element, twice the check's slack."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_hf_llava_exact_over_three_steps_whose_plans_differ(data_file, one_thread):
    pytest.importorskip("transformers")
    _, result = _run_and_check(RunSpec(term="per_batch(transpose(1f1b(p=2, m=5), mode=dynamic))", model="hf:llava",
                                       data=data_file, steps=3, check_grads=True, plan_budget_ms=BUDGET_MS))
    assert all(p["how"].startswith("re-placed") for p in result.plans)


def test_shaped_messages_carry_their_shape():
    hub = LocalHub(2, timeout_s=5)
    a, b = LocalTransport(hub, 0), LocalTransport(hub, 1)
    sent = [torch.arange(6.0).reshape(1, 2, 3), torch.empty(0, 4), torch.ones(2, 5, 1)]
    a.post_shaped([(1, t) for t in sent])
    handles = [b.post_shaped_recv(0, "cpu") for _ in sent]
    got = [b.wait_shaped(h) for h in handles]
    assert [tuple(t.shape) for t in got] == [(1, 2, 3), (0, 4), (2, 5, 1)]
    assert all(torch.equal(x, y) for x, y in zip(got, sent))


def _error(argv, capsys):
    from mpipe_cli.main import main

    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_data_tokens_must_be_the_models(tmp_path, data_file, capsys):
    doc = json.loads(open(data_file).read())
    doc["samples"] = data_file.replace("data.json", "samples.jsonl")
    doc["tokens"] = {"per_tile": 256}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, err = _error(["run", TERM, "--data", str(bad), "--in-process"], capsys)
    assert code == 2
    assert err == [f"error: --data {bad}: tokens.per_tile is 256 but the model's encoder gives 4 tokens per "
                   "input (a tile or a frame is one input)"]


def plugin_without_data_batch(config=None, shape=None):
    """The example plug-in as written before `--data`: no `data_batch`."""
    from examples.tiny_mllm import build

    model = build(config, shape) if shape is not None else build(config)
    model.data_batch = None
    return model


def test_a_model_without_data_batch_is_refused(data_file, capsys):
    model = f"{__name__}:plugin_without_data_batch"
    code, err = _error(["run", TERM, "--model", model, "--data", data_file, "--in-process"], capsys)
    assert code == 2
    assert err == ["error: model 'examples.tiny_mllm' has no data_batch(pieces, key), so --data cannot shape its "
                   "batches (docs/running.md, the plug-in protocol)"]


@pytest.mark.slow
def test_torchrun_data_run_sends_shapes_and_matches_the_reference(data_file, tmp_path):
    """The real transport (gloo, two processes): headers on their own groups, payloads after them."""
    from executor.service.launch import LaunchOptions, launch

    prep = prepare(RunSpec(term=TERM, data=data_file, steps=3, check_grads=True, plan_budget_ms=BUDGET_MS))
    (result,) = launch([prep.job], LaunchOptions(nproc=2, stall_s=120, run_dir=str(tmp_path)))
    assert len({p["digest"] for p in result.plans}) == 3
    assert result.grad_check["ok"], [s["failures"] for s in result.grad_check["steps"]]


REGROUP_TERM = "per_batch(colocated(zb_h1(p=3, m=6)))"


def _pieces(packs):
    return sorted((tuple(p.tiles), p.text_tokens, p.frames) for pack in packs for p in pack.pieces)


EXAMPLE = "examples.tiny_mllm:build"  # the example plug-in: resampler prefix, ALiBi layers


@pytest.mark.parametrize("model", ["builtin", "hf:llava", "hf:qwen2_5_vl", EXAMPLE])
def test_regrouped_steps_run_the_same_samples_and_stay_exact(data_file, model, one_thread):
    """Steps whose plans re-compose the microbatches (`data.regroup`): the slots hold the
    drawn samples dealt again, and the gradient check against the single-process run of
    the same microbatches is exact on each of three steps whose plans differ."""
    if model.startswith("hf:"):
        pytest.importorskip("transformers")
    spec = RunSpec(term=REGROUP_TERM, data=data_file, steps=3, check_grads=True, plan_budget_ms=BUDGET_MS,
                   **({} if model == "builtin" else {"model": model}))
    prep, result = _run_and_check(spec)
    from executor.service.run_setup import _with_data

    _, _, wl = _with_data(spec)  # the model's own tokens per tile (the example's are 3)
    regrouped = [p for p in result.plans if p["regrouped"]]
    assert regrouped and all(p["how"].startswith("regrouped") for p in regrouped)
    for step, plan, batch in zip(prep.job.data_steps, result.plans, drawn_batches(wl, 6, 3)):
        drawn = batch.of(0)
        ran = sorted((tuple(t), n, f) for pack in step["packs"] for t, n, f in pack["pieces"])
        assert ran == _pieces(drawn)  # the same samples, whichever microbatch holds them
        assert sum(plan["tokens"]) == sum(p.tokens for p in drawn)
        if not plan["regrouped"]:
            assert plan["tiles"] == [drawn[i].tiles for i in plan["order"]]


def _step(model, entries):
    """One step run in one process on `entries` (a step plan's packs): its total loss and
    every parameter's gradient, each microbatch's loss over the step's target count."""
    from executor.runtime.step_plans import DataStep

    batches = DataStep(None, entries, {}).batches(model)
    normalizer = sum(model.target_count(b) for b in batches)
    model.root.zero_grad(set_to_none=True)
    total = 0.0
    for batch in batches:
        loss = model.reference_loss(batch, normalizer)
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.detach().clone() for n, p in model.root.named_parameters() if p.grad is not None}
    model.root.zero_grad(set_to_none=True)
    return total, normalizer, grads


@pytest.mark.parametrize("model_name", ["builtin", "hf:llava", "hf:qwen2_5_vl", EXAMPLE])
def test_regrouping_a_step_changes_neither_its_loss_nor_its_gradients(data_file, model_name, one_thread):
    """The same drawn step as drawn and re-composed by `regroup`: each piece is seeded by its
    own key and attends only within itself (positions from 0), as packed training with
    per-sample masks runs it, so the step's loss and gradients do not depend on the grouping."""
    if model_name.startswith("hf:"):
        pytest.importorskip("transformers")
    from executor.runtime.reference import compare_tensors
    from executor.service.data_run import pack_entry
    from executor.service.run_setup import _with_data
    from mpipe_core.data.regroup import regroup

    spec = RunSpec(term=REGROUP_TERM, data=data_file, steps=1,
                   **({} if model_name == "builtin" else {"model": model_name}))
    prep = prepare(spec)
    model = prep.job.build_model()
    _, _, wl = _with_data(spec)
    checked = 0
    for batch in drawn_batches(wl, 6, 3):
        drawn = batch.of(0)
        again = regroup(drawn, wl.data.tokens, wl.data.packing)
        if again is None:
            continue
        home = {p.key: i for i, pack in enumerate(drawn) for p in pack.pieces}
        assert any(home[p.key] != i for i, pack in enumerate(again) for p in pack.pieces)  # pieces moved
        loss, n, grads = _step(model, [pack_entry(p, f"{batch.index}.{i}") for i, p in enumerate(drawn)])
        loss2, n2, grads2 = _step(model, [pack_entry(p, f"{batch.index}.r{i}") for i, p in enumerate(again)])
        assert n2 == n
        assert loss2 == pytest.approx(loss, rel=1e-5, abs=0)
        assert grads2.keys() == grads.keys()
        floor = max(float(g.abs().max()) for g in grads.values())
        bad = {k: compare_tensors(grads2[k], g, floor)[:2] for k, g in grads.items()
               if not compare_tensors(grads2[k], g, floor)[2]}
        assert not bad
        checked += 1
    assert checked


def test_a_plan_stored_before_piece_keys_still_runs_seeded_by_its_packs():
    """Step plans without `piece_keys` (made before pieces had keys) load, and each pack's
    tensors come from its key as before; with them, a piece's tensors are its own."""
    from executor.runtime.model import ModelConfig
    from executor.runtime.models.builtin import BuiltinModel
    from executor.runtime.step_plans import DataStep

    model = BuiltinModel(ModelConfig(max_seq=40))
    old = [{"key": "0.0", "pieces": [[[2], 6, 0], [[], 9, 0]]}]
    (batch,) = DataStep(None, old, {}).batches(model)
    assert torch.equal(batch["tokens"], model.data_batch([((2,), 6, 0), ((), 9, 0)], "0.0")["tokens"])
    # With keys: the piece "1" gets the same words wherever it is, and its positions start at 0.
    alone = DataStep(None, [{"key": "0.0", "pieces": [[[], 9, 0]], "piece_keys": ["1"]}], {}).batches(model)[0]
    both = DataStep(None, [{**old[0], "piece_keys": ["0", "1"]}], {}).batches(model)[0]
    assert torch.equal(both["tokens"][0, -9:], alone["tokens"][0])
    assert both["positions"][0, -9:].tolist() == list(range(9))


def test_a_plug_in_whose_data_batch_takes_no_piece_keys_is_seeded_per_pack():
    from executor.runtime.step_plans import DataStep

    class Old:
        def data_batch(self, pieces, key):
            return (pieces, key)

    class New:
        def data_batch(self, pieces, key, piece_keys=None):
            return (pieces, key, piece_keys)

    packs = [{"key": "2.r0", "pieces": [[[1], 3, 0], [[], 4, 0]], "piece_keys": ["17", "18/2"]}]
    assert DataStep(None, packs, {}).batch(Old(), 0) == ([((1,), 3, 0), ((), 4, 0)], "2.r0")
    assert DataStep(None, packs, {}).batch(New(), 0)[2] == ["17", "18/2"]


def test_qwen_packed_positions_are_get_rope_index_s_per_piece():
    """Each piece's 3-D rotary positions start at 0 and are what `get_rope_index` gives
    the piece alone; the text positions (which HF's mask finds the pieces by) restart too."""
    pytest.importorskip("transformers")
    from executor.runtime.models.hf import build_hf

    model = build_hf("qwen2_5_vl")
    grid = torch.tensor([model.encoder.grid])
    alone = model.data_batch([((1,), 5, 0)], "0.0", piece_keys=["7"])
    pos, _ = model.root.model.get_rope_index(alone["input_ids"], mm_token_type_ids=alone["mm_token_type_ids"],
                                             image_grid_thw=grid)
    assert torch.equal(alone["position_ids"][1:], pos)
    both = model.data_batch([((), 3, 0), ((1,), 5, 0)], "0.0", piece_keys=["6", "7"])
    assert both["position_ids"].shape == (4, 1, 3 + model.tokens_per_image + 5)
    assert torch.equal(both["position_ids"][:, :, 3:], alone["position_ids"])
    assert torch.equal(both["input_ids"][:, 3:], alone["input_ids"])
    assert both["position_ids"][0, 0].tolist() == [0, 1, 2] + list(range(model.tokens_per_image + 5))
