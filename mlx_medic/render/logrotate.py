"""logrotate.d rules (Linux) for the log files of the systemd models each node heads:
`logrotate/NODE/mlx-medic`.

A systemd model unit appends the serve wrapper's output to its `log_files`
(`StandardOutput=append:`, systemd.exec(5)): systemd opened them once, so a rename would
leave the service writing to the renamed file. `copytruncate` copies the log to `x.1` and
truncates it in place; the service's descriptor has O_APPEND, so its next line lands at
the start of the emptied file, and the logs collector reads the rest of a truncated log
from the copy beside it (exporter/log_follower.py). No compression: the copy stays
readable as it is. The exporter's and the remediator's own units log to the journal,
which journald rotates; launchd's logs are newsyslog's and supervisord rotates its own.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from mlx_medic.render import services
from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site

TARGET = "logrotate"
FILE_NAME = "mlx-medic"  # as installed in /etc/logrotate.d/
SETTINGS = (
    f"size {services.ROTATE_AT_MIB}M",
    f"rotate {services.ARCHIVES_KEPT}",
    "copytruncate",
    "nocompress",
    "missingok",
    "notifempty",
)


def _path(path: str, where: str) -> str:
    if not path.startswith("/") or not path.isprintable() or any(c in path for c in ' "{}'):
        raise RenderError(f"{where}: {path!r}: logrotate needs an absolute path without spaces")
    return path


def render(site: Site) -> list[Rendered]:
    per_head: dict[str, dict[str, str]] = {}  # head -> log path -> the model it is for
    for model in services.wrapper_models(site.inventory, "systemd"):
        where = f"models.{model.name}.log_files"
        for log in services.log_paths(model):
            per_head.setdefault(model.head, {}).setdefault(_path(log, where), model.name)
    files = []
    for head, logs in per_head.items():
        models = ", ".join(dict.fromkeys(logs.values()))
        rule = " ".join(logs) + " {\n" + "".join(f"    {s}\n" for s in SETTINGS) + "}\n"
        text = (
            f"# {GENERATED}\n# Node {head}: the log files of the systemd models it heads"
            f" ({models}).\n# Install as /etc/logrotate.d/{FILE_NAME} (root, 0644).\n{rule}"
        )
        files.append(Rendered(PurePosixPath(TARGET) / head / FILE_NAME, text))
    return files
