"""Process-wide logging: plain text for people, JSON lines for log shippers."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from mlx_medic.command_line import CommandError

CHATTY_LIBRARY = "asyncssh"


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `extra={...}` fields are kept."""

    _skip = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in self._skip and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(
    log_format: str = "text", log_file: Path | None = None, level: str = "info"
) -> None:
    """Every log line to stderr, or appended to `log_file`: a WatchedFileHandler reopens it
    when newsyslog or logrotate has renamed it, so no signal is needed after a rotation."""
    handler: logging.Handler
    if log_file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        # here: logging.handlers brings socket, pickle and queue into every node helper
        from logging.handlers import WatchedFileHandler

        try:
            handler = WatchedFileHandler(log_file, encoding="utf-8")
        except OSError as exc:
            raise CommandError(
                f"--log.file {log_file}: cannot open: {exc.strerror or exc}"
            ) from None
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    least = logging.getLevelName(level.upper())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(least)
    # asyncssh logs every connection and channel at INFO: one line per helper call would
    # bury ours (the doctor's report, the remediator's log); its warnings still show, and
    # --log.level debug shows it all.
    chatty = least if least <= logging.DEBUG else max(least, logging.WARNING)
    logging.getLogger(CHATTY_LIBRARY).setLevel(chatty)
