from executor.service.build_memory import build_memory_line


def test_build_memory_line_names_each_rank_and_skips_runs_without_figures():
    mb = 2 ** 20
    memory = [{"rank": 0, "build": {"peak": 300 * mb, "growth": 50 * mb, "parameters": 40 * mb}},
              {"rank": 1, "build": {"peak": 280 * mb, "growth": None, "parameters": 30 * mb}}]
    assert build_memory_line(memory) == (
        "build memory per rank (process peak resident, its rise over the build, parameters made): "
        "rank 0 peak 300.0 MB (+50.0 MB), parameters 40.0 MB; rank 1 peak 280.0 MB (+?), parameters 30.0 MB")
    assert build_memory_line([{"rank": 0, "activation_peak": 1}]) is None and build_memory_line(None) is None
