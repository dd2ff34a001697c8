"""Each rank builds only its part: the built-in model on the meta device, a rank's
chunks made real with the values the whole model has (issue 39, section 5; the
pp=1 against pp=4 build memory is `python -m benchmarks build-memory`)."""
import torch

from executor.runtime.jobs import Job
from executor.runtime.model import MLLM, ModelConfig
from executor.runtime.model_workload import workload_for
from executor.runtime.models.builtin import BuiltinModel
from executor.runtime.models.chunks import model_chunks
from executor.runtime.models.materialise import builds_partially, materialise
from executor.runtime.rank import run_local
from mpipe_core.api import evaluate

CFG = ModelConfig()


def test_a_rank_makes_real_only_its_chunks_with_the_whole_models_values():
    whole = dict(MLLM(CFG).named_parameters())
    model = BuiltinModel(CFG, meta=True)
    assert builds_partially(model)
    last = model_chunks(model, 2)[1]
    made = materialise(model, last.modules(model), torch.device("cpu"))
    real = {n for n, p in model.root.named_parameters() if not p.is_meta}
    assert real == {n for n, _ in last.parameters(model)} and "llm.head.weight" in real
    assert "llm.tok_emb.weight" not in real and not any(n.startswith("vision.") for n in real)
    assert made == sum(whole[n].numel() * 4 for n in real)
    assert all(torch.equal(p, whole[n]) for n, p in model.root.named_parameters() if n in real)
    # The wrappers the executor runs see the real tensors (a parameter keeps its identity).
    assert model.head.lm_head.weight is dict(model.root.named_parameters())["llm.head.weight"]


def test_each_rank_reports_what_its_build_made_and_the_run_stays_exact():
    term = "1f1b(p=2, m=4)"
    job = Job.make(term, evaluate(term, workload_for(CFG)).schedule, CFG, check_grads=True)
    (result,) = run_local([job], 2)
    assert result.grad_check["ok"]
    builds = [m["build"] for m in result.memory]
    whole = sum(p.numel() * 4 for p in MLLM(CFG).parameters())
    # Every parameter is made once, on the rank that holds it (no rank builds the whole model).
    assert sum(b["parameters"] for b in builds) == whole and max(b["parameters"] for b in builds) < whole
    assert all(b["peak"] > 0 and b["growth"] is not None for b in builds)
