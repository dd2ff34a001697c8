"""The per-batch benchmark's verdict: what it says of the issue's targets follows its rows."""
from benchmarks.per_batch_bench import verdict


def _row(size, vit, gain, worst=1.0, plan_max=40.0, even=1.1, bound=1.3, fixed_orders=True, preset="heavy-tailed"):
    return {"preset": preset, "size": size, "vit": vit, "gain": gain, "worst": worst, "plan_max": plan_max,
            "even": even, "bound": bound, "fixed_orders": fixed_orders}


def test_the_verdict_names_each_target_and_the_ceiling_that_rules_it_out():
    rows = [_row("P8 M16", "frozen", 1.02, bound=1.09, fixed_orders=False),
            _row("P8 M16", "trained", 1.10, even=1.12),
            _row("P16 M64", "frozen", 1.06, even=1.01, fixed_orders=False),  # orders change: even bounds nothing
            _row("P16 M64", "trained", 1.16, even=1.2),
            _row("P8 M16", "frozen", 1.0, preset="internvl")]
    assert verdict(rows) == [
        "never slower on any batch: met (smallest batch gain 1.000x)",
        "planning within 50 ms: met (max 40.0 ms)",
        "mean gain >= 1.15x on heavy-tailed: 1 of 4 rows (P8 M16 frozen 1.020x, P8 M16 trained 1.100x, "
        "P16 M64 frozen 1.060x, P16 M64 trained 1.160x)",
        "  under the lower bound's ceiling, no plan of any kind reaches it: P8 M16 frozen (LB 1.090x)",
        "  per_batch keeps the static op orders (only the microbatches' composition and order change), and those "
        "orders with every microbatch at its batch's mean gain: P8 M16 trained 1.120x"]


def test_a_slower_batch_or_a_late_plan_is_reported_as_not_met():
    rows = [_row("P8 M16", "trained", 1.2, worst=0.99, plan_max=52.5, preset="internvl")]
    assert verdict(rows) == ["never slower on any batch: NOT met (smallest batch gain 0.990x)",
                             "planning within 50 ms: NOT met (max 52.5 ms)"]
