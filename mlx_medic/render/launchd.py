"""launchd jobs (macOS): every node's exporter, each wrapper model's service on its head,
and the remediator. Written with plistlib, so the XML is what launchd parses.

launchd hands a job its StandardOutPath and StandardErrorPath as open files when it
spawns the job (launchd.plist(5): the path "should be mapped to the job's stdout", made
with the UserName's ownership if missing), so a job writes to them until it respawns.
The exporter and the remediator therefore write their log themselves (`--log.file`,
reopened once newsyslog has renamed it) and leave launchd's stderr file only what Python
prints outside logging (a crash's traceback). Every file a job writes is rotated by the
newsyslog target, which reads them from the jobs built here (`jobs`).
"""

from __future__ import annotations

import plistlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import PurePosixPath
from typing import Any

from mlx_medic.render import services
from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site
from mlx_medic.state.layout import REMEDIATOR_STATE_DIR

TARGET = "launchd"
EXPORTER_LOG = "/var/log/mlx-medic-exporter.log"  # its --log.file
EXPORTER_STDERR = "/var/log/mlx-medic-exporter.stderr.log"  # launchd's StandardErrorPath
REMEDIATOR_LOG = str(REMEDIATOR_STATE_DIR / "remediator.log")
REMEDIATOR_STDERR = str(REMEDIATOR_STATE_DIR / "remediator.stderr.log")


@dataclass(frozen=True)
class Job:
    """One launchd job: its plist's keys, the comment above them and where it goes."""

    host: str | None  # the node it is installed on; None: the remediator's host
    file_name: str
    plist: dict[str, Any]
    comment: str
    fields: dict[str, str]  # the inventory's values the comment quotes, by field
    logs_field: str  # what names its log files, for an error about one of them

    @property
    def path(self) -> PurePosixPath:
        """Relative to the target's folder: NODE/FILE, or FILE for the remediator's host."""
        return PurePosixPath(*([self.host] if self.host else []), self.file_name)

    @property
    def user(self) -> str | None:
        """The user it runs as (UserName); None: root."""
        user: str | None = self.plist.get("UserName")
        return user

    def log_files(self) -> list[str]:
        """Every file the job writes a log to: the process's own `--log.file`, then
        launchd's StandardErrorPath and StandardOutPath."""
        argv = self.plist["ProgramArguments"]
        own = [value for flag, value in pairwise(argv) if flag == "--log.file"]
        launchd = [self.plist.get("StandardErrorPath"), self.plist.get("StandardOutPath")]
        return list(dict.fromkeys(p for p in [*own, *launchd] if p))


def _plist(job: Job) -> str:
    """The job as XML under its comment; names the inventory's field whose value holds
    `--`, which an XML comment cannot."""
    text = plistlib.dumps(job.plist, sort_keys=False).decode()
    head, _, body = text.partition("<plist")
    note = "\n     ".join(f"{GENERATED}\n{job.comment}".splitlines())
    if "--" in note:
        field, value = next(
            ((f, v) for f, v in job.fields.items() if "--" in v), ("the comment", note)
        )
        raise RenderError(
            f"{field}: {value!r} holds '--', which the launchd job's comment"
            " (XML) cannot; choose a name without it"
        )
    return f"{head}<!-- {note} -->\n<plist{body}"


def _exporters(site: Site) -> Iterator[Job]:
    for node in site.inventory.nodes:
        plist = {
            "Label": services.EXPORTER_LABEL,
            "ProgramArguments": services.exporter_argv(node, EXPORTER_LOG),
            "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
            "RunAtLoad": True,
            "KeepAlive": True,
            "ThrottleInterval": services.THROTTLE_SECONDS,
            "StandardErrorPath": EXPORTER_STDERR,
        }
        comment = (
            f"The exporter of node {node.name}. Install root:wheel 0644 as\n"
            f"/Library/LaunchDaemons/{services.EXPORTER_LABEL}.plist, then\n"
            f"  sudo launchctl bootstrap system /Library/LaunchDaemons/"
            f"{services.EXPORTER_LABEL}.plist\n"
            "Runs as root: reading other users' process states needs it. It writes its log\n"
            f"to {EXPORTER_LOG} itself (log.file, below), reopened once\n"
            f"newsyslog renamed it; {EXPORTER_STDERR} takes only what\n"
            "Python prints outside it (a crash's traceback)."
        )
        yield Job(
            node.name,
            f"{services.EXPORTER_LABEL}.plist",
            plist,
            comment,
            {f"nodes.{node.name}": node.name},
            "the exporter's log files",
        )


