#!/usr/bin/env bash
# Set up and run this node's exporter with the embedded defaults: no inventory,
# MLX processes discovered by command line, metrics on :10900/metrics, series without
# a node label (nothing names this node). Extra arguments go to `mlx-medic exporter`,
# e.g. --config.file inventory.yaml --node ai001 (then every series carries node="ai001")
# or collector settings such as --collector.tmpdirs.interval 300 (all in --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/mlx-medic exporter "$@"
