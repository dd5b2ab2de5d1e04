"""Debian's headless Chromium, as the tests and the demo's pictures load a page: a fresh
profile per call, no sandbox (root), nothing fetched but the page itself."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

from testbed.cluster import TestbedError

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium(
    url: str, profiles: Path, *mode: str, size: str = "1280,900"
) -> subprocess.CompletedProcess[str]:
    """Chromium on `url` with `mode` (`--dump-dom`, `--screenshot=FILE`, ...) at the window
    `size` ("WIDTH,HEIGHT"), its profile a new directory under `profiles`."""
    binary = shutil.which("chromium")
    if binary is None:
        raise TestbedError("chromium is not installed (scripts/setup.sh --test installs it)")
    profile = profiles / f"chromium-{uuid.uuid4().hex[:8]}"
    return subprocess.run(
        [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}", *mode, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
