"""The Plan page shows the answer first: the chart's axes fit what fits (over-cap
candidates are a toggle, in their strategy's colour), the Pareto line is visible, the
device map's stages are discrete colours, why each axis lost is shown open, a count
names its NPUs where a device is a die, and an invalid device count blocks the search."""
from __future__ import annotations

from app_helpers import array, button, errors, figure, open_page, shown, start_app

from app.plan_view import PlanInputs, search, stage_colorscale
from app.evaluation import canonical_json
from mpipe_core.workloads.presets import preset_document

CAP = 20.0  # GB: llama2-7b on 8 A100s has candidates on both sides of it
INPUTS = PlanInputs(canonical_json(preset_document("llama2-7b")), 8, 8, "dgx-a100", CAP, 3, 800)


def _plan(at):
    at.selectbox(key="plan.wl.preset").select("llama2-7b")
    at.number_input(key="plan.devices").set_value(8)
    at.number_input(key="plan.batch").set_value(8)
    at.selectbox(key="plan.cluster").select("dgx-a100")
    at.number_input(key="plan.top").set_value(3)
    at.radio(key="plan.cap_mode").set_value("a cap of my own (GB)").run()
    at.number_input(key="plan.cap").set_value(CAP)
    return button(at, "Plan").click().run()


def _candidate_traces(fig: dict) -> list[dict]:
    return [t for t in fig["data"] if t.get("mode") == "markers" and t["name"] != "chosen"]


def test_the_chart_fits_what_fits_and_over_cap_points_are_a_toggle(db_url):
    at = _plan(open_page(start_app(), "plan"))
    assert not at.exception and not errors(at)
    expected = search(INPUTS)
    over = [c for c in expected.candidates if not c.within_cap]
    fitting = [c for c in expected.candidates if c.within_cap]
    assert over and fitting
    fig = figure(at, 0)
    drawn = [x for t in _candidate_traces(fig) for x in array(t["x"])]
    assert len(drawn) == len(fitting) and max(drawn) <= CAP  # nothing over the cap stretches the x axis
    assert f"({len(over):,} over the memory cap not drawn)" in fig["layout"]["title"]["text"]
    pareto = next(t for t in fig["data"] if t["name"] == "Pareto front")
    assert pareto["line"]["width"] >= 2 and pareto["mode"] == "lines+markers"

    at.toggle(key="plan.show_over").set_value(True).run()
    fig = figure(at, 0)
    colours = {t["name"]: t["marker"]["color"] for t in _candidate_traces(fig)}
    over_traces = {name: colour for name, colour in colours.items() if name.endswith("▲ over the cap")}
    assert sum(len(array(t["x"])) for t in _candidate_traces(fig) if t["name"] in over_traces) == len(over)
    for name, colour in over_traces.items():  # each in its strategy's colour, where that strategy also fits
        family = name.removesuffix(" ▲ over the cap")
        if family in colours:
            assert colour == colours[family]


def test_why_each_axis_lost_is_shown_open_and_stages_are_discrete_colours(db_url):
    at = _plan(open_page(start_app(), "plan"))
    expected = search(INPUTS)
    assert "Why each axis lost" in [h.value for h in at.subheader]
    assert not [e for e in at.expander if e.label.startswith("Ruled out")]
    assert expected.ruled_out and set(expected.ruled_out) <= {t.value for t in at.text}
    ranks = figure(at, 2)["data"][0]["marker"]
    stages = max(array(ranks["color"])) + 1
    assert ranks["colorscale"] == stage_colorscale(stages) and ranks["cmin"] == -0.5
    scale = stage_colorscale(4)
    assert [scale[2 * k][1] == scale[2 * k + 1][1] for k in range(4)] == [True] * 4  # one flat band a stage
    assert len({scale[2 * k][1] for k in range(4)}) == 4


def test_an_invalid_device_count_blocks_plan_and_says_why(db_url):
    at = open_page(start_app(), "plan")
    for bad in (0, -5):
        at.number_input(key="plan.devices").set_value(bad).run()
        assert errors(at) == [f"Devices must be at least 1 (got {bad:,}): plan is disabled until it is."]
        assert button(at, "Plan").disabled
        assert at.number_input(key="plan.devices").value == bad  # never silently the previous value
    at.number_input(key="plan.devices").set_value(512).run()
    assert not errors(at) and not button(at, "Plan").disabled
    # internvl-26b's device is a 910C die on CloudMatrix384: the count names its NPUs, asked and shown.
    assert "512 devices (256 NPUs, 2 dies each)" in [shown(c.value) for c in at.caption]
    at.selectbox(key="plan.cluster").select("cloudmatrix384")
    at.number_input(key="plan.devices").set_value(16)
    at.number_input(key="plan.batch").set_value(16)
    at.number_input(key="plan.budget").set_value(5)
    button(at, "Plan").click().run()
    assert not at.exception and not errors(at)
    assert [m.value for m in at.metric if m.label == "Devices (8 NPUs, 2 dies each)"] == ["16"]
    assert any(shown(c.value).startswith("16 devices (8 NPUs, 2 dies each) on cloudmatrix384") for c in at.caption)


def test_the_designer_names_the_npus_of_a_die_count(db_url):
    at = open_page(start_app(), "designer")
    at.radio(key="wl.source").set_value("Preset").run()
    at.selectbox(key="wl.preset").select("internvl-26b")
    at.text_area(key="designer.term").input("1f1b(p=4, m=8)").run()
    assert not at.exception
    labels = [m.label for m in at.metric if m.label.startswith("Devices in all")]
    assert labels == ["Devices in all (2 NPUs, 2 dies each)"]
