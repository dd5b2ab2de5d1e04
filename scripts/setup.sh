#!/usr/bin/env bash
# Install what mlx-medic needs on a fresh Debian 12 machine (root, Python 3.11).
#   scripts/setup.sh          the exporter/remediator only (a Python venv in .venv)
#   scripts/setup.sh --test   also MLX, the test tools and Debian's sshd, Prometheus,
#                             Alertmanager, process-exporter, supervisord, Chromium and
#                             sudo and systemd (visudo, `sudo -l`, systemd-analyze check the
#                             rendered files)
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
if [ "${1:-}" = "--test" ]; then
  extras="[test]"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openssh-server openssh-client prometheus prometheus-alertmanager \
      prometheus-process-exporter supervisor chromium procps lsof iproute2 util-linux wrk sudo systemd \
      python3-venv >/dev/null
  else
    echo "setup: not root, skipping apt-get (the testbed needs root anyway)" >&2
  fi
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ] && ! "$python" -m venv .venv; then
  # Debian's python3 ships venv separately.
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    rm -rf .venv
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    "$python" -m venv .venv
  else
    echo "setup: '$python -m venv' failed; install your distribution's venv package" >&2
    exit 1
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".${extras}"
