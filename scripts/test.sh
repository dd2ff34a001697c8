#!/usr/bin/env bash
# The whole test suite, with everything it needs started here.
set -euo pipefail
cd "$(dirname "$0")/.."
# PostgreSQL for the storage tests (exports MPIPE_TEST_PG_URL; stops when pytest exits).
source scripts/start_postgres.sh
# Debian's chromium for the app's browser test (Playwright drives it; never `playwright install`).
command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
# Tests run in MPIPE_TEST_WORKERS processes (pytest-xdist; default 4, more than this 2-core
# machine's cores because many tests wait on torchrun, servers and browsers).  A module's tests
# that share a module-scoped fixture stay in one process (tests/conftest.py groups them), so
# `--dist loadgroup`.  `bash scripts/test.sh -n 0` runs everything in this one process.
# The slowest tests are named at the end, so a suite that grows slower says where.
exec .venv/bin/python -m pytest -q -n "${MPIPE_TEST_WORKERS:-4}" --dist loadgroup --durations=15 "$@"
