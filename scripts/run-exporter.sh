#!/usr/bin/env bash
# Run this node's exporter with the embedded defaults: no inventory, MLX processes discovered
# by command line, metrics on :10900/metrics, series without a node label (nothing names this
# node). It runs scripts/setup.sh first on a fresh clone, and again whenever pyproject.toml or
# scripts/setup.sh changed since the last install (the stamp in scripts/venv-stamp.sh);
# otherwise the exporter starts at once. Extra arguments go to `mlx-medic exporter`,
# e.g. --inventory inventory.yaml --node ai001 (then every series carries node="ai001")
# or collector settings such as --collector.tmpdirs.interval 300 (all in --help).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv-stamp.sh
venv_current base || scripts/setup.sh
exec .venv/bin/mlx-medic exporter "$@"
