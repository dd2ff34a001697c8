"""Hypothesis strategies shared by the property tests: random generator terms, terms
wrapped in combinators, encoder placements, and random explicit-cost workloads."""
from hypothesis import strategies as st


@st.composite
def generators(draw):
    p = draw(st.integers(1, 4))
    k = draw(st.integers(1, 3))
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "looped_bfs", "zb_h1", "zb_h2", "zbv",
                                 "dualpipev"]))
    m = p * k * (2 if name == "dualpipev" else 1)
    return f"{name}(p={p}, m={m})"


@st.composite
def workloads(draw, encoders=True, always=False, dispatch=False):
    """Explicit workloads; `encoders`: may have a vision encoder (`always`:
    has one); `dispatch`: a per-op launch cost the encoder costs include."""
    cost = st.floats(0.1, 3.0)
    activation = draw(st.floats(0.1, 4.0))
    full = draw(st.floats(0, 1))  # the share of `activation` a full recompute keeps (selective keeps more)
    doc = {"llm": {"layers": 32, "f": draw(cost), "b": draw(cost), "w": draw(cost), "activation": activation,
                   "boundary_bytes": draw(st.floats(0, 2)),
                   # what a recompute keeps per layer (a fraction of `activation`) and, for selective, adds
                   "recompute": {"full": {"activation": activation * full},
                                 "selective": {"activation": min(activation, activation * (
                                     full + (1 - full) * draw(st.floats(0, 1)))), "f": draw(st.floats(0, 1))}},
                   "static": {"layer": draw(st.floats(0, 2)), "embed": draw(st.floats(0, 2)),
                              "head": draw(st.floats(0, 2))}},
           "link": {"latency": draw(st.floats(0, 0.5)), "bandwidth": draw(st.sampled_from([None, 1.0, 10.0]))}}
    if dispatch:
        doc["host"] = {"dispatch": draw(st.sampled_from([0.0, 0.05, 0.3]))}
    if encoders and (always or draw(st.booleans())):
        doc["encoders"] = [{"name": "vision", "f": draw(st.floats(0.1, 8.0)), "b": draw(cost), "w": draw(cost),
                            "trainable": draw(st.booleans()), "output_bytes": draw(st.floats(0, 2)),
                            "input_bytes": draw(st.floats(0, 2)), "param_bytes": draw(st.floats(0, 4)),
                            "activation": draw(st.floats(0, 2)),
                            "images": {"min": 1, "max": draw(st.integers(1, 4)), "seed": draw(st.integers(0, 9))}}]
    return doc


# Options every term accepts (it always has a chunk 0).
RECOMPUTE_OPTIONS = ["", ", mode=selective", ", chunks=[0]", ", mode=selective, chunks=[0]"]


@st.composite
def terms(draw, depth=2):
    inner = draw(generators())
    for _ in range(draw(st.integers(0, depth))):
        wrap = draw(st.sampled_from(["split_bw", "defer_w_split", "mirror", "repeat", "par", "overlay",
                                     "recompute"]))
        if wrap == "recompute":
            inner = f"recompute({inner}{draw(st.sampled_from(RECOMPUTE_OPTIONS))})"
        elif wrap == "defer_w_split":
            inner = f"defer_w(split_bw({inner}))"
        elif wrap == "repeat":
            inner = f"repeat({inner}, {draw(st.integers(1, 3))})"
        elif wrap == "par":
            inner = f"par({inner}, {draw(generators())})"
        elif wrap == "overlay":
            inner = f"overlay({inner}, mirror({inner}))"
        else:
            inner = f"{wrap}({inner})"
    return inner


@st.composite
def placed_terms(draw):
    """The encoders placed by each strategy around a generator (maybe split,
    deferred, mirrored or repeated), maybe in groups of k microbatches."""
    p = draw(st.integers(1, 4))
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb_h1", "zbv", "dualpipev"]))
    m = p * draw(st.integers(1, 3)) * (2 if name == "dualpipev" else 1)
    inner = draw(st.sampled_from(["{}", "split_bw({})", "defer_w(split_bw({}))", "mirror({})", "repeat({}, 2)"]))
    inner = inner.format(f"{name}(p={p}, m={m})")
    place = draw(st.sampled_from(["{}", "colocated({})", "disaggregate({}, encoder_devices=K)", "transpose({})",
                                  "transpose({}, mode=dynamic)", "transpose({}, backward=owner, overflow=min)",
                                  "encoder_stage({})"]))
    term = place.replace("K", str(draw(st.integers(1, 3)))).format(inner)
    if draw(st.booleans()):
        term = f"encoder_batch({term}, {draw(st.integers(1, m))})"
    return term
