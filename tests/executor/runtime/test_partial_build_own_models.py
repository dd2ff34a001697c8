"""Each rank builds only its part, for HF models and plug-ins (issue 39, section 5):
constructed with parameters on the meta device, a rank's parts made real with the
values the whole (reference) build has, either by replaying the model's own
initialisers per parameter or by reading only those tensors from a local
`save_pretrained` folder."""
import json

import pytest
import safetensors
import safetensors.torch
import torch
from tests.mpipe_cli.cli_runner import run_cli

from executor.runtime.jobs import Job
from executor.runtime.models.chunks import model_chunks
from executor.runtime.models.loader import load_model
from executor.runtime.models.materialise import builds_partially, materialise
from executor.runtime.models.meta_build import module_reset, replay_init
from executor.runtime.models.protocol import ModelError
from executor.runtime.models.workload import evaluate_for_model
from executor.runtime.rank import run_local
from mpipe_core.runs.model_spec import BatchShape, ModelSpec

SHAPE = BatchShape(microbatch_size=1, images=2, text_len=8)
CPU = torch.device("cpu")


def _real(model) -> set[str]:
    return {n for n, p in model.root.named_parameters() if not p.is_meta}


@pytest.mark.parametrize("name,config", [("hf:llava", "tiny"), ("hf:qwen2_5_vl", "tiny"),
                                         ("examples.tiny_mllm:build", None)])
def test_a_rank_makes_real_only_its_chunk_with_the_whole_models_values(name, config):
    spec = ModelSpec(name, config, SHAPE)
    whole = dict(load_model(spec).root.named_parameters())
    model = load_model(spec, partial=True)
    assert builds_partially(model) and not _real(model)
    last = model_chunks(model, 2)[1]
    made = materialise(model, last.modules(model), CPU)
    real = _real(model)
    assert real == {n for n, _ in last.parameters(model)} and len(real) < len(whole) / 2
    assert made == sum(whole[n].numel() * 4 for n in real)
    assert all(torch.equal(p, whole[n]) for n, p in model.root.named_parameters() if n in real)
    # The parts the executor runs see the real tensors (a parameter keeps its identity).
    assert all(not p.is_meta for p in model.head.parameters())


def test_the_replayed_values_are_the_initialisers_own():
    """A parameter's value depends on its name alone, and follows its modules' initialisers:
    HF's CLIP attention block (a parent) overwrites its projections' weights with its own std."""
    model = load_model(ModelSpec("hf:llava", "tiny", SHAPE))
    params = dict(model.root.named_parameters())
    k = params["model.vision_tower.encoder.layers.0.self_attn.k_proj.weight"]
    assert float(k.detach().std()) == pytest.approx(32 ** -0.5 * 4 ** -0.5, rel=0.1)  # CLIPAttention's in_proj_std
    assert torch.equal(params["model.language_model.norm.weight"], torch.ones(32))
    assert not torch.equal(params["model.language_model.layers.0.self_attn.q_proj.weight"],
                           params["model.language_model.layers.1.self_attn.q_proj.weight"])


def test_a_parameter_no_initialiser_writes_is_refused():
    root = torch.nn.Module()
    root.free = torch.nn.Parameter(torch.empty(3, device="meta"))  # a bare parameter: nothing resets it
    with pytest.raises(ModelError, match="parameter free: none of its modules' initialisers writes it"):
        replay_init(root, "free", torch.empty(3), 0, module_reset)


def test_a_plugin_without_init_parameter_is_built_whole(monkeypatch):
    import examples.tiny_mllm as plugin

    monkeypatch.delattr(plugin.ExamplePlugin, "init_parameter")
    model = load_model(ModelSpec("examples.tiny_mllm:build", None, SHAPE), partial=True)
    assert not builds_partially(model)


# --------------------------------------------------------------------------- from a checkpoint folder

@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory):
    """A tiny LLaVA saved in two safetensors shards (with its index)."""
    folder = tmp_path_factory.mktemp("llava")
    model = load_model(ModelSpec("hf:llava", "tiny", SHAPE))
    size = sum(p.numel() * 4 for p in model.root.parameters())
    model.root.save_pretrained(folder, max_shard_size=int(size * 0.6))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2
    return folder, dict(model.root.named_parameters())


def test_pp2_from_a_folder_equals_the_reference_built_from_it(llava_folder):
    folder, saved = llava_folder
    spec = ModelSpec(f"hf:{folder}", None, SHAPE)
    loaded = load_model(spec)
    assert all(torch.equal(p, saved[n]) for n, p in loaded.root.named_parameters())
    term = "1f1b(p=2, m=4)"
    job = Job.make(term, evaluate_for_model(term, loaded).schedule, spec, check_grads=True)
    (result,) = run_local([job], 2)
    assert result.grad_check["ok"] and result.grad_check["steps"][0]["parameters"]
    builds = [m["build"] for m in result.memory]
    assert sum(b["parameters"] for b in builds) == sum(p.numel() * 4 for p in saved.values())


def test_a_rank_reads_only_its_own_tensors(llava_folder, monkeypatch):
    folder, _ = llava_folder
    opened, read = [], []
    original = safetensors.safe_open

    class Counting:  # safe_open, recording which files are opened and which tensors read
        def __init__(self, path, *a, **kw):
            opened.append(path.rsplit("/", 1)[-1])
            self.inner = original(path, *a, **kw)

        def __enter__(self):
            self.f = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_slice(self, key):
            return self.f.get_slice(key)

        def get_tensor(self, key):
            read.append(key)
            return self.f.get_tensor(key)

    monkeypatch.setattr(safetensors, "safe_open", Counting)
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    skipped = 0
    for chunk in range(2):  # as pp=2's two ranks do, each in a process of its own
        model = load_model(ModelSpec(f"hf:{folder}", None, SHAPE), partial=True)
        assert not read  # the build checked names and shapes from the headers only
        part = model_chunks(model, 2)[chunk]
        opened.clear()
        materialise(model, part.modules(model), CPU)
        mine = {n for n, _ in part.parameters(model)}
        # Exactly the chunk's tensors (by their checkpoint keys), each once; only the shards holding them.
        assert sorted(read) == sorted(model.weights.where[n][1] for n in mine)
        assert len(read) < len(weight_map) / 2
        assert set(opened) == {weight_map[key] for key in read}
        skipped += len(set(opened)) == 1
        read.clear()
    assert skipped  # (one chunk's tensors lie in one shard: the other was never opened)


def _cli_error(folder) -> str:
    out = run_cli(["run", "1f1b(p=2, m=4)", "--model", f"hf:{folder}", "--images", "2", "--check-grads"])
    assert out.code == 2 and out.traceback is None, out.err
    assert len(out.error_lines) == 1, out.err
    return out.error_lines[0]


def test_a_folder_without_safetensors_is_one_error_line(tmp_path, llava_folder):
    folder, _ = llava_folder
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    assert _cli_error(tmp_path) == (f"error: hf:{tmp_path}: {tmp_path} has no model.safetensors or "
                                    "model.safetensors.index.json (only safetensors checkpoints are read; "
                                    "save with save_pretrained(..., safe_serialization=True))")


def test_a_missing_tensor_is_one_error_line_naming_file_and_tensor(tmp_path):
    model = load_model(ModelSpec("hf:llava", "tiny", SHAPE))
    model.root.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    del tensors["language_model.model.layers.1.mlp.up_proj.weight"]
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})
    assert _cli_error(tmp_path) == (f"error: hf:{tmp_path}: tensor model.language_model.layers.1.mlp.up_proj.weight "
                                    f"is not in {path}")
