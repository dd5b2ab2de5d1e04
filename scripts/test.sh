#!/usr/bin/env bash
# Set everything up, then run the whole test suite (what CI runs).
# Extra arguments go to pytest, e.g. scripts/test.sh -k orphan -x
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test || exit 1
mkdir -p artifacts
.venv/bin/python -m ruff check . || exit 1
.venv/bin/python -m ruff format --check . || exit 1
.venv/bin/python -m mypy mlx_medic testbed || exit 1
.venv/bin/python -m pytest -p no:cacheprovider "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
if [ "$rc" = 0 ] && [ "$#" = 0 ]; then
  # The least-privilege deployment as rendered (docs/security.md): the testbed tests marked
  # least_privilege (recover, finish-stop, an unreachable head, the serve wrapper's teardown)
  # again, every node with its non-root login user. (tests/loop runs the whole loop in that
  # mode already: sweep-orphans, the model lock, the remote probe and the wrapper over the
  # rendered keys and sudoers.)
  MLX_MEDIC_TESTBED_USERS=three .venv/bin/python -m pytest -p no:cacheprovider \
    -m "testbed and least_privilege"
  rc=$?
  if [ "$rc" = 5 ]; then
    echo "test.sh: the three-user run collected no tests; that is a failure" >&2
    exit 1
  fi
fi
exit "$rc"
