"""The loopback probe's fit (`executor/runtime/link_probe.py`): samples made by the
core's own two-rank formulas from known figures give those figures back, each
kind's time is what `mpipe_core.workloads.collectives` prices on the fitted
cluster, and the fitted figures are never negative."""
from __future__ import annotations

import pytest

from executor.runtime.link_probe import KINDS, SIZES, cluster_document, fit_links
from mpipe_core.workloads import collectives
from mpipe_core.workloads.cluster import group_link, parse_cluster, place

BASE_US, LATENCY_US, GBPS = 150.0, 40.0, 2.5


def _seconds(kind: str, nbytes: int) -> float:
    coll = 0.0 if kind == "send" else 1.0
    hops = 2.0 if kind == "all-reduce" else 1.0
    moved = nbytes if kind in ("all-reduce", "send") else nbytes / 2
    return (coll * BASE_US + hops * LATENCY_US) * 1e-6 + moved / (GBPS * 1e9)


def test_known_figures_come_back():
    fit = fit_links([(k, n, _seconds(k, n)) for n in SIZES for k in KINDS])
    assert fit.collective_latency_us == pytest.approx(BASE_US, rel=1e-6)
    assert fit.latency_us == pytest.approx(LATENCY_US, rel=1e-6)
    assert fit.gbps == pytest.approx(GBPS, rel=1e-6)
    assert fit.rms_relative_error < 1e-9


def test_the_fitted_cluster_prices_each_kind_as_the_probe_measured_it():
    fit = fit_links([(k, n, _seconds(k, n)) for n in SIZES for k in KINDS])
    cluster = parse_cluster(cluster_document(fit))
    link = group_link(cluster, place(cluster, 1, 1, 2, 1, check=False), "dp")
    nbytes = 1 << 20
    priced = {"all-reduce": collectives.all_reduce(2, nbytes, link).seconds,
              "reduce-scatter": collectives.reduce_scatter(2, nbytes, link).seconds,
              "all-gather": collectives.all_gather(2, nbytes, link).seconds,
              "send": collectives.send(nbytes, cluster.scale_up).seconds}
    for kind in KINDS:
        assert priced[kind] == pytest.approx(_seconds(kind, nbytes), rel=1e-3), kind


def test_a_latency_the_samples_cannot_support_is_zero_not_negative():
    # Pure bandwidth, a little noise: the least-squares latency would go below zero.
    samples = [(k, n, n / 1e9 * (1.02 if i % 2 else 0.98)) for i, (k, n) in
               enumerate((k, n) for n in SIZES for k in KINDS)]
    fit = fit_links(samples)
    assert fit.collective_latency_us >= 0 and fit.latency_us >= 0 and fit.gbps > 0
