"""This platform's process table: /proc on Linux, psutil + `ps` on macOS.

The factory lives with the tables, not in the process model (`mlx_medic.processes.info`):
the tables build on the process model, and the model stays a leaf that imports no
platform code.
"""

from __future__ import annotations

import sys

from mlx_medic.processes.info import ProcessTable
from mlx_medic.processes.roles import Classifier, classify


def system_process_table(classifier: Classifier = classify) -> ProcessTable:
    """The table for this platform (only the chosen one is imported); `classifier` gives
    each process its role (with the inventory's process patterns: `processes.roles.classifier`)."""
    if sys.platform.startswith("linux"):
        from mlx_medic.platform.proc_linux import LinuxProcessTable

        return LinuxProcessTable(classifier=classifier)
    if sys.platform == "darwin":
        from mlx_medic.platform.proc_macos import MacProcessTable

        return MacProcessTable(classifier=classifier)
    raise RuntimeError(f"no process table for platform {sys.platform!r} (Linux and macOS only)")
