"""The layout search's default budget (`plan.plan`), kept apart so the CLI can name it
in its help without importing the search.

The budget counts terms evaluated (each term's recompute tries come on top), not
seconds: a bound that does not depend on the machine's speed or load, so the same
question always gets the same answer, runners-up included.  Idle here, 800 terms
at 512 devices take about a minute.
"""

DEFAULT_EVALUATIONS = 800
