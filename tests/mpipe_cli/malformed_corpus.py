"""Malformed inputs a hostile or careless user gives `mpipe`, and what each must do.

A case either fails cleanly (exit 2, exactly one `error:` line on stderr that
is `error: ` and the case's `error` (or, for a `part`, holds it), no traceback)
or succeeds with output that `check` accepts.
`{db}` in an argument (or an expected error) is the database under test, `{tmp}` a scratch folder
holding the case's `files` (name -> bytes, or a callable that writes the file
itself, for big or special ones).  The database is seeded by `seed_database`:
schedule `base` (1f1b, 2 devices, 4 microbatches), workload `wl`, queued run 1.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Callable

Files = dict[str, "bytes | Callable[[str], None]"]


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    error: str | None = None  # the whole `error:` line after "error: "; None: must succeed
    check: Callable[[str], bool] | None = None  # stdout of a success
    files: Files = field(default_factory=dict)
    # `error` is a distinctive part of the line (at least PART_LENGTH characters), not all of it:
    # for a list that grows with the project, or a third-party library's own words
    part: bool = False


PART_LENGTH = 30


def _json_out(key: str, expected) -> Callable[[str], bool]:
    return lambda out: json.loads(out)[key] == expected


def _contains(text: str) -> Callable[[str], bool]:
    return lambda out: text in out


def _big_file(size: int, fill: bytes = b" ") -> Callable[[str], None]:
    def write(path: str) -> None:
        with open(path, "wb") as f:
            f.truncate(0)
            f.write(fill * size)
    return write


def _random_bytes(n: int = 4096) -> bytes:
    return bytes((i * 7919 + 13) % 256 for i in range(n))  # fixed "random" bytes


def _symlink_to(target: str) -> Callable[[str], None]:
    return lambda path: os.symlink(target, path)


def _mkdir(path: str) -> None:
    os.mkdir(path)


def _deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _workload(doc):
    if callable(doc) or isinstance(doc, bytes):
        return doc
    return doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()


TERM = "1f1b(p=2, m=4)"
# 1f1b on 2 devices, 4 microbatches, F=1 and fused BW=2 per chunk: (m + p - 1) * (F + BW).
TERM_MAKESPAN = (4 + 2 - 1) * (1 + 2)
DEEP = 2000


def term_cases() -> list[Case]:
    e = lambda i, term, err, *more: Case(f"term-{i}", ("eval", term, *more), error=err)  # noqa: E731
    nested = "split_bw(" * DEEP + TERM + ")" * DEEP
    return [
        e("empty", "", "1:1: empty term: expected a schedule such as 1f1b(p=4, m=8)"),
        e("blank", "   \n  ", "1:1: empty term: expected a schedule such as 1f1b(p=4, m=8)"),
        e("open", "1f1b(", "1:6: expected ')' or '[' or a name or a number, got end of input"),
        e("unclosed", "1f1b(p=4", "1:9: expected ')' or ',', got end of input"),
        e("extra-close", "1f1b(p=4, m=8))", "1:15: expected end of input, got ')'"),
        e("missing-comma", "1f1b(p=4 m=8)", "1:10: expected ')' or ',' or ']', got 'm'"),
        Case("term-unknown-generator", ("eval", "foo(p=1)"),  # (the list grows with the algebra)
             error="1:1: unknown schedule 'foo' (known: 1f1b, balanced, colocated,", part=True),
        e("p-zero", "1f1b(p=0, m=4)", "1:6: 1f1b: argument 'p' must be >= 1, got 0"),
        e("p-negative", "1f1b(p=-1, m=4)", "1:6: 1f1b: argument 'p' must be >= 1, got -1"),
        e("m-zero", "1f1b(p=4, m=0)", "1:11: 1f1b: argument 'm' must be >= 1, got 0"),
        e("p-float", "1f1b(p=4.5, m=8)", "1:6: 1f1b: argument 'p' must be an integer, got 4.5"),
        e("dup-arg", "1f1b(p=4, m=8, p=4)", "1:16: argument 'p' given twice"),
        e("unknown-arg", "1f1b(p=4, q=3)", "1:11: 1f1b has no argument 'q' (usage 1f1b(p=, m=))"),
        e("bool-arg", "1f1b(p=true, m=8)", "1:6: 1f1b: argument 'p' must be an integer, got true"),
        e("list-arg", "1f1b(p=[1, 2], m=8)", "1:6: 1f1b: argument 'p' must be an integer, got a list"),
        e("inf-float", "1f1b(p=1e400, m=8)", "1:6: 1f1b: argument 'p' must be an integer, got '1e400'"),
        e("huge-int", "1f1b(p=99999999999999999999999999, m=8)",
            "1f1b(...) would build about 2,399,999,999,999,999,999,999,999,976 ops, over the limit of 5,000,000 "
            "(set MPIPE_MAX_OPS or pass a larger limit)"),
        e("huge-m", "gpipe(p=2, m=100000000000)",
            "gpipe(...) would build about 600,000,000,000 ops, over the limit of 5,000,000 (set MPIPE_MAX_OPS or "
            "pass a larger limit)"),
        e("over-op-limit", "gpipe(p=8, m=2000000)",
            "gpipe(...) would build about 48,000,000 ops, over the limit of 5,000,000 (set MPIPE_MAX_OPS or pass "
            "a larger limit)"),
        e("bad-mode", "transpose(1f1b(p=4, m=4), mode=bogus)",
            "1:27: transpose: argument 'mode' must be one of prefix, dynamic, got 'bogus'"),
        e("shards-zero", "transpose(1f1b(p=4, m=4), shards=0)",
            "1:27: transpose: argument 'shards' must be >= 1, got 0"),
        e("bare-name", "1f1b", "1:1: expected a schedule term such as 1f1b(p=4, m=8), got the bare name '1f1b'"),
        e("no-args", "1f1b()", "1:1: 1f1b is missing argument 'p' (usage 1f1b(p=, m=))"),
        e("parenthesised", "(1f1b(p=2, m=2))", "1:1: expected '[' or a name or a number, got '('"),
        Case("term-comment-ok", ("eval", "1f1b(p=2, m=2)  # a comment", "--json"),
             check=_json_out("makespan", (2 + 2 - 1) * 3)),
        e("trailing-junk", "1f1b(p=2, m=2);", "1:15: unexpected character ';'"),
        e("two-terms", "1f1b(p=2, m=2) 1f1b(p=2, m=2)", "1:16: expected ')' or ',' or ']', got '1f1b'"),
        e("nul", "1f1b(p=2, m=2)\x00", "1:15: unexpected character '\\x00'"),
        e("fullwidth", "\uff47pipe(p=2, m=2)", "1:1: unexpected character 'ｇ'"),
        e("hex", "1f1b(p=0x10, m=2)", "1:6: 1f1b: argument 'p' must be an integer, got '0x10'"),
        Case("term-trailing-comma-ok", ("eval", "1f1b(p=2, m=2, )", "--json"),
             check=_json_out("makespan", (2 + 2 - 1) * 3)),
        e("missing-value", "1f1b(p=2,\n m=)", "2:4: expected '[' or a name or a number, got ')'"),
        e("zbv-v3", "zbv(p=2, m=4, v=3)", "1:15: zbv has no argument 'v' (usage zbv(p=, m=))"),
        e("repeat-zero", f"repeat({TERM}, 0)", "1:24: repeat: argument 'n' must be >= 1, got 0"),
        e("repeat-huge", f"repeat({TERM}, 100000000)",
            "repeat(...) would build about 2,400,000,000 ops, over the limit of 5,000,000 (set MPIPE_MAX_OPS or "
            "pass a larger limit)"),
        e("par-one", f"par({TERM})", "1:1: par is missing argument 'right' (usage par(left, right))"),
        e("mirror-number", "mirror(5)", "1:8: mirror: argument 'term' must be a schedule term, got 5"),
        e("partition-short", f"partition({TERM}, [1])",
            "1:27: partition: 1 layer counts for 2 chunks (give one per chunk, in chunk order)"),
        e("partition-zero", f"partition({TERM}, [0, 5])",
            "1:27: partition: argument 'layers': entry 0 is 0, each must be >= 1"),
        e("partition-negative", f"partition({TERM}, [-1, 3])",
            "1:27: partition: argument 'layers': entry 0 is -1, each must be >= 1"),
        e("positional-after-kw", "1f1b(p=2, 4)", "1:11: a positional argument cannot follow keyword arguments"),
        e("deep-nesting", nested, "term: nested 2001 levels deep at character 18005; the limit is 64"),
        e("deep-lists", "1f1b(p=" + "[" * DEEP + "]" * DEEP + ", m=2)",
            "term: nested 2001 levels deep at character 2007; the limit is 64"),
        e("long-text", TERM + " " * 200_000, "term text is 200014 characters; the limit is 100000"),
        e("max-ops-negative", TERM,
            "argument --max-ops: must be from 1 to 9223372036854775807, got -1", "--max-ops", "-1"),
        e("max-ops-zero", TERM, "argument --max-ops: must be from 1 to 9223372036854775807, got 0", "--max-ops", "0"),
        e("max-ops-small", TERM,
            "1f1b(...) would build about 24 ops, over the limit of 3 (set MPIPE_MAX_OPS or pass a larger limit)",
            "--max-ops", "3"),
        e("max-ops-text", TERM, "argument --max-ops: expected an integer, got 'abc'", "--max-ops", "abc"),
        Case("term-spaces-ok", ("eval", f"  1f1b( p = 2 ,\n m = 4 )  ", "--json"),
             check=_json_out("makespan", TERM_MAKESPAN)),
        Case("term-one-op-ok", ("eval", "gpipe(p=1, m=1)", "--json"), check=_json_out("makespan", 3)),
        # the limit is checked against an upper estimate before building: 3 * p * m ops
        Case("term-max-ops-exact-ok", ("eval", TERM, "--json", "--max-ops", str(3 * 2 * 4)),
             check=_json_out("ops", 16)),
    ]


def workload_cases() -> list[Case]:
    def w(i, doc, err, name="w.json"):
        return Case(f"workload-{i}", ("eval", TERM, "-w", "{tmp}/" + name), error=err,
                    files={name: _workload(doc)})

    enc = lambda **kw: {"encoders": [{"name": "vision", **kw}]}  # noqa: E731
    return [
        w("not-json", "{nope", "{tmp}/w.json:1:2: not valid json: Expecting property name enclosed in double quotes"),
        w("empty", b"", "{tmp}/w.json:1:1: not valid json: Expecting value"),
        w("array", "[]", "{tmp}/w.json: workload: expected an object at the top level, got an array"),
        w("null", "null", "{tmp}/w.json: workload: expected an object at the top level, got null"),
        w("number", "1", "{tmp}/w.json: workload: expected an object at the top level, got a number"),
        w("llm-number", {"llm": 5}, "{tmp}/w.json: llm: expected an object"),
        w("f-negative", {"llm": {"f": -1}}, "{tmp}/w.json: llm.f: must be >= 0, got -1"),
        w("f-text", {"llm": {"f": "x"}}, "{tmp}/w.json: llm.f: expected a number, got 'x'"),
        w("f-nan", '{"llm": {"f": NaN}}', "{tmp}/w.json: llm.f: expected a number, got nan"),
        w("f-infinity", '{"llm": {"f": Infinity}}', "{tmp}/w.json: llm.f: expected a number, got inf"),
        w("f-overflow", '{"llm": {"f": 1e400}}', "{tmp}/w.json: llm.f: expected a number, got inf"),
        w("layers-zero", {"llm": {"layers": 0}},
            "{tmp}/w.json: llm.layers: expected an integer from 1 to 1000000, got 0"),
        w("layers-float", {"llm": {"layers": 1.5}},
            "{tmp}/w.json: llm.layers: expected an integer from 1 to 1000000, got 1.5"),
        w("layers-bool", {"llm": {"layers": True}},
            "{tmp}/w.json: llm.layers: expected an integer from 1 to 1000000, got true"),
        w("layers-huge", {"llm": {"layers": 10**30}},
            "{tmp}/w.json: llm.layers: expected an integer from 1 to 1000000, got 1000000000000000000000000000000"),
        w("unknown-key", {"bogus": 1},
            "{tmp}/w.json: workload: unknown key 'bogus' (known: data, description, device, encoders, host, link, llm, "
            "name, origin, units)"),
        w("encoders-number", {"encoders": 5}, "{tmp}/w.json: encoders: expected a list"),
        w("encoder-number", {"encoders": [5]}, "{tmp}/w.json: encoders[0]: expected an object, got a number"),
        w("encoder-bad-name", {"encoders": [{"name": "1x"}]},
            "{tmp}/w.json: encoders[0].name: expected an identifier other than 'llm', got '1x'"),
        w("encoder-llm-name", {"encoders": [{"name": "llm"}]},
            "{tmp}/w.json: encoders[0].name: expected an identifier other than 'llm', got 'llm'"),
        w("encoder-dup", {"encoders": [{"name": "v"}, {"name": "v"}]},
            "{tmp}/w.json: encoders: duplicate encoder name in ['v', 'v']"),
        w("uniform-negative", enc(f={"uniform": [-5, -1]}),
            "{tmp}/w.json: encoders[0].f.uniform[0]: must be >= 0, got -5"),
        w("uniform-nan", '{"encoders": [{"name": "v", "f": {"uniform": [NaN, 1]}}]}',
            "{tmp}/w.json: encoders[0].f.uniform[0]: expected a finite number, got nan"),
        w("uniform-reversed", enc(f={"uniform": [5, 1]}),
            "{tmp}/w.json: encoders[0].f.uniform: need low <= high, got [5, 1]"),
        w("uniform-three", enc(f={"uniform": [1, 2, 3]}),
            "{tmp}/w.json: encoders[0].f.uniform: expected [a, b], got [1, 2, 3]"),
        w("normal-negative-std", enc(f={"normal": [1, -1]}),
            "{tmp}/w.json: encoders[0].f.normal[1]: must be >= 0, got -1"),
        w("normal-inf", '{"encoders": [{"name": "v", "f": {"normal": [Infinity, 1]}}]}',
            "{tmp}/w.json: encoders[0].f.normal[0]: expected a finite number, got inf"),
        w("seed-list", enc(f={"uniform": [1, 2], "seed": [1]}),
            "{tmp}/w.json: encoders[0].f.seed: expected an integer from -9223372036854775808 to "
            "9223372036854775807, got [1]"),
        w("seed-text", enc(f={"uniform": [1, 2], "seed": "x"}),
            "{tmp}/w.json: encoders[0].f.seed: expected an integer from -9223372036854775808 to "
            "9223372036854775807, got 'x'"),
        w("seed-float", enc(f={"uniform": [1, 2], "seed": 1.5}),
            "{tmp}/w.json: encoders[0].f.seed: expected an integer from -9223372036854775808 to "
            "9223372036854775807, got 1.5"),
        w("dist-unknown-key", enc(f={"uniform": [1, 2], "sigma": 1}),
            "{tmp}/w.json: encoders[0].f: unknown key 'sigma' (known: seed, uniform)"),
        w("dist-both", enc(f={"uniform": [1, 2], "normal": [1, 1]}),
            "{tmp}/w.json: encoders[0].f: a distribution needs exactly one of 'uniform' or 'normal'"),
        w("images-text", enc(images={"min": "abc", "max": 2}),
            "{tmp}/w.json: encoders[0].images.min: expected an integer from 1 to 100000, got 'abc'"),
        w("images-zero", enc(images={"min": 0, "max": 2}),
            "{tmp}/w.json: encoders[0].images.min: expected an integer from 1 to 100000, got 0"),
        w("images-reversed", enc(images={"min": 3, "max": 1}),
            '{tmp}/w.json: encoders[0].images: need min <= max, got {"min": 3, "max": 1}'),
        w("images-list", enc(images=[1, 2]),
            "{tmp}/w.json: encoders[0].images: expected {'min': int, 'max': int, 'seed': int}"),
        w("images-seed-list", enc(images={"min": 1, "max": 2, "seed": [1]}),
            "{tmp}/w.json: encoders[0].images.seed: expected an integer from -9223372036854775808 to "
            "9223372036854775807, got [1]"),
        w("images-unknown-key", enc(images={"min": 1, "max": 2, "mean": 1}),
            "{tmp}/w.json: encoders[0].images: unknown key 'mean' (known: max, min, seed)"),
        w("images-huge", enc(images={"min": 1, "max": 10**30}),
            "{tmp}/w.json: encoders[0].images.max: expected an integer from 1 to 100000, got "
            "1000000000000000000000000000000"),
        w("images-float", enc(images={"min": 1.5, "max": 2}),
            "{tmp}/w.json: encoders[0].images.min: expected an integer from 1 to 100000, got 1.5"),
        w("chunk-costs-number", {"llm": {"chunk_costs": {"F": 1}}},
            "{tmp}/w.json: llm.chunk_costs: expected {'F': [...], 'B': [...], 'W': [...]}"),
        w("chunk-costs-short", {"llm": {"chunk_costs": {"F": [1], "B": [1], "W": [1]}}},
            "llm.chunk_costs.F has 1 entry but the schedule has 2 chunks"),
        w("chunk-costs-negative", {"llm": {"chunk_costs": {"F": [-1, 1], "B": [1, 1], "W": [1, 1]}}},
          "{tmp}/w.json: llm.chunk_costs.F[0]: must be >= 0, got -1"),
        w("chunk-costs-text", {"llm": {"chunk_costs": {"F": "ab", "B": [1, 1], "W": [1, 1]}}},
            "{tmp}/w.json: llm.chunk_costs.F: expected a list of numbers, got text"),
        w("chunk-costs-dist", {"llm": {"chunk_costs": {"F": {"uniform": [1, 2]}, "B": [1, 1], "W": [1, 1]}}},
          "{tmp}/w.json: llm.chunk_costs.F: expected a list of numbers, got an object"),
        w("chunk-costs-extra", {"llm": {"chunk_costs": {"F": [1, 1], "B": [1, 1], "W": [1, 1], "Q": 1}}},
          "{tmp}/w.json: llm.chunk_costs: unknown key 'Q' (known: B, F, W)"),
        w("bandwidth-zero", {"link": {"bandwidth": 0}}, "{tmp}/w.json: link.bandwidth: must be > 0 or null, got 0.0"),
        w("bandwidth-negative", {"link": {"bandwidth": -1}}, "{tmp}/w.json: link.bandwidth: must be >= 0, got -1"),
        w("latency-nan", '{"link": {"latency": NaN}}', "{tmp}/w.json: link.latency: expected a number, got nan"),
        w("link-list", {"link": []}, "{tmp}/w.json: link: expected an object"),
        w("link-unknown", {"link": {"speed": 1}},
            "{tmp}/w.json: link: unknown key 'speed' (known: bandwidth, latency)"),
        w("llm-unknown", {"llm": {"flops": 1}},
            "{tmp}/w.json: llm: unknown key 'flops' (known: activation, b, boundary_bytes, chunk_costs, embed, f, "
            "grad_bytes, head, layer_costs, layers, param_bytes, recompute, static, tp_sharded, w)"),
        w("name-number", {"name": 5}, "{tmp}/w.json: name: expected text of at most 200 characters, got 5"),
        w("name-huge", {"name": "n" * 5000},
            "{tmp}/w.json: name: expected text of at most 200 characters, got "
            "'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn'..."),
        w("f-list-wrong-length", enc(f=[1, 2]),
            "encoder 'vision'.f: has 2 per-microbatch costs but the schedule has 4 microbatches"),
        w("f-list-empty", enc(f=[]), "{tmp}/w.json: encoders[0].f: the list of costs is empty"),
        w("f-list-nan", '{"encoders": [{"name": "v", "f": [1, NaN, 1, 1]}]}',
            "{tmp}/w.json: encoders[0].f[1]: expected a finite number, got nan"),
        w("f-bool", enc(f=True), "{tmp}/w.json: encoders[0].f: expected a finite number, got true"),
        w("trainable-text", enc(trainable="yes"),
            "{tmp}/w.json: encoders[0].trainable: expected true or false, got 'yes'"),
        w("output-bytes-negative", enc(output_bytes=-1),
            "{tmp}/w.json: encoders[0].output_bytes: must be >= 0, got -1"),
        replace(w("analytic-unknown-model", {"model": "nope"},  # (the presets grow)
                  "{tmp}/w.json: model: unknown preset 'nope' (known: gpt3-175b, internlm2-20b,"), part=True),
        w("analytic-bad-hidden", {"model": {"hidden": -1}, "device": "a100"},
            "{tmp}/w.json: model.hidden: expected a positive finite number, got -1"),
        replace(w("analytic-unknown-device", {"model": "llama2-7b", "device": "nope"},  # (the presets grow)
                  "{tmp}/w.json: device: unknown preset 'nope' (known: a100,"), part=True),
        w("analytic-zero-tflops", {"model": "llama2-7b", "device": {"peak_tflops": 0}},
            "{tmp}/w.json: device.peak_tflops: expected a positive finite number, got 0"),
        w("analytic-nan-tflops", '{"model": "llama2-7b", "device": {"peak_tflops": NaN, "efficiency": 0.5, '
          '"link_gbps": 100, "link_latency_us": 5, "bytes_per_element": 2}}',
              "{tmp}/w.json: device.peak_tflops: expected a positive finite number, got nan"),
        w("deep-json", _deep_json(100_000),
            "{tmp}/w.json: nested more levels deep than Python's parser allows; the limit is 64"),
        w("deep-json-object", b'{"a":' * 5000 + b"1" + b"}" * 5000,
            "{tmp}/w.json: nested more levels deep than Python's parser allows; the limit is 64"),
        w("random-bytes", _random_bytes(), "{tmp}/w.json: not UTF-8 text (byte 1)"),
        w("invalid-utf8", b'{"name": "\xff\xfe"}', "{tmp}/w.json: not UTF-8 text (byte 10)"),
        w("bad-toml", "llm = [", "{tmp}/w.toml: not valid toml: Invalid value (at end of document)", name="w.toml"),
        w("too-big", _big_file(20 * 1024 * 1024),
            "{tmp}/w.json: the workload file is larger than the limit of 16 MB"),
        Case("workload-dev-zero", ("eval", TERM, "-w", "/dev/zero"),
            error="/dev/zero: the workload file is larger than the limit of 16 MB"),
        Case("workload-directory", ("eval", TERM, "-w", "{tmp}/d"),
            error="{tmp}/d: cannot read (Is a directory)", files={"d": _mkdir}),
        Case("workload-missing", ("eval", TERM, "-w", "{tmp}/none.json"),
            error="workload '{tmp}/none.json': no such file or preset (presets: gpt3-175b, internvl-26b, "
                  "llama2-7b, llava-7b, optimus-vit22b-gpt175b, uniform, vit-heavy-small)"),
        Case("workload-preset-typo", ("eval", TERM, "-w", "vit-heavy-smal"),
            error="workload 'vit-heavy-smal': no such file or preset; did you mean preset 'vit-heavy-small'?"),
        Case("workload-saved-unknown", ("eval", TERM, "-w", "saved:x", "--db", "{db}"),
             error="no saved workload named 'x' (saved workloads: wl)"),
        Case("workload-saved-none-yet", ("eval", TERM, "-w", "saved:x", "--db", "sqlite:///{tmp}/empty.db"),
             error="no saved workload named 'x' (this database has no saved workloads: `mpipe library workload "
                   "save NAME SOURCE` saves one; sqlite:///{tmp}/empty.db)"),
        Case("workload-toml-ok", ("eval", TERM, "--json", "-w", "{tmp}/w.toml"),
             files={"w.toml": b"[llm]\nf = 2.0\nb = 1.0\nw = 1.0\n"},
             # per chunk F=2, BW=2: (m + p - 1) * 4
             check=_json_out("makespan", (4 + 2 - 1) * 4)),
        Case("workload-chunk-costs-ok", ("eval", TERM, "--json", "-w", "{tmp}/w.json"),
             files={"w.json": _workload({"llm": {"chunk_costs": {"F": [1, 1], "B": [1, 1], "W": [1, 1]}}})},
             check=_json_out("makespan", TERM_MAKESPAN)),
    ]


def memory_cases() -> list[Case]:
    """The memory model's bad input (the judge puts the case's scratch folder in for `{tmp}`)."""
    def w(i, doc, err, *more):
        return Case(f"memory-{i}", ("eval", TERM, "-w", "{tmp}/w.json", *more), error="{tmp}/" + err,
                    files={"w.json": _workload(doc)})

    return [
        w("tp-not-dividing-heads", {"model": "llama2-7b", "device": "a100", "parallel": {"tp": 3}},
          "w.json: parallel.tp: 3 does not divide the model's 32 attention heads"),
        Case("memory-cli-tp-not-dividing-heads", ("eval", TERM, "-w", "llama2-7b", "--parallel", "tp=3"),
             error="parallel.tp: 3 does not divide the model's 32 attention heads"),
        Case("memory-cli-parallel-text", ("eval", TERM, "-w", "llama2-7b", "--parallel", "tp=many"),
             error="argument --parallel: tp: expected an integer, true or false, got 'many'"),
        Case("memory-cli-parallel-explicit", ("eval", TERM, "--parallel", "tp=2"),
             error="--parallel needs an analytic workload (one that names a model and a device); "
                   "'uniform' states its costs explicitly"),
        w("tp-zero", {"model": "llama2-7b", "device": "a100", "parallel": {"tp": 0}},
          "w.json: parallel.tp: expected an integer from 1 to 1000000, got 0"),
        w("negative-capacity", {"device": {"memory": -64}}, "w.json: device.memory: must be > 0 or null, got -64"),
        w("negative-capacity-analytic", {"model": "llama2-7b", "device": {"preset": "a100", "memory": -80}},
          "w.json: device.memory: must be > 0 or null, got -80"),
        w("capacity-text", {"device": {"memory": "lots"}}, "w.json: device.memory: expected a number, got 'lots'"),
        w("recompute-more-than-activation", {"llm": {"recompute": {"full": {"activation": 3}}}},
          "w.json: llm.recompute.full.activation: 3 is more than llm.activation (1): a recompute keeps at most "
          "what is kept without one"),
        w("static-negative", {"llm": {"static": {"head": -1}}}, "w.json: llm.static.head: must be >= 0, got -1"),
        Case("memory-recompute-missing-chunk", ("eval", "recompute(1f1b(p=2, m=4), chunks=[2])"),
             error="1:27: recompute: chunk 2 is not in the term (it has chunks 0-1)"),
        Case("memory-recompute-layers-beyond", ("eval", "recompute(1f1b(p=2, m=4), layers=[17, 16])",
                                                "-w", "llama2-7b"),
             error="1:27: recompute: layers[0] is 17 but chunk 0 holds 16 layers"),
        Case("memory-recompute-layers-count", ("eval", "recompute(1f1b(p=2, m=4), layers=[1])"),
             error="1:27: recompute: 1 layer counts for 2 chunks (give one per chunk, in chunk order)"),
        Case("memory-recompute-both", ("eval", "recompute(1f1b(p=2, m=4), chunks=[0], layers=[1, 1])"),
             error="1:39: recompute: give chunks or layers, not both"),
        Case("memory-recompute-mode", ("eval", "recompute(1f1b(p=2, m=4), mode=half)"),
             error="1:27: recompute: argument 'mode' must be one of full, selective, got 'half'"),
        Case("memory-tune-cap-negative", ("tune", "-w", "llama2-7b", "-p", "2", "-m", "2", "--memory-cap", "-64"),
             error="argument --memory-cap: must be a finite number > 0, got -64"),
        Case("memory-eval-does-not-fit-ok", ("eval", "gpipe(p=2, m=8)", "-w", "llama2-7b", "--json"),
             check=lambda out: json.loads(out)["fits"] is False and json.loads(out)["capacity"] == 80),
    ]


GOOD_CSV = b"0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


def csv_cases() -> list[Case]:
    def c(i, data, err, *more):
        return Case(f"csv-{i}", ("import-csv", "{tmp}/s.csv", *more), error=err, files={"s.csv": data})

    return [
        c("random-bytes", _random_bytes(), "{tmp}/s.csv: not UTF-8 text (byte 1)"),
        c("invalid-utf8", b"0F0,\xff\xfe\n", "{tmp}/s.csv: not UTF-8 text (byte 4)"),
        c("empty", b"", "{tmp}/s.csv: no actions found"),
        c("blank-lines", b"\n\n\n", "{tmp}/s.csv: no actions found"),
        c("garbage", b"hello,world\n",
            "{tmp}/s.csv:1:1: 'hello' is not a compute action like 2F0, 1I3, 0W1 or 3B2 (only compute-only CSVs "
            "can be imported)"),
        c("stage-huge", b"999999999F0\n",
            "{tmp}/s.csv: stage 999999999 appears but stage 0 has no actions (stages are numbered from 0 without "
            "gaps)"),
        c("mb-huge", b"0F999999999\n",
            "{tmp}/s.csv: microbatch 999999999 appears but microbatch 0 has no actions (microbatches are numbered "
            "from 0 without gaps)"),
        c("negative", b"-1F0\n",
            "{tmp}/s.csv:1:1: '-1F0' is not a compute action like 2F0, 1I3, 0W1 or 3B2 (only compute-only CSVs "
            "can be imported)"),
        c("huge-field", b"0F0," + b"x" * 200_000 + b"\n",
            "{tmp}/s.csv: not a CSV file (field larger than field limit (131072))"),
        c("nul", b"0F0\x00,0B0\n",
            "{tmp}/s.csv:1:1: '0F0\\x00' is not a compute action like 2F0, 1I3, 0W1 or 3B2 (only compute-only "
            "CSVs can be imported)"),
        c("missing-ops", b"0F0,0F1\n1F0,1B0\n",
            "{tmp}/s.csv: chunk 0 microbatch 0 of llm: no B (or BW), no W (or BW)"),
        c("duplicate-op", b"0F0,0F0,0B0\n", "{tmp}/s.csv: op llm:0F0 appears more than once (devices [0])"),
        c("deadlock", b"0B0,0F0\n",
            "{tmp}/s.csv: deadlock: device 0: llm:0BW0 -> device 0: llm:0F0 (each waits for the next)"),
        c("too-big", _big_file(20 * 1024 * 1024, b"0F0,"),
            "{tmp}/s.csv: the CSV file is larger than the limit of 32 MB"),
        c("with-header", b"rank0,rank1\n0F0,0B0\n",
            "{tmp}/s.csv:1:1: 'rank0' is not a compute action like 2F0, 1I3, 0W1 or 3B2 (only compute-only CSVs "
            "can be imported)"),
        Case("csv-missing", ("import-csv", "{tmp}/none.csv"), error="{tmp}/none.csv: no such file"),
        Case("csv-directory", ("import-csv", "{tmp}/d"),
            error="{tmp}/d: cannot read (Is a directory)", files={"d": _mkdir}),
        Case("csv-dev-zero", ("import-csv", "/dev/zero"),
            error="/dev/zero: the CSV file is larger than the limit of 32 MB"),
        Case("csv-bad-workload", ("import-csv", "{tmp}/s.csv", "-w", "nope"),
            error="workload 'nope': no such file or preset (presets: gpt3-175b, internvl-26b, llama2-7b, "
                  "llava-7b, optimus-vit22b-gpt175b, uniform, vit-heavy-small)",
             files={"s.csv": GOOD_CSV}),
        Case("csv-ok", ("import-csv", "{tmp}/s.csv", "--json"), files={"s.csv": GOOD_CSV},
             check=_json_out("makespan", (2 + 2 - 1) * 3)),
    ]


def _trace(rank: int, events: list, world: int = 2) -> dict:
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
            "baseTimeNanoseconds": 1_790_000_000_000_000_000, "traceEvents": events}


def _x(name: str, ts: float, dur, cat: str = "user_annotation") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def _pp_rank(rank: int) -> dict:
    """A rank of 1f1b(p=2, m=1) as torch's runtime names it."""
    return _trace(rank, [_x(f"PP:{rank}F0", 10.0 * rank, 5.0), _x(f"PP:{rank}B0", 40.0 - 10.0 * rank, 5.0)])


