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
# pytest's exit 5 (no tests collected) is a failure here.
run_pytest() {
  .venv/bin/python -m pytest -p no:cacheprovider "$@"
  local code=$?
  if [ "$code" = 5 ]; then
    echo "test.sh: pytest collected no tests ($*); that is a failure" >&2
    return 1
  fi
  return "$code"
}
if [ "$#" != 0 ]; then
  run_pytest "$@"
  exit $?
fi
# The tests without simulated nodes are independent of each other: two workers (the CI
# machine's two cores) halve their time. The testbed tests share one simulated cluster
# per session and run in order, in one process.
# Both run whatever the other found, so one CI run shows every failure.
run_pytest -m "not testbed" -n 2
rc=$?
run_pytest -m testbed
testbed_rc=$?
[ "$rc" = 0 ] && rc=$testbed_rc
if [ "$rc" = 0 ]; then
  # The least-privilege deployment as rendered (docs/security.md): the testbed tests marked
  # least_privilege (recover, finish-stop, an unreachable head, the serve wrapper's teardown)
  # again, every node with its non-root login user. (tests/loop runs the whole loop in that
  # mode already: sweep-orphans, the model lock, the remote probe and the wrapper over the
  # rendered keys and sudoers.)
  MLX_MEDIC_TESTBED_USERS=three run_pytest -m "testbed and least_privilege"
  rc=$?
fi
exit "$rc"
