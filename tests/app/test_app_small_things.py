"""Small things a newcomer hit in the app: saving a schedule that does not fit warns
before the click and the library has a fits column; a term already transposed is
never offered "Transpose it"."""
from __future__ import annotations

from app_helpers import open_page, shown, start_app, table_of

TOO_BIG = "zbv(p=8, m=16)"  # internvl-26b's whole trained tower on stage 0: far over a 64 GB die


def test_saving_a_schedule_that_does_not_fit_warns_and_the_library_says_fits(db_url):
    at = start_app()
    at.radio(key="wl.source").set_value("Preset").run()
    at.selectbox(key="wl.preset").select("internvl-26b")
    at.text_area(key="designer.term").input(TOO_BIG).run()
    warnings = [shown(w.value) for w in at.warning]
    assert any(w.startswith(f"{TOO_BIG} does not fit in 64 GB: device 0 needs ") and
               w.endswith("You can still save it: the library shows it with fits “no”.") for w in warnings)
    at.text_input(key="designer.save_name").input("big")
    at.button(key="designer.save").click().run()
    assert any(shown(s.value).endswith("; it does not fit the device's memory") for s in at.success)
    at.selectbox(key="wl.preset").select("vit-heavy-small")
    at.text_area(key="designer.term").input("1f1b(p=4, m=4)").run()
    assert not any("You can still save it" in shown(w.value) for w in at.warning)  # unknown capacity: no warning
    at.text_input(key="designer.save_name").input("small")
    at.button(key="designer.save").click().run()
    at = open_page(at, "library")
    table = table_of(at, "name")
    assert dict(zip(table["name"], table["fits"])) == {"big": "no", "small": "unknown"}


def test_a_term_already_transposed_is_not_offered_transpose_it(db_url):
    at = start_app()
    at.radio(key="wl.source").set_value("Preset").run()
    at.selectbox(key="wl.preset").select("vit-heavy-small")
    at.text_area(key="designer.term").input("recompute(transpose(1f1b(p=4, m=4), mode=dynamic), encoders=yes)").run()
    assert not at.exception
    assert not [b.label for b in at.button if b.label.startswith("Transpose it")]
    at.text_area(key="designer.term").input("1f1b(p=4, m=4)").run()
    assert [b.label for b in at.button if b.label.startswith("Transpose it")] == \
        ["Transpose it: transpose(1f1b(p=4, m=4), mode=dynamic)"]


def test_a_recomputed_balanced_term_is_offered_its_body_transposed(db_url):
    at = start_app()
    at.radio(key="wl.source").set_value("Preset").run()
    at.selectbox(key="wl.preset").select("internvl-26b")
    at.text_area(key="designer.term").input("recompute(balanced(zbv(p=8, m=16)))").run()
    assert not at.exception
    labels = [b.label for b in at.button]
    assert "Transpose its body instead: transpose(recompute(zbv(p=8, m=16)), mode=dynamic)" in labels
