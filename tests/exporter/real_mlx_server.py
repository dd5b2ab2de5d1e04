"""A real `mlx_lm.server` serving the tiny model on 127.0.0.1, started and
stopped by pid (never by name)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mlx_medic.health import probe_model
from testbed.net import free_port
from testbed.processes import stop_child

START_TIMEOUT = 180.0  # loading is a few seconds; the machine is shared


@dataclass
class RealServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def stop(self) -> None:
        """SIGTERM then SIGKILL to this pid only, and reap it."""
        stop_child(self.process)


@contextlib.contextmanager
def mlx_lm_server(model: Path, log_path: Path) -> Iterator[RealServer]:
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlx_lm",
                "server",
                "--model",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = RealServer(process, port, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"mlx_lm.server exited with {process.returncode}:\n"
                    + log_path.read_text(errors="replace")[-3000:]
                )
            if probe_model("127.0.0.1", port, timeout=10).up:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlx_lm.server did not serve within {START_TIMEOUT:g}s:\n"
                    + log_path.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.5)
        yield server
    finally:
        server.stop()
