"""The process grid (issue 39 section 1): the rank order of the exports and
`import-trace --order` (tp fastest), each rank's pipeline and groups, and a
mesh without the dimensions of size 1."""
from executor.parallel.grid import ProcessGrid
from mpipe_core.formats.rank_layout import parse_layout
from mpipe_core.runs.layout import RunLayout


def test_ranks_are_ordered_as_the_exports_and_import_trace_order_them():
    grid = ProcessGrid(RunLayout(tp=2, cp=2, pp=2, dp=2))
    imported = parse_layout("tp=2,cp=2,dp=2,pp=2", order="tp-cp-dp-pp")
    assert [grid.coords(r) for r in range(16)] == [imported.coords(r) for r in range(16)]
    assert grid.coords(1) == {"tp": 1, "cp": 0, "dp": 0, "pp": 0}  # tp fastest
    assert grid.coords(8) == {"tp": 0, "cp": 0, "dp": 0, "pp": 1}  # pp slowest


def test_pipelines_and_groups():
    grid = ProcessGrid(RunLayout(pp=2, dp=2))
    assert grid.pipelines() == [(0, 2), (1, 3)]
    assert grid.pipeline(3) == (1, 3) and grid.members("dp", 2) == (2, 3)
    assert [r for r in range(4) if grid.is_first_pipeline(r)] == [0, 2]
    tp = ProcessGrid(RunLayout(tp=2, pp=2, dp=2))
    assert tp.members("tp", 5) == (4, 5) and tp.members("dp", 5) == (5, 7) and tp.pipeline(5) == (1, 5)


def test_the_mesh_leaves_out_dimensions_of_size_one():
    assert ProcessGrid(RunLayout(pp=2, dp=2)).mesh_dims() == (("pp", "dp"), (2, 2))
    assert ProcessGrid(RunLayout(pp=1, dp=4)).mesh_dims() == (("dp",), (4,))
    assert ProcessGrid(RunLayout(tp=2, cp=2, pp=1, dp=1)).mesh_dims() == (("cp", "tp"), (2, 2))
    grid = ProcessGrid(RunLayout(pp=1))
    assert grid.mesh_dims() == ((), ()) and grid.build_mesh("cpu") is None  # one rank: no group at all
