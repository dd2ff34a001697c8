"""Mpipe's Streamlit entry script: it only routes (`mpipe app` starts it)."""
import streamlit as st

st.set_page_config(page_title="Mpipe", layout="wide")

st.navigation({
    "Design": [
        st.Page("app_pages/designer.py", title="Designer", default=True),
        st.Page("app_pages/before_after.py", title="Before / after"),
        st.Page("app_pages/compare.py", title="Compare"),
    ],
    "Team": [
        st.Page("app_pages/library.py", title="Library"),
        st.Page("app_pages/runs.py", title="Runs"),
    ],
}).run()
