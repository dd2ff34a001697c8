#!/usr/bin/env bash
# The whole test suite, with everything it needs started here.
set -euo pipefail
cd "$(dirname "$0")/.."
# PostgreSQL for the storage tests (exports MPIPE_TEST_PG_URL; stops when pytest exits).
source scripts/start_postgres.sh
# Debian's chromium for the app's browser test (Playwright drives it; never `playwright install`).
command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
# The suite starts hundreds of Python processes (ranks, CLI calls, workers, servers).  Where
# PYTHONDONTWRITEBYTECODE is set (as on our machines) none of them cached the bytecode it
# compiled: each compiled the project's sources again (0.6 CPU-s a rank), and each pytest
# worker re-rewrote every test module's asserts (5 CPU-s).  The suite writes its caches
# (into __pycache__ folders git ignores), and compiles the sources once before it starts.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 mpipe_core mpipe_cli executor storage app examples benchmarks tests
# Tests run in MPIPE_TEST_WORKERS processes (pytest-xdist; default 4, more than this 2-core
# machine's cores because many tests wait on torchrun, servers and browsers).  `--dist loadfile`
# keeps each test file in one process, so a module-scoped fixture (one server, one worker's runs,
# one browser) starts once.  (Not `loadgroup`: xdist 3.8 marks groups in `item._nodeid`, which
# pytest 9 no longer reads, so its groups silently spread.)  Files go out in collection order,
# which puts the slow ones first (tests/conftest.py), not in xdist's default order (the files
# with the most tests first, which left the long ones to the end).  `-n 0` runs everything in
# one process.
# The slowest tests are named at the end, so a suite that grows slower says where.
exec .venv/bin/python -m pytest -q -n "${MPIPE_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder \
    --durations=15 "$@"
