#!/usr/bin/env bash
# Install what mlx-medic needs into a Python venv in .venv (Python 3.11 or later), always in full
# (scripts/run-exporter.sh calls it only when .venv is not current: scripts/venv-stamp.sh).
#   scripts/setup.sh                the exporter/remediator only
#   scripts/setup.sh --test-python  also the Python test dependencies (the [test] extras:
#                                   MLX, pytest, ruff, mypy); no apt-get, no root needed
#   scripts/setup.sh --test         the same, and on Debian 12 as root Debian's sshd,
#                                   Prometheus, Alertmanager, process-exporter, supervisord,
#                                   Chromium, sudo, systemd and logrotate (visudo,
#                                   `sudo -l`, systemd-analyze, logrotate check the
#                                   rendered files)
#   scripts/setup.sh --help         this text
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^[^#]/s/^# \{0,1\}//p' scripts/setup.sh; }

apt=false
case "$#:${1:-}" in
  0:) installed=base ;;
  1:--test-python) installed=test ;;
  1:--test) installed=test apt=true ;;
  1:--help | 1:-h) usage && exit 0 ;;
  *)
    echo "setup: '$*' is not a mode: expected no argument, --test-python or --test" >&2
    usage >&2
    exit 2
    ;;
esac
extras=""
[ "$installed" = test ] && extras="[test]"

if $apt; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openssh-server openssh-client prometheus prometheus-alertmanager \
      prometheus-process-exporter prometheus-node-exporter supervisor chromium procps lsof \
      iproute2 util-linux wrk sudo systemd logrotate e2fsprogs \
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
. scripts/venv-stamp.sh
# An install cut short leaves no stamp, so the next scripts/run-exporter.sh installs again.
rm -f "$venv_stamp_file"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".${extras}"
venv_write_stamp "$installed"
