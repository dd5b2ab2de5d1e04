"""Seed 000's start scripts, as its write-up shows them, for a model's KeepAlive service on
the testbed: what the seed's team ran before mlx-medic, the peers measured against.

- `plain`: no sweep at all, `exec mlx.launch` (the service before the incident).
- `first-fix`: the pre-flight sweep the seed's team had first (seed 000, "Why the
  Existing Cleanup Missed This"): on every node `pgrep -f` the model's ranks, skip any whose
  parent is not pid 1, `kill` (SIGTERM) the rest; then `exec mlx.launch`.
- `final-fix`: the fix the write-up ends with (seed 000, "The Fix"): a PID-file lock; on
  every node in turn (the head locally, each peer over `ssh -o BatchMode=yes -o
  ConnectTimeout=5`) `pgrep -f` the model's server by its port and `kill -9` each match
  unless something listens on the port (`lsof`); clean the cache's `tmp*` entries; then
  `exec mlx.launch --backend jaccl`.

The seed matched `mlx-share-rank.py`/`serve.py` by `--tmpdir`/`--port`; here the ranks are
`mlx_lm server ... --port PORT`, so every pattern names the test's own port (a token no
process outside the test carries).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SeedFix = Literal["plain", "first-fix", "final-fix"]
SEED_FIXES: tuple[SeedFix, ...] = ("plain", "first-fix", "final-fix")

_HEAD = """\
#!/usr/bin/env bash
# Seed 000's {what}, as the service's start script (testbed/seed_fixes.py).
SHORT={short}
PORT={port}
CACHE_DIR={cache}
PEERS={peers}
"""
_LAUNCH = """\
exec {launch} --hostfile {hostfile} --backend jaccl --python {python}{starting_port} -- \\
    -m mlx_lm server --model {model} --host 127.0.0.1 --port $PORT
"""
_FIRST_FIX = """\
SWEEP='for pid in $(pgrep -f "mlx_lm server .*--port '$PORT'" 2>/dev/null); do
  [ "$(ps -o ppid= -p "$pid" | tr -d "[:space:]")" = "1" ] || continue
  echo "[preseed] cleanup: killing orphaned server pid=$pid"; kill "$pid" 2>/dev/null
done'
bash -c "$SWEEP"
for peer in $PEERS; do
    ssh -o BatchMode=yes -o ConnectTimeout=5 "$peer" "$SWEEP" || true
done
"""
_FINAL_FIX = """\
LOCKFILE="/tmp/mlx-preseed-${{SHORT}}.pid"
if [ -f "$LOCKFILE" ] && kill -0 "$(cat "$LOCKFILE" 2>/dev/null)" 2>/dev/null; then
    echo "[preseed] already running"
    exit 0
fi
echo "$$" > "$LOCKFILE"
SWEEP='if ! lsof -iTCP:'$PORT' -sTCP:LISTEN >/dev/null 2>&1; then
  for pid in $(pgrep -f "mlx_lm server .*--port '$PORT'" 2>/dev/null); do
    echo "[preseed] cleanup: killing orphaned server pid=$pid"; kill -9 "$pid" 2>/dev/null
  done
fi'
bash -c "$SWEEP"
for peer in $PEERS; do
    ssh -o BatchMode=yes -o ConnectTimeout=5 "$peer" "$SWEEP" || true
done
find "$CACHE_DIR" -maxdepth 1 -name 'tmp*' -exec rm -rf {{}} + 2>/dev/null || true
for peer in $PEERS; do
    ssh -o BatchMode=yes -o ConnectTimeout=5 "$peer" \\
        "find '${{CACHE_DIR}}' -maxdepth 1 -name 'tmp*' -exec rm -rf {{}} +" || true
done
rm -f "$LOCKFILE"
"""
_BODIES = {
    "plain": ("start script before the incident (no sweep)", ""),
    "first-fix": ("first fix (a ppid == 1 sweep with SIGTERM on every node)", _FIRST_FIX),
    "final-fix": (
        "final fix (lock, kill -9 sweep of every node unless the port listens, clean)",
        _FINAL_FIX,
    ),
}


@dataclass(frozen=True)
class SeedModel:
    """What a seed script names: the model, its port and launch, the nodes' cache dir."""

    short: str
    model: Path
    port: int
    hostfile: Path
    python: str  # the ranks' interpreter (the testbed's simulated-JACCL shim)
    launch: str  # mlx.launch
    cache: Path  # the cache dir as every node sees it
    peers: tuple[str, ...]  # ssh names of the nodes other than the head
    starting_port: int | None = None  # mlx.launch's --starting-port, when given


def seed_script(fix: SeedFix, model: SeedModel) -> str:
    """The start script of one of the seed's fixes, for `model`."""
    if fix not in _BODIES:
        raise ValueError(f"seed fix {fix!r}: one of {', '.join(SEED_FIXES)}")
    what, body = _BODIES[fix]
    values = {
        "short": shlex.quote(model.short),
        "port": model.port,
        "cache": shlex.quote(str(model.cache)),
        "peers": shlex.quote(" ".join(model.peers)),
        "what": what,
    }
    launch = _LAUNCH.format(
        launch=shlex.quote(model.launch),
        hostfile=shlex.quote(str(model.hostfile)),
        python=shlex.quote(model.python),
        starting_port=(
            "" if model.starting_port is None else f" --starting-port {model.starting_port}"
        ),
        model=shlex.quote(str(model.model)),
    )
    return _HEAD.format(**values) + body.format() + launch


def write_seed_script(path: Path, fix: SeedFix, model: SeedModel) -> Path:
    path.write_text(seed_script(fix, model))
    path.chmod(0o755)
    return path


__all__ = ["SEED_FIXES", "SeedFix", "SeedModel", "seed_script", "write_seed_script"]
