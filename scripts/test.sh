#!/usr/bin/env bash
# The whole test suite, with everything it needs started here.
set -euo pipefail
cd "$(dirname "$0")/.."
# PostgreSQL for the storage tests (exports MPIPE_TEST_PG_URL; stops when pytest exits).
source scripts/start_postgres.sh
# Debian's chromium for the app's browser test (Playwright drives it; never `playwright install`).
command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
# The slowest tests are named at the end, so a suite that grows slower says where.
exec .venv/bin/python -m pytest -q --durations=15 "$@"
