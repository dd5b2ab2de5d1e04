#!/usr/bin/env bash
# Set everything up, then run the whole test suite (what CI runs).
# Extra arguments go to pytest, e.g. scripts/test.sh -k orphan -x
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test || exit 1
mkdir -p artifacts
.venv/bin/python -m ruff check . || exit 1
.venv/bin/python -m mypy mlx_medic testbed || exit 1
.venv/bin/python -m pytest -p no:cacheprovider "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
