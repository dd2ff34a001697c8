#!/usr/bin/env bash
# The whole test suite, with everything it needs started here.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -q "$@"
