#!/usr/bin/env bash
# Regenerate deploy/ from examples/inventory.yaml (tests/render/test_deploy_in_sync.py
# fails when they differ). With a directory argument, render there instead.
#   scripts/render-deploy.sh [DIR]
# deploy/remediator.yml is written by hand (it is the remediator's config, not rendered).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-deploy}
python=${PYTHON:-.venv/bin/python}
rendered=(launchd systemd supervisord sudoers authorized-keys newsyslog logrotate prometheus.yml
          alertmanager.yml rules)
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
"$python" -m mlx_medic.cli render all --inventory examples/inventory.yaml --out "$staging" \
  --remediator.url https://remediator.example:10901 \
  --alertmanager.address alertmanager.example:9093 \
  --ssh.public-key examples/remediator_ed25519.pub >/dev/null
mkdir -p "$out"
for name in "${rendered[@]}"; do rm -rf "${out:?}/$name"; done
cp -a "$staging"/. "$out"/
