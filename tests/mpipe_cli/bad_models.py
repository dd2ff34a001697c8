"""Plug-ins that break the model protocol, for the malformed-input corpus: each is
`examples.tiny_mllm` with one thing wrong, and must be refused in one line
before any rank starts."""
from __future__ import annotations

from torch import nn

from examples.tiny_mllm import AlibiLayer, build as example
from executor.runtime.models.protocol import BatchShape


def generator_layers(config=None, shape=BatchShape()):
    model = example(config, shape)
    model.layers = (layer for layer in model.root.blocks)
    return model


def function_embedding(config=None, shape=BatchShape()):
    model = example(config, shape)
    tokens = model.root.embed.tokens
    model.embedding = lambda batch, features: tokens(batch["tokens"])
    return model


def function_layer(config=None, shape=BatchShape()):
    model = example(config, shape)
    model.layers[1] = lambda hidden, context: hidden
    return model


def function_encoder(config=None, shape=BatchShape()):
    model = example(config, shape)
    vision = model.root.vision
    model.encoder = lambda images: vision(images)
    return model


def layer_outside_root(config=None, shape=BatchShape()):
    model = example(config, shape)
    model.layers[2] = AlibiLayer()  # a fresh layer that root does not hold
    return model


def parameter_in_no_part(config=None, shape=BatchShape()):
    model = example(config, shape)
    model.root.temperature = nn.Parameter(model.root.embed.tokens.weight.new_ones(()))
    return model


def five_layers(config=None, shape=BatchShape()):
    model = example(config, shape)
    model.root.blocks.append(AlibiLayer())
    model.layers = list(model.root.blocks)
    return model


def tied(config=None, shape=BatchShape()):
    """The LM head's weight is the token embedding's: trains exactly (models.sharing)."""
    model = example(config, shape)
    model.root.final[1].weight = model.root.embed.tokens.weight
    return model


def not_a_model(config=None, shape=BatchShape()):
    return {"layers": []}
