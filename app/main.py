"""Mpipe's Streamlit entry script: it signs people in and routes (`mpipe app` starts it)."""
import streamlit as st

from app import auth, state

st.set_page_config(page_title="Mpipe", layout="wide")
# Page links look like links (Streamlit draws them as plain text by default).
st.html("""<style>
a[data-testid="stPageLink-NavLink"] { color: #1f6feb; border: 1px solid #d0d7de; border-radius: 6px;
  padding: 0.15rem 0.6rem; }
a[data-testid="stPageLink-NavLink"] p { text-decoration: underline; }
</style>""")

auth.gate()  # the sign-in page until the user signs in; the banner of an app without sign-in
page = st.navigation({
    "Design": [
        st.Page("app_pages/designer.py", title="Designer", default=True),
        st.Page("app_pages/before_after.py", title="Before / after"),
        st.Page("app_pages/compare.py", title="Compare"),
        st.Page("app_pages/tune.py", title="Tune"),
        st.Page("app_pages/plan.py", title="Plan"),
    ],
    "Team": [
        st.Page("app_pages/library.py", title="Library"),
        st.Page("app_pages/runs.py", title="Runs"),
    ],
})
state.set_page(page.url_path)
page.run()
