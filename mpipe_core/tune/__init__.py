"""Which schedule to run: a search over the algebra (`search`) and an exact
encoder placement for small instances (`exact`, needs OR-Tools)."""
from .fit import NothingFitsError
from .search import Candidate, SearchStopped, TuneResult, pareto_front, tune

__all__ = ["Candidate", "NothingFitsError", "SearchStopped", "TuneResult", "pareto_front", "tune"]
