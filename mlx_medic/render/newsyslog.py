"""newsyslog.d entries (macOS) rotating every log file a rendered launchd job writes:
`newsyslog/NODE/mlx-medic.conf` for each node (its exporter's logs and those of the models
it heads) and `newsyslog/mlx-medic-remediator.conf` for the remediator's host. The files
come from the launchd target's own jobs, so a job's log cannot go unrotated.

newsyslog renames `x.log` to `x.log.0` (older ones shift to `.1`, ...) and creates an
empty `x.log`, with the entry's owner and mode (newsyslog.conf(5)). What happens next:
- the exporter and the remediator write their log themselves (`--log.file`): their next
  line goes to the new `x.log` (Python's WatchedFileHandler reopens a renamed file);
- a model's serve wrapper writes through the files launchd opened when it spawned the job
  (launchd.plist(5): StandardOutPath is mapped to the job's stdout), so it keeps writing
  to `x.log.0` until it respawns; so does a crash's traceback on launchd's stderr file.
Hence flag N: there is no process to signal. And no compression flag: a compressed
archive replaces `.0`, and what a job still writes there would go to a deleted file;
uncompressed, the logs collector reads it to the end (exporter/log_follower.py follows a
renamed file by its descriptor) and then the new file.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from mlx_medic.render import launchd, services
from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site

TARGET = "newsyslog"
FILE_NAME = "mlx-medic.conf"  # a node's, as installed in /etc/newsyslog.d/
REMEDIATOR_FILE_NAME = "mlx-medic-remediator.conf"  # the remediator's host's
MODE = "644"
COUNT = services.ARCHIVES_KEPT
SIZE_KB = services.ROTATE_AT_MIB * 1024
HEADER = "# logfilename          [owner:group] mode count size(KB) when flags"


def _entry(path: str, owner: str | None, where: str) -> str:
    """One log's line. `owner`: the job's user, who must be able to write the new file
    newsyslog creates (root's when None)."""
    if any(c.isspace() for c in path) or not path.isprintable():
        raise RenderError(f"{where}: {path!r}: newsyslog fields are split on whitespace")
    name = path.replace("#", "\\#")
    fields = [name, *([f"{owner}:"] if owner else []), MODE, str(COUNT), str(SIZE_KB), "*", "N"]
    return "  ".join(fields)


def render(site: Site) -> list[Rendered]:
    per_host: dict[str | None, dict[str, str]] = {}  # host -> log path -> its entry
    for job in launchd.jobs(site):
        entries = per_host.setdefault(job.host, {})
        for log in job.log_files():
            entries.setdefault(log, _entry(log, job.user, job.logs_field))
    files = []
    for host, entries in per_host.items():
        if host is None:
            what, path = "The remediator's host: its logs", PurePosixPath(REMEDIATOR_FILE_NAME)
        else:
            what = f"Node {host}: its exporter's logs and the service logs of the models it heads"
            path = PurePosixPath(host) / FILE_NAME
        text = (
            f"# {GENERATED}\n# {what}.\n# Install as /etc/newsyslog.d/{path.name}.\n"
            f"{HEADER}\n" + "\n".join(entries.values()) + "\n"
        )
        files.append(Rendered(PurePosixPath(TARGET) / path, text))
    return files
