"""The HF models' tp plans as built from transformers' own `base_model_tp_plan`
(`models.hf_tensor_parallel`): each entry mapped to torch's style on our decoder
layer's names, what the mapping cannot run refused with one line."""
import pytest
from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from executor.runtime.models.hf_tensor_parallel import layer_plan
from executor.runtime.models.loader import load_model
from executor.runtime.models.protocol import ModelError
from mpipe_core.runs.model_spec import BatchShape, ModelSpec


@pytest.fixture(scope="module")
def llava():
    return load_model(ModelSpec("hf:llava", "tiny", BatchShape(microbatch_size=1, images=2, text_len=8)))


def test_the_llm_plan_is_transformers_own_on_our_layer_names(llava):
    hf_plan = llava.text_config.base_model_tp_plan
    plan = llava.tp_plan(True)["layers"]
    for key, kind in hf_plan.items():
        style = plan["layer." + key.removeprefix("layers.*.")]
        assert type(style) is {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}[kind]
        if kind == "rowwise":  # under sp the row-wise outputs come back as sequence blocks
            assert style.output_layouts == (Shard(1),)
    assert isinstance(plan["layer.input_layernorm"], SequenceParallel)
    assert isinstance(plan["layer.post_attention_layernorm"], SequenceParallel)
    assert "layer.input_layernorm" not in llava.tp_plan(False)["layers"]


def test_what_the_mapping_cannot_run_is_one_line(llava):
    layer = llava.lm.layers[0]
    with pytest.raises(ModelError, match=r"^hf:llava: transformers' tp style 'local_colwise' for "
                                         r"'layers\.\*\.mlp\.up_proj' is not supported \(colwise, rowwise; "
                                         r"run it with tp=1\)$"):
        layer_plan({"layers.*.mlp.up_proj": "local_colwise"}, layer, "hf:llava", False)
    with pytest.raises(ModelError, match=r"has no base_model_tp_plan in transformers"):
        layer_plan(None, layer, "hf:llava", False)
    layer.extra = nn.Linear(2, 2)  # a child sp cannot run on sequence blocks
    try:
        with pytest.raises(ModelError, match=r"^hf:llava: sequence parallelism: the decoder layer's 'extra' "
                                             r"\(Linear\) is neither a norm nor sharded by the tp plan"):
            layer_plan(llava.text_config.base_model_tp_plan, layer, "hf:llava", True)
    finally:
        del layer.extra
