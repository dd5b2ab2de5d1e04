"""newsyslog.d entries (macOS) rotating each launchd model's log files on its head.

newsyslog renames `x.log` to `x.log.0` (older ones shift to `.1`, ...) and creates an
empty `x.log` (newsyslog.conf(5)). A launchd job keeps writing to the renamed file until
it respawns (launchd opens StandardOutPath at spawn, macos-facts.md §1), so:
- flag N: there is no process to signal (launchd owns the descriptors);
- no compression flag: a compressed archive replaces `.0`, and what the job still writes
  there would go to a deleted file; uncompressed, the logs collector reads it to the end
  (exporter/log_follower.py follows a renamed file by its descriptor) and then the new file.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site

TARGET = "newsyslog"
FILE_NAME = "mlx-medic.conf"
MODE = "644"
COUNT = 7  # archives kept
SIZE_KB = 102400  # rotate past 100 MiB
HEADER = "# logfilename          [owner:group] mode count size(KB) when flags"


def _entry(path: str, owner: str | None, where: str) -> str:
    if any(c.isspace() for c in path) or not path.isprintable():
        raise RenderError(f"{where}: {path!r}: newsyslog fields are split on whitespace")
    name = path.replace("#", "\\#")
    fields = [name, *([f"{owner}:"] if owner else []), MODE, str(COUNT), str(SIZE_KB), "*", "N"]
    return "  ".join(fields)


def render(site: Site) -> list[Rendered]:
    per_head: dict[str, list[str]] = {}
    for model in site.inventory.models:
        if model.service.manager != "launchd":
            continue
        for path in dict.fromkeys(str(p) for p in model.log_files):
            entry = _entry(path, model.service.user, f"models.{model.name}.log_files")
            per_head.setdefault(model.head, []).append(entry)
    files = []
    for head, entries in per_head.items():
        text = (
            f"# {GENERATED}\n# Node {head}: the service logs of the models it heads. Install"
            f" as /etc/newsyslog.d/{FILE_NAME}.\n{HEADER}\n" + "\n".join(entries) + "\n"
        )
        files.append(Rendered(PurePosixPath(TARGET) / head / FILE_NAME, text))
    return files
