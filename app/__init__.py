"""The Streamlit app: design schedules in the browser, share them, launch runs,
inspect timelines.

`main.py` only routes (st.navigation); each page in `app_pages/` lays out
widgets and calls the other layers' APIs; `bars.py` turns a simulated timeline
or a run's measured timings into column arrays; `figures.py` draws them with
Plotly; `measured.py` reduces a run to one step or the mean of steps.
Shared by the pages: `state.py` (session state behind named accessors),
`evaluation.py` (evaluations cached across sessions by canonical term and
workload digest, stoppable when slow), `widgets.py` (workload picker,
errors, metric cards, downloads), `formatting.py` (numbers and units),
`database.py` (one engine per server process).
"""