def _dumps(doc) -> bytes:
    return json.dumps(doc).encode()


def _gzip_bomb(path: str) -> None:
    import gzip

    with gzip.open(path, "wb", compresslevel=9) as f:
        block = b"\0" * (1 << 20)
        for _ in range(64):  # 64 MB of zeros in ~64 kB
            f.write(block)


def _sparse(size: int) -> Callable[[str], None]:
    def write(path: str) -> None:
        with open(path, "wb") as f:
            f.truncate(size)  # holes: no disk used, but stat says `size`
    return write


def _real_profile(path: str) -> None:
    """A real torch.profiler trace of a training step without pipeline ranges."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        layer = torch.nn.Linear(8, 8)
        layer(torch.randn(4, 8)).sum().backward()
    prof.export_chrome_trace(path)


def trace_cases() -> list[Case]:
    """An error that starts at "/" names a file in the scratch folder, which the judge puts in
    for `{tmp}`."""
    def t(i, files, err, *more, paths=("{tmp}",)):
        if err and err.startswith("/"):
            err = "{tmp}" + err
        return Case(f"trace-{i}", ("import-trace", *paths, "--db", "{db}", *more), error=err, files=files)

    no_ranges = ("/rank0_trace.json: no pipeline ranges: no PP:<action> ranges of torch.distributed.pipelining, "
                 "no mpipe:<module>:<kind>:<microbatch> labels; give --label-pattern REGEX for other names")

    good = {"rank0_trace.json": _dumps(_pp_rank(0)), "rank1_trace.json": _dumps(_pp_rank(1))}
    half = _dumps(_pp_rank(0))
    neg, nan = _pp_rank(1), _pp_rank(1)
    neg["traceEvents"][1]["dur"] = -4
    nan["traceEvents"][1]["dur"] = float("nan")  # json writes NaN, as a broken exporter might
    return [
        t("truncated", {"rank0_trace.json": half[:len(half) // 2], "rank1_trace.json": good["rank1_trace.json"]},
          "/rank0_trace.json:1:169: not valid JSON (Unterminated string starting at; a truncated or damaged "
          "trace?)"),
        t("invalid-json", {"rank0_trace.json": b"{'traceEvents': []}", "rank1_trace.json": good["rank1_trace.json"]},
          "/rank0_trace.json:1:2: not valid JSON (Expecting property name enclosed in double quotes; a truncated or "
          "damaged trace?)"),
        t("gzip-bomb", {"rank0_trace.json.gz": _gzip_bomb}, "/rank0_trace.json.gz: inflates more than 200 times its "
          "compressed size (a gzip bomb?); refused"),
        t("gzip-damaged", {"rank0_trace.json.gz": b"\x1f\x8b\x08\x00garbage"},
          "/rank0_trace.json.gz: the gzip stream is truncated"),
        t("over-limit", {"rank0_trace.json": _sparse(300 * 1024 * 1024)},
          "/rank0_trace.json: 300 MB, larger than the limit of 256 MB (set $MPIPE_TRACE_LIMIT_MB for larger traces)"),
        t("real-profile-no-pp", {"rank0_trace.json": _real_profile}, no_ranges,
          paths=("{tmp}/rank0_trace.json",)),
        t("real-profile-names-pattern", {"rank0_trace.json": _real_profile},
          "/rank0_trace.json: no pipeline ranges: no PP:<action> ranges of torch.distributed.pipelining, no "
          "mpipe:<module>:<kind>:<microbatch> labels, nothing matching the --label-pattern; give --label-pattern "
          "REGEX for other names", "--label-pattern", r"step_(?P<kind>F|B)(?P<microbatch>\d+)",
          paths=("{tmp}/rank0_trace.json",)),
        t("no-pp-names-label-pattern", {"rank0_trace.json": _dumps(_trace(0, [_x("forward", 0.0, 5.0)], 1))},
          no_ranges),
        t("two-files-one-rank", dict(good, **{"copy_of_rank0.json": good["rank0_trace.json"]}),
          "two files for rank 0: {tmp}/copy_of_rank0.json and {tmp}/rank0_trace.json"),
        t("negative-dur", {"rank0_trace.json": good["rank0_trace.json"], "rank1_trace.json": _dumps(neg)},
          "/rank1_trace.json: event 1 ('PP:1B0'): dur -4 is negative"),
        t("nan-dur", {"rank0_trace.json": good["rank0_trace.json"], "rank1_trace.json": _dumps(nan)},
          "/rank1_trace.json: event 1 ('PP:1B0'): dur nan is not a finite number"),
        t("pattern-without-kind", good, "--label-pattern: the pattern has no named group 'kind' (write "
          "(?P<kind>...); groups: kind, microbatch, optional chunk, module)",
          "--label-pattern", r"fwd(?P<microbatch>\d+)"),
        t("pattern-not-regex", good, "--label-pattern: not a regular expression (missing ), unterminated "
          "subpattern at position 0)", "--label-pattern", "(?P<kind>"),
        t("missing-rank", {"rank0_trace.json": good["rank0_trace.json"]},
          "the traces: no trace for rank 1 (world size 2; ranks given: 0); for one pipeline of a larger world "
          "give --layout tp=..,dp=..,pp=.."),
        t("layout-not-the-world", good, "--layout tp=2,dp=2,pp=2 makes 8 ranks, but the traces' world size is 2 "
          "({tmp}/rank0_trace.json)", "--layout", "tp=2,dp=2,pp=2"),
        t("layout-bad-order", good, "--order tp-xp-pp: unknown dimension 'xp' (name tp, cp, ep, dp, pp joined by "
          "'-', fastest-varying first, e.g. tp-cp-dp-pp)", "--layout", "tp=2,dp=2,pp=2", "--order", "tp-xp-pp"),
        t("layout-bad-pair", good, "--layout tp=2,dp: expected NAME=N pairs joined by commas, such as "
          "tp=8,dp=4,pp=8, not 'dp'", "--layout", "tp=2,dp"),
        t("order-without-layout", good, "--order needs --layout (or a workload whose parallel section sets tp, cp "
          "or dp)", "--order", "tp-cp-dp-pp"),
        t("layout-rank-outside", {"rank0_trace.json": _dumps(_trace(0, _pp_rank(0)["traceEvents"], 8)),
                                  "rank9_trace.json": _dumps(_trace(9, _pp_rank(1)["traceEvents"], 8))},
          "/rank9_trace.json: rank 9 is outside the world of --layout tp=2,dp=2,pp=2 (8 ranks)",
          "--layout", "tp=2,dp=2,pp=2"),
        t("layout-missing-stage", {"rank0_trace.json": _dumps(_trace(0, _pp_rank(0)["traceEvents"], 8)),
                                   "rank1_trace.json": _dumps(_trace(1, _pp_rank(1)["traceEvents"], 8))},
          "the traces: no trace for stage 1 of pipeline tp0/dp0: global rank 4 (tp=2, dp=2, pp=2, order "
          "tp-cp-dp-pp; its ranks given: 0)", "--layout", "tp=2,dp=2,pp=2"),
        replace(t("layout-ok", {"rank0_trace.json": _dumps(_trace(0, _pp_rank(0)["traceEvents"], 8)),
                                "rank4_trace.json": _dumps(_trace(4, _pp_rank(1)["traceEvents"], 8)),
                                "rank1_trace.json": _dumps(_trace(1, _pp_rank(0)["traceEvents"], 8))},
                  None, "--layout", "tp=2,dp=2,pp=2", "--json"), check=_json_out("global_ranks", [0, 4])),
        t("no-rank", {"trace.json": _dumps({"traceEvents": [_x("PP:0F0", 0.0, 1.0)]})},
          "/trace.json: cannot tell the rank (no distributedInfo.rank, no rank<N> in the file name)"),
        t("not-a-trace", {"rank0_trace.json": b"[1, 2, 3]"},
          "/rank0_trace.json: not a Chrome/Kineto trace (none of its 3 events is a JSON object)"),
        t("term-mismatch", good, "--term gpipe(p=2, m=2): rank 0, op 1: the traces ran llm:0BW0 where the term "
          "runs llm:0F1", "--term", "gpipe(p=2, m=2)"),
        t("term-bad", good, "1:6: expected ')' or '[' or a name or a number, got end of input", "--term", "1f1b("),
        t("empty-folder", {"sub": _mkdir}, "/sub: no .json or .json.gz files in this folder", paths=("{tmp}/sub",)),
        Case("trace-missing", ("import-trace", "{tmp}/none.json", "--db", "{db}"),
             error="{tmp}/none.json: no such file or folder"),
        Case("trace-dev-zero", ("import-trace", "/dev/zero", "--db", "{db}"), error="/dev/zero: not a regular file"),
        Case("trace-ok", ("import-trace", "{tmp}", "--db", "{db}", "--json"), files=good,
             # two ranks of 1f1b(p=2, m=1), the same schedule as gpipe(p=2, m=1), which is what is inferred
             check=lambda out: {k: v for k, v in json.loads(out).items()
                                if k in ("term", "term_inferred", "source", "format", "ranks", "ops_per_rank")}
             == {"term": "gpipe(p=2, m=1)", "term_inferred": True, "source": "imported", "format": "kineto",
                 "ranks": 2, "ops_per_rank": [2, 2]}),
    ]


def output_cases() -> list[Case]:
    return [
        Case("export-o-missing-dir", ("export", TERM, "--format", "json", "-o", "/nonexistent/dir/x.json"),
             error="/nonexistent/dir/x.json: cannot write (no directory /nonexistent/dir)"),
        Case("export-o-directory", ("export", TERM, "--format", "json", "-o", "{tmp}"),
            error="{tmp}: cannot write (it is a directory)"),
        Case("export-o-under-file", ("export", TERM, "--format", "json", "-o", "{tmp}/f/x"),
             error="{tmp}/f/x: cannot write (no directory {tmp}/f)", files={"f": b"x"}),
        Case("export-bad-format", ("export", TERM, "--format", "png"),  # (the formats grow)
             error="argument --format: invalid choice: 'png' (choose from 'torch-csv', 'chrome-trace', 'json',",
             part=True),
        Case("export-bad-term", ("export", "1f1b(", "--format", "json"),
            error="1:6: expected ')' or '[' or a name or a number, got end of input"),
        Case("export-encoder-csv", ("export", "transpose(1f1b(p=2, m=2))", "-w", "vit-heavy-small",
                                    "--format", "torch-csv"),
                                        error="torch-csv cannot express vision:0F1 on device 1: torch runs "
                                              "encoders only inside stage 0 (transpose and encoder_stage have no "
                                              "torch equivalent)"),
        Case("export-ok", ("export", TERM, "--format", "torch-csv"),
             check=lambda out: out.splitlines()[0].split(",")[:2] == ["0F0", "0F1"]),
        Case("library-export-o-missing-dir", ("library", "export", "--db", "{db}", "-o", "/nonexistent/dir/x.json"),
             error="/nonexistent/dir/x.json: cannot write (no directory /nonexistent/dir)"),
        Case("library-export-o-directory", ("library", "export", "--db", "{db}", "-o", "{tmp}"),
             error="{tmp}: cannot write (it is a directory)"),
        Case("calibrate-o-missing-dir", ("calibrate", "1", "--db", "{db}", "-o", "/nonexistent/dir/x.json"),
             error="/nonexistent/dir/x.json: cannot write (no directory /nonexistent/dir)"),
        Case("compare-bad-one", ("compare", TERM, "1f1b(p=2"), error="1:9: expected ')' or ',', got end of input"),
        Case("compare-bad-workload", ("compare", TERM, "-w", "{tmp}/w.json"),
            error="{tmp}/w.json: llm.f: expected a number, got nan",
             files={"w.json": b'{"llm": {"f": NaN}}'}),
        Case("compare-ok", ("compare", TERM, "gpipe(p=2, m=4)", "--json"),
             check=lambda out: [r["makespan"] for r in json.loads(out)] == [TERM_MAKESPAN, TERM_MAKESPAN]),
        Case("eval-nan-json-ok", ("eval", TERM, "--json", "-w", "uniform"),
             check=_json_out("makespan", TERM_MAKESPAN)),
    ]


def db_target_cases() -> list[Case]:
    d = lambda i, target, err, files=None: Case(  # noqa: E731
        f"db-{i}", ("library", "list", "--db", target), error=err, files=files or {})
    return [
        d("text-file", "{tmp}/notes.txt",
            "cannot open database sqlite:///{tmp}/notes.txt: file is not a database",
            {"notes.txt": b"hello, this is not a database\n" * 50}),
        d("random-file", "{tmp}/r.db",
            "cannot open database sqlite:///{tmp}/r.db: file is not a database", {"r.db": _random_bytes()}),
        d("directory", "{tmp}/d",
            "cannot open database sqlite:///{tmp}/d: unable to open database file", {"d": _mkdir}),
        d("under-file", "{tmp}/f/x.db", "cannot create {tmp}/f for the database: File exists", {"f": b"x"}),
        d("unknown-scheme", "bogus://x", "unknown database kind in 'bogus://x'"),
        d("bad-url", "postgresql://[::1", "not a database URL: 'postgresql://[::1'"),
        Case("db-refused", ("library", "list", "--db", "postgresql+psycopg://127.0.0.1:1/none?connect_timeout=2"),
             # (what follows is the driver's own text)
             error="cannot open database postgresql+psycopg://127.0.0.1:1/none?connect_timeout=2: connection failed:",
             part=True),
        d("dev-null", "/dev/null", "cannot open database sqlite:////dev/null: disk I/O error"),
        d("dev-zero", "/dev/zero", "cannot open database sqlite:////dev/zero: disk I/O error"),
        Case("db-info-text-file", ("db", "info", "--db", "{tmp}/notes.txt"),
            error="cannot open database sqlite:///{tmp}/notes.txt: file is not a database",
             files={"notes.txt": b"plain text\n"}),
        Case("db-memory-ok", ("library", "list", "--db", "sqlite:///:memory:"), check=_contains("no schedules")),
    ]


def library_cases() -> list[Case]:
    def L(i, *argv, err=None, check=None, files=None):
        return Case(f"library-{i}", ("library", *argv, "--db", "{db}"), error=err, check=check,
                    files=files or {})

    long_ = "a" * 300
    return [
        L("save-empty-name", "save", "", TERM,
            err="invalid schedule name '': use letters, digits and . _ + / - (starting with a letter or digit, at "
                "most 100 characters)"),
        L("save-space-name", "save", "a b", TERM,
            err="invalid schedule name 'a b': use letters, digits and . _ + / - (starting with a letter or digit, "
                "at most 100 characters)"),
        L("save-backslash-name", "save", "a\\b", TERM,
            err="invalid schedule name 'a\\\\b': use letters, digits and . _ + / - (starting with a letter or "
                "digit, at most 100 characters)"),
        L("save-at-name", "save", "a@1", TERM,
            err="invalid schedule name 'a@1': use letters, digits and . _ + / - (starting with a letter or digit, "
                "at most 100 characters)"),
        L("save-long-name", "save", long_, TERM,
            err="invalid schedule name "
                "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...: use letters, "
                "digits and . _ + / - (starting with a letter or digit, at most 100 characters)"),
        L("save-nul-name", "save", "a\x00b", TERM,
            err="invalid schedule name 'a\\x00b': use letters, digits and . _ + / - (starting with a letter or "
                "digit, at most 100 characters)"),
        L("save-long-author", "save", "s-author", TERM, "--author", "x" * 101,
            err="author: 101 characters; the limit is 100"),
        L("save-nul-author", "save", "s-author2", TERM, "--author", "x\x00y", err="author: contains a NUL character"),
        L("save-nul-description", "save", "s-desc", TERM, "--description", "a\x00b",
            err="description: contains a NUL character"),
        L("save-huge-description", "save", "s-desc2", TERM, "--description", "d" * 200_000,
            err="description: 200000 characters; the limit is 10000"),
        L("save-nul-message", "save", "s-msg", TERM, "-m", "a\x00b", err="message: contains a NUL character"),
        L("save-huge-message", "save", "s-msg2", TERM, "-m", "m" * 200_000,
            err="message: 200000 characters; the limit is 10000"),
        L("save-bad-tag", "save", "s-tag", TERM, "-t", "a b",
            err="invalid tag 'a b': use letters, digits and . _ : + - (starting with a letter or digit, at most "
                "64 characters)"),
        L("save-long-tag", "save", "s-tag2", TERM, "-t", "t" * 300,
            err="invalid tag 'tttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt...: "
                "use letters, digits and . _ : + - (starting with a letter or digit, at most 64 characters)"),
        L("save-bad-term", "save", "s-term", "1f1b(",
            err="1:6: expected ')' or '[' or a name or a number, got end of input"),
        L("save-deep-term", "save", "s-deep", "split_bw(" * DEEP + TERM + ")" * DEEP,
            err="term: nested 2001 levels deep at character 18005; the limit is 64"),
        L("save-missing-saved-workload", "save", "s-wl", TERM, "-w", "saved:nope",
            err="no saved workload named 'nope' (saved workloads: wl)"),
        L("save-long-workload-label-ok", "save", "s-label", TERM, "-w", "{tmp}/" + "l" * 240 + ".json", "--json",
          files={"l" * 240 + ".json": b"{}"}, check=lambda out: json.loads(out)["workload_label"] == "l" * 200),
        L("save-existing", "save", "base", TERM,
            err="schedule 'base' already exists; update it to add a version, or choose another name"),
        L("save-update-missing", "save", "nope", TERM, "--update", err="no schedule named 'nope'"),
        L("save-workload-nan", "save", "s-nan", TERM, "-w", "{tmp}/w.json",
            err="{tmp}/w.json: llm.f: expected a number, got nan",
          files={"w.json": b'{"llm": {"f": NaN}}'}),
        L("save-ok-unicode", "save", "s-ok", TERM, "--description", "d\u00e9j\u00e0 vu ![x](http://e/x.png)",
          "--json", check=lambda out: json.loads(out)["summary"]["makespan"] == TERM_MAKESPAN),
        L("show-missing", "show", "nope", err="no schedule named 'nope'"),
        L("show-v0", "show", "base@0", err="bad version reference 'base@0': expected NAME or NAME@NUMBER (from 1)"),
        L("show-vneg", "show", "base@-1",
            err="bad version reference 'base@-1': expected NAME or NAME@NUMBER (from 1)"),
        L("show-vtext", "show", "base@abc",
            err="bad version reference 'base@abc': expected NAME or NAME@NUMBER (from 1)"),
        L("show-vhuge", "show", "base@" + "9" * 30,
            err="bad version reference 'base@999999999999999999999999999999': expected NAME or NAME@NUMBER (from "
                "1)"),
        L("show-double-at", "show", "base@@1",
            err="bad version reference 'base@@1': expected NAME or NAME@NUMBER (from 1)"),
        L("show-empty", "show", "",
            err="invalid schedule name '': use letters, digits and . _ + / - (starting with a letter or digit, at "
                "most 100 characters)"),
        L("show-nul", "show", "base\x00",
            err="invalid schedule name 'base\\x00': use letters, digits and . _ + / - (starting with a letter or "
                "digit, at most 100 characters)"),
        L("show-long", "show", long_,
            err="invalid schedule name "
                "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...: use letters, "
                "digits and . _ + / - (starting with a letter or digit, at most 100 characters)"),
        L("show-ok", "show", "base@1", "--json", check=lambda out: json.loads(out)["version"]["term"] == TERM),
        L("history-missing", "history", "nope", err="no schedule named 'nope'"),
        L("history-long", "history", long_ + long_,
            err="invalid schedule name "
                "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...: use letters, "
                "digits and . _ + / - (starting with a letter or digit, at most 100 characters)"),
        L("diff-missing", "diff", "base", "nope", err="no schedule named 'nope'"),
        L("diff-bad-ref", "diff", "base@x", "base",
            err="bad version reference 'base@x': expected NAME or NAME@NUMBER (from 1)"),
        L("fork-existing", "fork", "base", "base", err="schedule 'base' already exists; choose another name"),
        L("fork-missing", "fork", "nope", "new", err="no schedule named 'nope'"),
        L("fork-bad-name", "fork", "base", "a b",
            err="invalid schedule name 'a b': use letters, digits and . _ + / - (starting with a letter or digit, "
                "at most 100 characters)"),
        L("fork-long-author", "fork", "base", "f-author", "--author", "y" * 200,
            err="author: 200 characters; the limit is 100"),
        L("tag-missing", "tag", "nope", "x", err="no schedule named 'nope'"),
        L("tag-bad", "tag", "base", "a,b",
            err="invalid tag 'a,b': use letters, digits and . _ : + - (starting with a letter or digit, at most "
                "64 characters)"),
        L("tag-nul", "tag", "base", "a\x00",
            err="invalid tag 'a\\x00': use letters, digits and . _ : + - (starting with a letter or digit, at "
                "most 64 characters)"),
        L("archive-missing", "archive", "nope", err="no schedule named 'nope'"),
        L("export-unknown", "export", "nope", err="no schedule named 'nope'"),
        L("import-missing", "import", "{tmp}/none.json", err="{tmp}/none.json: no such file"),
        L("import-directory", "import", "{tmp}/d", err="{tmp}/d: cannot read (Is a directory)", files={"d": _mkdir}),
        L("import-random", "import", "{tmp}/x.json",
            err="{tmp}/x.json: not UTF-8 text (byte 1)", files={"x.json": _random_bytes()}),
        L("import-invalid-utf8", "import", "{tmp}/x.json",
            err="{tmp}/x.json: not UTF-8 text (byte 7)", files={"x.json": b'{"a": "\xff"}'}),
        L("import-array", "import", "{tmp}/x.json",
            err="malformed library file: top level: expected a JSON object", files={"x.json": b"[]"}),
        L("import-wrong-format", "import", "{tmp}/x.json",
            err="malformed library file: top level: 'format' must be 'mpipe-library' (is this an mpipe library "
                "export?)", files={"x.json": b'{"format": "zip"}'}),
        L("import-deep", "import", "{tmp}/x.json",
            err="{tmp}/x.json: nested more levels deep than Python's parser allows; the limit is 64",
            files={"x.json": _deep_json(100_000)}),
        L("import-too-big", "import", "{tmp}/x.json",
            err="{tmp}/x.json: the library file is larger than the limit of 64 MB",
            files={"x.json": _big_file(70 * 1024 * 1024)}),
        L("import-dev-zero", "import", "/dev/zero",
            err="/dev/zero: the library file is larger than the limit of 64 MB"),
        L("import-lying-metrics-ok", "import", "{tmp}/x.json",
          check=_contains(f"imp-lie@1: makespan 0.001 in the file, {TERM_MAKESPAN} recomputed"),
          files={"x.json": lambda path: _write_library(path, name="imp-lie", makespan=0.001)}),
        L("import-nan-metrics-ok", "import", "{tmp}/x.json",
          check=_contains(f"imp-nan@1: makespan nan in the file, {TERM_MAKESPAN} recomputed"),
          files={"x.json": lambda path: _write_library(path, name="imp-nan", makespan=float("nan"))}),
        L("import-long-author", "import", "{tmp}/x.json",
            err="malformed library file: schedules[0]: 'author': 200 characters; the limit is 100",
          files={"x.json": lambda path: _write_library(path, name="imp-author", author="z" * 200)}),
        L("import-nul-description", "import", "{tmp}/x.json",
            err="malformed library file: schedules[0]: 'description': contains a NUL character",
          files={"x.json": lambda path: _write_library(path, name="imp-desc", description="a\x00b")}),
        L("import-huge-version", "import", "{tmp}/x.json",
            err="malformed library file: schedules[0].versions[0]: 'number' must be from 1 to 2147483647",
          files={"x.json": lambda path: _write_library(path, name="imp-ver", number=10**30)}),
        L("import-bad-term", "import", "{tmp}/x.json",
            err="schedule 'imp-term' version 1: 1:6: expected ')' or '[' or a name or a number, got end of input",
          files={"x.json": lambda path: _write_library(path, name="imp-term", term="1f1b(")}),
        L("import-ok", "import", "{tmp}/x.json", check=_contains("imported 1 schedule"),
          files={"x.json": lambda path: _write_library(path, name="imp-ok")}),
        L("workload-save-no-name", "workload", "save", err="library workload save: give a NAME"),
        L("workload-save-no-source", "workload", "save", "wl2",
            err="library workload save: give NAME and SOURCE (a preset name or a file)"),
        L("workload-save-bad-source", "workload", "save", "wl3", "nope",
            err="workload 'nope': no such file or preset (presets: gpt3-175b, internvl-26b, llama2-7b, llava-7b, "
                "optimus-vit22b-gpt175b, uniform, vit-heavy-small)"),
        L("workload-save-nan", "workload", "save", "wl4", "{tmp}/w.json",
            err="{tmp}/w.json: llm.f: expected a number, got nan",
          files={"w.json": b'{"llm": {"f": NaN}}'}),
        L("workload-save-long-name", "workload", "save", long_, "uniform",
            err="invalid workload name "
                "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...: use letters, "
                "digits and . _ + / - (starting with a letter or digit, at most 100 characters)"),
        L("workload-save-existing", "workload", "save", "wl", "uniform",
            err="workload 'wl' already exists; update it to add a version, or choose another name"),
        L("workload-show-missing", "workload", "show", "nope",
            err="no saved workload named 'nope' (saved workloads: wl)"),
        L("workload-show-bad-ref", "workload", "show", "wl@x",
            err="bad version reference 'wl@x': expected NAME or NAME@NUMBER (from 1)"),
        L("workload-bad-action", "workload", "delete",
            err="argument action: invalid choice: 'delete' (choose from 'save', 'list', 'show')"),
        L("list-nul-search", "list", "--search", "a\x00", err="search: contains a NUL character"),
        L("list-ok-markdown-search", "list", "--search", "%_[]*", check=_contains("no schedules match")),
    ]


def _write_library(path: str, name: str = "imp", makespan: float | None = None, author: str | None = None,
                   description: str | None = None, number: int | None = None, term: str | None = None) -> None:
    """A file written by `mpipe library export` (from a scratch database), with one field changed."""
    from storage import dump_library, export_library, open_database, save_schedule

    db = open_database(f"sqlite:///{path}.db")
    try:
        save_schedule(db, name, TERM)
        doc = export_library(db)
    finally:
        db.close()
    schedule = doc["schedules"][0]
    version = schedule["versions"][0]
    if makespan is not None:
        version["summary"]["makespan"] = makespan
    if author is not None:
        schedule["author"] = version["author"] = author
    if description is not None:
        schedule["description"] = description
    if number is not None:
        version["number"] = number
    if term is not None:
        version["term"] = term
    with open(path, "w") as f:
        f.write(dump_library(doc))


def runs_cases() -> list[Case]:
    def R(i, *argv, err=None, check=None):
        return Case(f"runs-{i}", ("runs", *argv, "--db", "{db}"), error=err, check=check)

    huge = str(10**30)
    return [
        R("enqueue-missing", "enqueue", "nope", err="no schedule named 'nope'"),
        R("enqueue-bad-ref", "enqueue", "base@x",
            err="bad version reference 'base@x': expected NAME or NAME@NUMBER (from 1)"),
        R("enqueue-steps-zero", "enqueue", "base", "--steps", "0",
            err="argument --steps: must be from 1 to 1000000, got 0"),
        R("enqueue-steps-negative", "enqueue", "base", "--steps", "-1",
            err="argument --steps: must be from 1 to 1000000, got -1"),
        R("enqueue-steps-huge", "enqueue", "base", "--steps", huge,
            err="argument --steps: must be from 1 to 1000000, got 1000000000000000000000000000000"),
        R("enqueue-nproc-zero", "enqueue", "base", "--nproc", "0",
            err="argument --nproc: must be from 1 to 100000, got 0"),
        R("enqueue-nproc-wrong", "enqueue", "base", "--nproc", "3",
            err="base@1 runs on 2 devices; 3 ranks (nproc) do not match"),
        R("enqueue-nproc-huge", "enqueue", "base", "--nproc", huge,
            err="argument --nproc: must be from 1 to 100000, got 1000000000000000000000000000000"),
        R("enqueue-attempts-zero", "enqueue", "base", "--max-attempts", "0",
            err="argument --max-attempts: must be from 1 to 100, got 0"),
        R("enqueue-attempts-huge", "enqueue", "base", "--max-attempts", huge,
            err="argument --max-attempts: must be from 1 to 100, got 1000000000000000000000000000000"),
        R("enqueue-steps-text", "enqueue", "base", "--steps", "many",
            err="argument --steps: expected an integer, got 'many'"),
        R("enqueue-backend", "enqueue", "base", "--backend", "mpi",
            err="argument --backend: invalid choice: 'mpi' (choose from 'gloo', 'nccl', 'hccl')"),
        R("enqueue-option-no-eq", "enqueue", "base", "-o", "lr", err="option 'lr': expected KEY=VALUE"),
        R("enqueue-option-no-key", "enqueue", "base", "-o", "=1", err="option '=1': expected KEY=VALUE"),
        R("enqueue-option-nan", "enqueue", "base", "-o", "lr=NaN",
            err="run option lr: expected a finite number in (0, 10], got nan"),
        R("enqueue-option-timeout-nan", "enqueue", "base", "-o", "timeout_s=NaN",
            err="run option timeout_s: expected a finite number in (0, 604800], got nan"),
        R("enqueue-option-infinity", "enqueue", "base", "-o", "lr=Infinity",
            err="run option lr: expected a finite number in (0, 10], got inf"),
        Case("runs-enqueue-option-unknown", ("runs", "enqueue", "base", "-o", "bogus=1", "--db", "{db}"),
             error="unknown run option 'bogus' (known: model, model_config,", part=True),  # (a growing list)
        R("enqueue-option-timeout-negative", "enqueue", "base", "-o", "timeout_s=-5",
            err="run option timeout_s: expected a finite number in (0, 604800], got -5"),
        R("enqueue-option-bool-text", "enqueue", "base", "-o", "check_grads=maybe",
            err="run option check_grads: expected true or false, got 'maybe'"),
        R("enqueue-option-model", "enqueue", "base", "-o", "model=nope",
            err="run option model: 'nope' is not a registered model (registered: tiny-mllm; presets: tiny, "
                "tiny-text, tiny-frozen, tiny-varimg, small, vit-heavy; hf:llava, hf:qwen2_5_vl; no local "
                "checkpoints (no checkpoint root is set))"),
        R("enqueue-option-optimizer", "enqueue", "base", "-o", "optimizer=adam",
            err="run option optimizer: expected one of sgd, adamw, got 'adam'"),
        R("enqueue-option-nnodes-zero", "enqueue", "base", "-o", "nnodes=0",
            err="run option nnodes: expected an integer in [1, 4096], got 0"),
        R("enqueue-option-nnodes-split", "enqueue", "base", "-o", "nnodes=3",
            err="run option nnodes: 2 ranks do not split evenly over 3 nodes"),
        R("enqueue-option-huge-timeout", "enqueue", "base", "-o", "timeout_s=1e300",
            err="run option timeout_s: expected a finite number in (0, 604800], got 1e+300"),
        R("enqueue-option-long-text", "enqueue", "base", "-o", "model=" + "m" * 5000,
            err="run option model: expected a model name, got "
                "'mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm..."),
        R("enqueue-option-dup", "enqueue", "base", "-o", "lr=0.1", "-o", "lr=0.2", err="option lr given twice"),
        R("enqueue-ok", "enqueue", "base", "--steps", "3", "-o", "lr=0.05", "--json",
          check=lambda out: json.loads(out)["options"] == {"lr": 0.05} and json.loads(out)["steps"] == 3),
        R("show-missing", "show", "999", err="no run 999"),
        R("show-negative", "show", "-1", err="argument RUN: must be from 1 to 9223372036854775807, got -1"),
        R("show-huge", "show", huge,
            err="argument RUN: must be from 1 to 9223372036854775807, got 1000000000000000000000000000000"),
        R("show-text", "show", "abc", err="argument RUN: expected an integer, got 'abc'"),
        R("cancel-missing", "cancel", "999", err="no run 999"),
        R("cancel-huge", "cancel", huge,
            err="argument RUN: must be from 1 to 9223372036854775807, got 1000000000000000000000000000000"),
        R("list-limit-negative", "list", "--limit", "-1", err="argument --limit: must be from 1 to 100000, got -1"),
        R("list-limit-huge", "list", "--limit", huge,
            err="argument --limit: must be from 1 to 100000, got 1000000000000000000000000000000"),
        R("list-status", "list", "--status", "bogus",
            err="argument --status: invalid choice: 'bogus' (choose from 'queued', 'running', 'succeeded', "
                "'failed', 'cancelled', 'lost')"),
        R("list-schedule-nul", "list", "--schedule", "a\x00",
            err="invalid schedule name 'a\\x00': use letters, digits and . _ + / - (starting with a letter or "
                "digit, at most 100 characters)"),
        R("show-ok", "show", "1", "--json", check=lambda out: json.loads(out)["run"]["status"] == "queued"),
    ]


def executor_arg_cases() -> list[Case]:
    return [
        Case("calibrate-missing", ("calibrate", "999", "--db", "{db}"), error="no run 999"),
        Case("calibrate-no-timings", ("calibrate", "1", "--db", "{db}"), error="run 1 (queued) has no timings"),
        Case("calibrate-huge", ("calibrate", str(10**30), "--db", "{db}"),
            error="argument RUN: must be from 1 to 9223372036854775807, got 1000000000000000000000000000000"),
        Case("calibrate-workload-without-device", ("calibrate", "1", "--db", "{db}", "-w", "llava-7b"),
             error="--workload applies to --device (per-op costs are fitted on the run's own workload)"),
        Case("calibrate-device-explicit", ("calibrate", "1", "--db", "{db}", "--device"),
             error="calibrate --device needs an analytic workload (a model, a device and a cluster); this one "
                   "states its op costs explicitly"),
        Case("calibrate-device-no-cluster", ("calibrate", "1", "--db", "{db}", "--device", "-w", "llava-7b"),
             error="calibrate --device needs a workload with a cluster: without one an op's time is the device's "
                   "single efficiency, not its roofline"),
        Case("calibrate-bad-save", ("calibrate", "1", "--db", "{db}", "--save", "a b"),
            error="invalid workload name 'a b': use letters, digits and . _ + / - (starting with a letter or "
                  "digit, at most 100 characters)"),
        Case("compare-run-missing", ("compare-run", "999", "--db", "{db}"), error="no run 999"),
        Case("compare-run-bad-against", ("compare-run", "1", "--db", "{db}", "--against", "1f1b("),
            error="1:6: expected ')' or '[' or a name or a number, got end of input"),
        Case("compare-run-contention-nan", ("compare-run", "1", "--db", "{db}", "--contention", "nan"),
             error="argument --contention: must be a finite number >= 0 and <= 100, got nan"),
        Case("compare-run-top-negative", ("compare-run", "1", "--db", "{db}", "--top", "-1"),
            error="argument --top: must be from 0 to 100000, got -1"),
        Case("worker-long-id", ("worker", "--db", "{db}", "--once", "--worker-id", "w" * 300),
            error="worker id: 300 characters; the limit is 200"),
        Case("worker-nul-id", ("worker", "--db", "{db}", "--once", "--worker-id", "w\x00"),
            error="worker id: contains a NUL character"),
        Case("worker-max-parallel-zero", ("worker", "--db", "{db}", "--once", "--max-parallel", "0"),
             error="argument --max-parallel: must be from 1 to 1024, got 0"),
        Case("worker-lease-negative", ("worker", "--db", "{db}", "--once", "--lease", "-1"),
            error="argument --lease: must be a finite number > 0 and <= 1e+07, got -1"),
        Case("worker-lease-nan", ("worker", "--db", "{db}", "--once", "--lease", "nan"),
            error="argument --lease: must be a finite number > 0 and <= 1e+07, got nan"),
        Case("worker-poll-inf", ("worker", "--db", "{db}", "--once", "--poll", "inf"),
            error="argument --poll: must be a finite number > 0 and <= 1e+07, got inf"),
        Case("worker-launcher-no-entry", ("worker", "--db", "{db}", "--once", "--launcher", "srun {nnodes}"),
             error="launcher template: it must start {entry} on every rank (e.g. '... torchrun ... {entry}')"),
        Case("run-bad-term", ("run", "1f1b("),
            error="1:6: expected ')' or '[' or a name or a number, got end of input"),
        Case("run-steps-zero", ("run", "1f1b(p=2, m=2)", "--steps", "0"),
            error="argument --steps: must be from 1 to 1000000, got 0"),
        Case("run-nproc-wrong", ("run", "1f1b(p=2, m=2)", "--nproc", "3"),
            error="the schedule places ops on 2 devices but 3 x 1 ranks were asked for"),
        Case("run-model-unknown", ("run", "1f1b(p=2, m=2)", "--model", "nope"),
            error="--model nope: unknown model (presets: tiny, tiny-text, tiny-frozen, tiny-varimg, small, "
                  "vit-heavy; registered: tiny-mllm; or hf:NAME, hf:/path, package.module:factory)"),
        Case("run-timeout-nan", ("run", "1f1b(p=2, m=2)", "--timeout", "nan"),
            error="argument --timeout: must be a finite number > 0, got nan"),
        Case("run-timeout-negative", ("run", "1f1b(p=2, m=2)", "--timeout", "-1"),
            error="argument --timeout: must be a finite number > 0, got -1"),
        Case("run-lr-nan", ("run", "1f1b(p=2, m=2)", "--lr", "nan"),
            error="argument --lr: must be a finite number > 0, got nan"),
        Case("run-nnodes-zero", ("run", "1f1b(p=2, m=2)", "--nnodes", "0"),
            error="argument --nnodes: must be from 1 to 9223372036854775807, got 0"),
        Case("run-in-process-nccl", ("run", "1f1b(p=2, m=2)", "--in-process", "--backend", "nccl"),
             error="--in-process runs on CPU threads; drop --backend"),
        Case("run-workload-nan", ("run", "1f1b(p=2, m=2)", "--workload", "{tmp}/w.json"),
            error="{tmp}/w.json: llm.f: expected a number, got nan",
             files={"w.json": b'{"llm": {"f": NaN}}'}),
        Case("run-too-many-chunks", ("run", "1f1b(p=64, m=64)", "--model", "tiny"),
            error="the LLM has 8 layers but the schedule needs 64 chunks (each chunk needs at least one layer)"),
        Case("app-port-text", ("app", "--port", "abc"), error="argument --port: expected an integer, got 'abc'"),
        Case("app-port-range", ("app", "--port", "70000", "--db", "{db}"),
            error="argument --port: must be from 1 to 65535, got 70000"),
        Case("unknown-command", ("frobnicate",),  # (the list grows with the commands)
             error="argument command: invalid choice: 'frobnicate' (choose from 'eval', ", part=True),
    ]


CLOSED = {"closed.toml": b"entry_points = false\n"}  # an allow-list that registers nothing
PRESETS = "tiny, tiny-text, tiny-frozen, tiny-varimg, small, vit-heavy"
NO_ROOT = "no local checkpoints (no checkpoint root is set)"
IMPORT_HINT = "; a queued run never imports a module:function name, only `mpipe run` on your own machine does"


def model_cases() -> list[Case]:
    """Own models: queued runs name only registered models (nothing else is imported);
    a plug-in that breaks the protocol is refused before any rank starts (`mpipe run`
    without --in-process: a case that got past the checks would launch torchrun)."""
    def enqueue(i, model, config=None):
        more = ("-o", f"model_config={config}") if config else ()
        return Case(f"model-enqueue-{i}", ("runs", "enqueue", "base", "--db", "{db}", "--models", "{tmp}/closed.toml",
                                           "-o", f"model={model}", *more),
                    error=f"run option model: {model!r} is not a registered model (registered: none; presets: "
                          f"{PRESETS}; hf:llava, hf:qwen2_5_vl; {NO_ROOT}){IMPORT_HINT if ':' in model else ''}",
                    files=dict(CLOSED))

    def bad(i, factory, message, term="1f1b(p=2, m=2)", *more, files=None):
        return Case(f"model-plugin-{i}", ("run", term, "--model", f"bad_models:{factory}", *more),
                    error=message, files=files or {})

    where = "--model bad_models:"
    partitioned = {"w.json": json.dumps({"llm": {"layers": 7}, "encoders": [
        {"name": "vision", "trainable": True, "images": {"min": 1, "max": 1}}]}).encode()}
    return [
        enqueue("pty-spawn", "pty:spawn", "{tmp}/evil.sh"),
        enqueue("os-system", "os:system", "touch marker"),
        enqueue("subprocess-getoutput", "subprocess:getoutput", "touch marker"),
        enqueue("shutil-rmtree", "shutil:rmtree", "{tmp}"),
        enqueue("import-path", "examples.tiny_mllm:build"),
        enqueue("unknown-name", "mymllm"),
        Case("model-enqueue-checkpoint-no-root", ("runs", "enqueue", "base", "--db", "{db}", "--models",
                                                  "{tmp}/closed.toml", "-o", "model=hf:/etc"),
             error="run option model: hf:/etc: local checkpoints are refused here: the operator has set no "
                   "checkpoint root (checkpoint_root in the allow-list, $MPIPE_MODELS)", files=dict(CLOSED)),
        Case("model-enqueue-checkpoint-outside", ("runs", "enqueue", "base", "--db", "{db}", "--models",
                                                  "{tmp}/root.toml", "-o", "model=hf:/etc/../etc"),
             error="run option model: hf:/etc/../etc: not under the checkpoint root /nonexistent-root "
                   "(it resolves to /etc)", files={"root.toml": b"checkpoint_root = '/nonexistent-root'\n"}),
        Case("model-enqueue-bad-allow-list", ("runs", "enqueue", "base", "--db", "{db}", "--models", "{tmp}/m.toml"),
             error="model allow-list {tmp}/m.toml: unknown key 'bogus' (known: checkpoint_root, data_root, "
                   "entry_points, models)",
             files={"m.toml": b"bogus = 1\n"}),
        Case("model-worker-missing-allow-list", ("worker", "--db", "{db}", "--once", "--models", "{tmp}/none.toml"),
             error="model allow-list {tmp}/none.toml: no such file"),
        Case("model-app-missing-allow-list", ("app", "--db", "{db}", "--no-worker", "--models", "{tmp}/none.toml"),
             error="model allow-list {tmp}/none.toml: no such file"),
        Case("model-list-bad-factory", ("models", "--models", "{tmp}/m.toml"),
             error='model allow-list {tmp}/m.toml: models.x: expected "package.module:factory", got \'os.system\'',
             files={"m.toml": b"[models]\nx = 'os.system'\n"}),
        Case("model-list-ok", ("models", "--models", "{tmp}/m.toml", "--json"),
             check=lambda out: {m["name"]: m["factory"] for m in json.loads(out)["models"]}.get("mine")
             == "my.pkg:build", files={"m.toml": b"[models]\nmine = 'my.pkg:build'\n"}),
        bad("generator-layers", "generator_layers",
            f"{where}generator_layers: layers must be a list of torch.nn.Module (got generator)"),
        bad("function-embedding", "function_embedding",
            f"{where}function_embedding: embedding must be a torch.nn.Module (got function)"),
        bad("function-layer", "function_layer", f"{where}function_layer: layers[1] must be a torch.nn.Module "
                                                "(got function)"),
        bad("function-encoder", "function_encoder",
            f"{where}function_encoder: encoder must be a torch.nn.Module or None (got function)"),
        bad("layer-outside-root", "layer_outside_root",
            f"{where}layer_outside_root: a parameter of layers[2] (AlibiLayer, shape [32]) is not under root "
            "(parameter names come from root)"),
        bad("parameter-in-no-part", "parameter_in_no_part",
            f"{where}parameter_in_no_part: parameter temperature is under root but in none of the parts "
            "(encoder, embedding, layers, head), so no rank would train it"),
        bad("not-a-model", "not_a_model",
            f"{where}not_a_model returned a dict without name, root, encoder, embedding, layers, head, context, "
            "loss, make_batch, target_count, hidden_shape, feature_shape, image_counts, reference_loss "
            "(see executor.runtime.models.protocol.PipelineModel)"),
        bad("too-few-layers", "five_layers",
            "the LLM has 5 layers but the schedule needs 8 chunks (each chunk needs at least one layer)",
            "1f1b(p=8, m=8)"),
        bad("partition-mismatch", "five_layers",
            "model 'examples.tiny_mllm' has 5 layers but the schedule splits the LLM as [5, 2] (7 layers)",
            "partition(1f1b(p=2, m=2), [5, 2])", "--workload", "{tmp}/w.json", files=partitioned),
        Case("model-plugin-tied-ok", ("run", "1f1b(p=2, m=2)", "--model", "bad_models:tied", "--in-process",
                                      "--check-grads", "--json"),
             check=lambda out: json.loads(out)["grad_check"]["ok"]),
    ]


ENCODED = "vit-heavy-small"  # a preset with a (frozen) vision encoder


def layout_cases() -> list[Case]:
    """colocated, encoder_batch, disaggregate and tune at equal device count."""
    e = lambda i, argv, err: Case(f"layout-{i}", argv, error=err)  # noqa: E731
    return [
        e("batch-zero", ("eval", f"encoder_batch({TERM}, 0)", "-w", ENCODED),
          "1:31: encoder_batch: argument 'k' must be >= 1, got 0"),
        e("batch-above-m", ("eval", f"encoder_batch({TERM}, 5)", "-w", ENCODED),
          "1:31: encoder_batch: k=5 is more than the 4 microbatches of a step (a group holds at most all "
          "of them)"),
        e("disaggregate-text-only", ("eval", f"disaggregate({TERM}, encoder_devices=1)"),
          "1:1: disaggregate: disaggregate needs a workload with encoders (this one has none)"),
        e("disaggregate-zero", ("eval", f"disaggregate({TERM}, encoder_devices=0)", "-w", ENCODED),
          "1:30: disaggregate: argument 'encoder_devices' must be >= 1, got 0"),
        e("colocated-text-only", ("eval", f"colocated({TERM})"),
          "1:1: colocated: colocated needs a workload with encoders (this one has none)"),
        e("run-disaggregate-nproc-short", ("run", f"disaggregate({TERM}, encoder_devices=1)", "--workload", ENCODED,
                                           "--nproc", "2"),
          "the schedule places ops on 3 devices (p + k = 2 LLM + 1 encoder device of disaggregate) but "
          "2 x 1 ranks were asked for"),
        e("tune-encoder-devices-all", ("tune", "-w", ENCODED, "-p", "4", "-m", "4", "--encoder-devices", "4"),
          "--encoder-devices 4 leaves no device for the LLM: it must be less than --devices (4)"),
        e("tune-encoder-devices-more", ("tune", "-w", ENCODED, "-p", "4", "-m", "4", "--encoder-devices", "2,9"),
          "--encoder-devices 9 leaves no device for the LLM: it must be less than --devices (4)"),
        e("tune-encoder-devices-text", ("tune", "-w", ENCODED, "-p", "4", "-m", "4", "--encoder-devices", "two"),
          "argument --encoder-devices: expected whole numbers like 2 or 1,2,4, got 'two'"),
    ]


def data_convert_cases() -> list[Case]:
    """`mpipe data convert`: LLaVA-style annotations to data records."""
    argv = ("data", "convert", "{tmp}/a.json", "--preset", "internvl")

    def e(i, doc, err, *more, files=None, part=False):
        raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        return Case(f"convert-{i}", argv + more, error=err, files={"a.json": raw, **(files or {})}, part=part)

    where = "{tmp}/a.json[0]"
    return [
        Case("convert-missing", ("data", "convert", "{tmp}/none.json", "--preset", "internvl"),
             error="{tmp}/none.json: no such file"),
        e("not-json", b"[{oops", "{tmp}/a.json:1:3: not valid json: Expecting property name enclosed in double "
                                  "quotes"),
        e("not-a-list", {"image": "x.jpg"}, "{tmp}/a.json: expected a JSON list of annotation records, got dict"),
        e("empty", [], "{tmp}/a.json: no annotation records"),
        e("record-not-object", [3], f"{where}: expected an annotation object, got int"),
        e("images-not-list", [{"images": 3}], f"{where}: images: expected a list of paths, got 3"),
        e("image-not-path", [{"image": ["x.jpg"]}], f"{where}: image: expected a path, got ['x.jpg']"),
        e("size-zero", [{"image": "x.jpg", "image_size": [0, 5]}],
          f"{where}: image_size: an image size is [width, height], two whole numbers from 1 to 1048576, got [0, 5]"),
        e("size-text", [{"image": "x.jpg", "image_size": "big"}],
          f"{where}: image_size: an image size is [width, height], two whole numbers from 1 to 1048576, got 'big'"),
        e("sizes-short", [{"images": ["a.jpg", "b.jpg"], "image_sizes": [[10, 10]]}], f"{where}: 2 images but 1 sizes"),
        e("no-size", [{"image": "x.jpg", "conversations": []}],
          f"{where}: no image_size in the record: give --images DIR to read the files"),
        e("video-no-frames", [{"video": "v.mp4", "conversations": []}], f"{where}: a video record needs a 'frames' count"),
        e("text-negative", [{"text_tokens": -1}],
          f"{where}: text_tokens: expected a whole number from 0 to 1048576, got -1"),
        e("empty-record", [{"conversations": []}], f"{where}: an empty record (no images, frames or text tokens)"),
        e("turns-not-list", [{"conversations": 5}],
          f'{where}: conversations: expected a list of {{"from": ..., "value": ...}} turns'),
        e("images-not-folder", [{"image": "x.jpg"}], "--images {tmp}/nope: not a folder", "--images", "{tmp}/nope"),
        e("image-outside", [{"image": "../x.jpg"}], f"{where}: image path '../x.jpg' lies outside --images {{tmp}}",
          "--images", "{tmp}"),
        e("image-not-image", [{"image": "x.jpg"}], f"{where}: cannot read the image x.jpg under {{tmp}} (cannot "
                                                     "identify image file", "--images", "{tmp}",
          files={"x.jpg": b"not an image"}, part=True),
        e("image-missing", [{"image": "y.jpg"}], f"{where}: cannot read the image y.jpg under {{tmp}} (No such file "
                                                    "or directory)", "--images", "{tmp}"),
        e("output-unwritable", [{"text_tokens": 3}], "-o {tmp}/no/out.jsonl: cannot write (No such file or directory)",
          "-o", "{tmp}/no/out.jsonl"),
        e("preset-unknown", [{"text_tokens": 3}], "argument --preset: invalid choice: 'llava'", "--preset", "llava",
          part=True),
        Case("convert-ok", argv, check=lambda out: [json.loads(x) for x in out.splitlines()] == [
                 {"images": 1, "tiles": [2], "text_tokens": 2}, {"images": 0, "tiles": [], "text_tokens": 3}],
             files={"a.json": json.dumps([
                 {"image": "x.jpg", "image_size": [896, 448], "conversations": [{"from": "human", "value": "a cat"}]},
                 {"text_tokens": 3}]).encode()}),
    ]


def all_cases() -> list[Case]:
    cases = (term_cases() + workload_cases() + memory_cases() + csv_cases() + output_cases() + db_target_cases()
             + library_cases() + runs_cases() + executor_arg_cases() + model_cases() + layout_cases() + trace_cases()
             + data_convert_cases())
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return cases


def seed_database(url: str) -> None:
    from storage import enqueue, open_database, save_schedule, save_workload

    db = open_database(url)
    try:
        save_schedule(db, "base", TERM)
        save_workload(db, "wl", "uniform")
        enqueue(db, "base")
    finally:
        db.close()