def _models(site: Site) -> Iterator[Job]:
    for model in services.wrapper_models(site.inventory, "launchd"):
        service = model.service
        stdout, stderr = services.log_paths(model)
        plist: dict[str, Any] = {
            "Label": service.label,
            "ProgramArguments": services.serve_argv(site.inventory, model),
            "EnvironmentVariables": services.environment(model),
        }
        if service.user is not None:
            plist["UserName"] = service.user
        plist |= {
            "RunAtLoad": True,
            "KeepAlive": True,
            "ThrottleInterval": services.THROTTLE_SECONDS,
            "ExitTimeOut": services.stop_bound(model),
            "StandardOutPath": stdout,
            "StandardErrorPath": stderr,
        }
        comment = (
            f"Model {model.name} on its head {model.head}: the serve wrapper. Install\n"
            f"root:wheel 0644 as {service.plist_path} (the path the remediator's\n"
            "`sudo -n launchctl bootstrap` loads). ExitTimeOut: SIGKILL only after the\n"
            "wrapper's own teardown bound (policy.stop_timeout,"
            f" {model.policy.stop_timeout:g} s) has passed."
        )
        named = ("plist", str(service.plist)) if service.plist else ("label", service.label)
        fields = {
            f"models.{model.name}": model.name,
            f"nodes.{model.head}": model.head,
            f"models.{model.name}.service.{named[0]}": named[1],
        }
        yield Job(
            model.head,
            service.plist_path.name,
            plist,
            comment,
            fields,
            f"models.{model.name}.log_files",
        )


def _remediator(site: Site) -> Job:
    plist = {
        "Label": services.REMEDIATOR_LABEL,
        "ProgramArguments": services.remediator_argv(site.remediator_command, REMEDIATOR_LOG),
        "EnvironmentVariables": services.remediator_environment(site.remediator_config),
        "UserName": site.remediator_user,
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": services.THROTTLE_SECONDS,
        "ExitTimeOut": 60,
        "StandardErrorPath": REMEDIATOR_STDERR,
    }
    comment = (
        "The remediator, on the Mac beside Alertmanager. Install root:wheel 0644 as\n"
        f"/Library/LaunchDaemons/{services.REMEDIATOR_LABEL}.plist; create its user\n"
        f"(UserName) and its own dir {REMEDIATOR_STATE_DIR} (owned by it, 0755: its\n"
        "journal and its logs, never a node's state dir); then\n"
        f"  sudo launchctl bootstrap system /Library/LaunchDaemons/{services.REMEDIATOR_LABEL}"
        ".plist\n"
        "MLX_MEDIC_CONFIG names its config, where the on-call commands (pause, resume,\n"
        "log, remediate) find it too. ExitTimeOut 60: SIGTERM lets a run finish its step\n"
        "and release the model lock. It writes remediator.log itself (log.file, below),\n"
        "reopened once newsyslog renamed it; remediator.stderr.log takes only what Python\n"
        "prints outside it (a crash's traceback)."
    )
    return Job(
        None,
        f"{services.REMEDIATOR_LABEL}.plist",
        plist,
        comment,
        {},
        "the remediator's log files",
    )


def jobs(site: Site) -> list[Job]:
    """Every job this target renders: each node's exporter, each launchd model's serve
    wrapper on its head, the remediator."""
    return [*_exporters(site), *_models(site), _remediator(site)]


def render(site: Site) -> list[Rendered]:
    return [Rendered(PurePosixPath(TARGET) / job.path, _plist(job)) for job in jobs(site)]
