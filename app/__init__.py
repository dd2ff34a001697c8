"""The Streamlit app: design schedules in the browser, share them, launch runs,
inspect timelines.

`main.py` only routes (st.navigation); each page in `app_pages/` lays out
widgets and calls the other layers' APIs; `bars.py` turns a simulated timeline
or a run's measured timings into column arrays; `figures.py` draws them with
Plotly; `views.py` holds the widgets several pages share.
"""
