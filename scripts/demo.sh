#!/usr/bin/env bash
# The whole loop on this machine, narrated live: the seed's fault against mlx-medic, then
# against the seed's first fix, side by side (testbed/demo.py). Root on Linux, after
# `scripts/setup.sh --test`.
#   scripts/demo.sh [--faults N] [--short] [--screenshot-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "demo: needs root (the testbed's namespaces, mounts and sshd)" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  echo "demo: no .venv here; run scripts/setup.sh --test first" >&2
  exit 2
fi
exec .venv/bin/python -m testbed.demo "$@"
