"""Logging for the code a node helper runs: the logging package is imported, and set up as
the command asked, only when something is logged.

Why: the remediator starts a node helper over SSH on every step of every run, and
importing logging is about a tenth of a helper's start (30 M instructions, under callgrind,
of a `node lock` helper's 240 M); a helper logs only when something is off. Long-running
commands (the exporter, the remediator, serve) set logging up at their start as before
(mlx_medic.logs); for them `logger` is `logging.getLogger`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

_pending: tuple[str, Path | None, str] | None = None


def set_up_on_first_use(log_format: str, log_file: Path | None, level: str) -> None:
    """Keep `mlx_medic.logs.setup_logging`'s arguments for the first `logger` call."""
    global _pending
    _pending = (log_format, log_file, level)


def logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)`, after the set-up a helper's start left for it, if any."""
    global _pending
    import logging

    if _pending is not None:
        from mlx_medic.logs import setup_logging

        settings, _pending = _pending, None
        setup_logging(*settings)
    return logging.getLogger(name)
