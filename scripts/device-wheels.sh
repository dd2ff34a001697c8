#!/usr/bin/env bash
# Fetch, on a machine that reaches PyPI, the pure-Python and small compiled
# packages Mpipe needs that a GPU machine's own image may lack (its torch,
# numpy and transformers are used as they are), as CPython 3.12 x86-64 wheels
# in .whl/ for scripts/device-check.sh to install without a network.
#
#   bash scripts/device-wheels.sh [PYTHON_VERSION]     (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
for package in lark sqlalchemy greenlet alembic mako markupsafe typing_extensions tomli; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$package"
done
ls .whl
