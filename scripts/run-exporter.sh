#!/usr/bin/env bash
# Set up and run this node's exporter with the embedded defaults: no inventory,
# MLX processes discovered by command line, metrics on :10900/metrics.
# Extra arguments go to `mlx-medic exporter`, e.g. --config.file inventory.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/mlx-medic exporter "$@"
