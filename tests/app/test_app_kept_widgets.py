"""`app.state.kept`: a widget's value survives switching pages, and a page never
sends the browser back a value it already holds (which would undo a click the
user made while the page was rerunning: the Tune page once searched without the
sequence parallel box its user had ticked)."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _page_with_a_kept_box():
    import streamlit as st

    from app import state

    page = st.session_state.get("test.page", "tune")
    state.set_page(page)
    if page == "tune":  # the other page does not draw the box
        st.checkbox("Sequence parallel", key=state.kept("tune.sp", False))
        state.remember("tune.sp")


def _box(at: AppTest):
    return at.checkbox(key="tune.sp")


def test_a_box_the_page_drew_is_not_sent_back_to_the_browser_on_its_next_runs():
    at = AppTest.from_function(_page_with_a_kept_box).run()
    assert _box(at).proto.set_value  # the first draw gives the browser its starting value
    _box(at).check().run()
    assert _box(at).value is True
    assert not _box(at).proto.set_value  # the browser's own value is not overwritten
    at.run()
    assert _box(at).value is True and not _box(at).proto.set_value


def test_a_box_keeps_its_value_across_a_page_that_does_not_draw_it():
    at = AppTest.from_function(_page_with_a_kept_box).run()
    _box(at).check().run()
    at.session_state["test.page"] = "designer"
    at.run()
    assert not at.checkbox
    at.session_state["test.page"] = "tune"
    at.run()
    assert _box(at).value is True
    assert _box(at).proto.set_value  # drawn again: the browser is given the kept value
