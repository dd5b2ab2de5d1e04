"""launchd jobs (macOS): every node's exporter, each wrapper model's service on its head,
and the remediator. Written with plistlib, so the XML is what launchd parses."""

from __future__ import annotations

import plistlib
from pathlib import PurePosixPath
from typing import Any

from mlx_medic.render import services
from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site
from mlx_medic.state.layout import REMEDIATOR_STATE_DIR

TARGET = "launchd"


def _plist(job: dict[str, Any], comment: str, fields: dict[str, str] | None = None) -> str:
    """The job as XML under its comment; `fields`: the inventory's values (by field) the
    comment quotes, to name the one that holds `--`, which an XML comment cannot."""
    text = plistlib.dumps(job, sort_keys=False).decode()
    head, _, body = text.partition("<plist")
    note = "\n     ".join(f"{GENERATED}\n{comment}".splitlines())
    if "--" in note:
        field, value = next(
            ((f, v) for f, v in (fields or {}).items() if "--" in v), ("the comment", note)
        )
        raise RenderError(
            f"{field}: {value!r} holds '--', which the launchd job's comment"
            " (XML) cannot; choose a name without it"
        )
    return f"{head}<!-- {note} -->\n<plist{body}"


def _exporter(site: Site) -> list[Rendered]:
    files = []
    for node in site.inventory.nodes:
        job = {
            "Label": services.EXPORTER_LABEL,
            "ProgramArguments": services.exporter_argv(node),
            "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
            "RunAtLoad": True,
            "KeepAlive": True,
            "ThrottleInterval": services.THROTTLE_SECONDS,
            "StandardErrorPath": "/var/log/mlx-medic-exporter.log",
        }
        comment = (
            f"The exporter of node {node.name}. Install root:wheel 0644 as\n"
            f"/Library/LaunchDaemons/{services.EXPORTER_LABEL}.plist, then\n"
            f"  sudo launchctl bootstrap system /Library/LaunchDaemons/"
            f"{services.EXPORTER_LABEL}.plist\n"
            "Runs as root: reading other users' process states needs it."
        )
        path = PurePosixPath(TARGET) / node.name / f"{services.EXPORTER_LABEL}.plist"
        files.append(Rendered(path, _plist(job, comment, {f"nodes.{node.name}": node.name})))
    return files


def _models(site: Site) -> list[Rendered]:
    files = []
    for model in services.wrapper_models(site.inventory, "launchd"):
        service = model.service
        stdout, stderr = services.log_paths(model)
        job: dict[str, Any] = {
            "Label": service.label,
            "ProgramArguments": services.serve_argv(site.inventory, model),
            "EnvironmentVariables": services.environment(model),
        }
        if service.user is not None:
            job["UserName"] = service.user
        job |= {
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
        path = services.head_dir(TARGET, model) / service.plist_path.name
        named = ("plist", str(service.plist)) if service.plist else ("label", service.label)
        fields = {
            f"models.{model.name}": model.name,
            f"nodes.{model.head}": model.head,
            f"models.{model.name}.service.{named[0]}": named[1],
        }
        files.append(Rendered(path, _plist(job, comment, fields)))
    return files


def _remediator(site: Site) -> Rendered:
    job = {
        "Label": services.REMEDIATOR_LABEL,
        "ProgramArguments": services.remediator_argv(site.remediator_command),
        "EnvironmentVariables": services.remediator_environment(site.remediator_config),
        "UserName": site.remediator_user,
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": services.THROTTLE_SECONDS,
        "ExitTimeOut": 60,
        "StandardErrorPath": str(REMEDIATOR_STATE_DIR / "remediator.log"),
    }
    comment = (
        "The remediator, on the Mac beside Alertmanager. Install root:wheel 0644 as\n"
        f"/Library/LaunchDaemons/{services.REMEDIATOR_LABEL}.plist; create its user\n"
        f"(UserName) and its own dir {REMEDIATOR_STATE_DIR} (owned by it, 0755: its\n"
        "journal and this log, never a node's state dir); then\n"
        f"  sudo launchctl bootstrap system /Library/LaunchDaemons/{services.REMEDIATOR_LABEL}"
        ".plist\n"
        "MLX_MEDIC_CONFIG names its config, where the on-call commands (pause, resume,\n"
        "log, remediate) find it too. ExitTimeOut 60: SIGTERM lets a run finish its step\n"
        "and release the model lock."
    )
    return Rendered(
        PurePosixPath(TARGET) / f"{services.REMEDIATOR_LABEL}.plist", _plist(job, comment)
    )


def render(site: Site) -> list[Rendered]:
    return [*_exporter(site), *_models(site), _remediator(site)]
