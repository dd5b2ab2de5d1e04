"""systemd units (Linux): every node's exporter, each wrapper model whose manager is
systemd, and the remediator.

The exporter's and the remediator's units log to the journal, which journald rotates
itself; a model's unit appends to its `log_files` (where the logs collector reads), which
no rendered file rotates.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from mlx_medic.render import services, tmpfiles
from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site
from mlx_medic.state.layout import REMEDIATOR_STATE_DIRECTORY

TARGET = "systemd"
_PLAIN = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
# The exporter's and the remediator's units set no StandardOutput=: their log is in the
# journal, which journald bounds itself (journald.conf(5): SystemMaxUse=, ...).
JOURNAL_NOTE = "Its log is in the journal, rotated by journald (journalctl -u "


def quote(word: str) -> str:
    """One ExecStart/Environment word as systemd reads it: `%` and `$` doubled (specifiers,
    variables), anything beyond plain characters in double quotes."""
    word = word.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def output_path(path: str, where: str) -> str:
    """A path after `append:`: taken to the end of the line, specifiers expanded, no quotes."""
    if any(c.isspace() for c in path) or not path.isprintable():
        raise RenderError(f"{where}: {path!r}: systemd's append: takes no spaces")
    return path.replace("%", "%%")


def _comment(text: str) -> str:
    return "".join(f"# {line}\n" for line in f"{GENERATED}\n{text}".splitlines())


def _unit(comment: str, description: str, service: list[str]) -> str:
    return (
        _comment(comment) + f"[Unit]\nDescription={description}\nAfter=network-online.target\n"
        "Wants=network-online.target\n\n[Service]\n"
        + "".join(f"{line}\n" for line in service)
        + "\n[Install]\nWantedBy=multi-user.target\n"
    )


def _exec(argv: list[str]) -> str:
    return "ExecStart=" + " ".join(quote(word) for word in argv)


def _environment(variables: dict[str, str]) -> str:
    return "Environment=" + " ".join(quote(f"{k}={v}") for k, v in variables.items())


def _exporters(site: Site) -> list[Rendered]:
    files = []
    for node in site.inventory.nodes:
        comment = (
            f"The exporter of node {node.name}. Install in /etc/systemd/system, with\n"
            f"tmpfiles.d/{tmpfiles.CONF_NAME} beside it (the state dir, its login user's), then\n"
            "  systemctl enable --now mlx-medic-exporter\n"
            "No StateDirectory=: systemd would give the state dir to root at every start.\n"
            "ReadWritePaths= with '-': a state dir not made yet does not stop the unit.\n"
            f"{JOURNAL_NOTE}mlx-medic-exporter)."
        )
        service = [
            _exec(services.exporter_argv(node)),
            "Restart=always",
            "RestartSec=5",
            "NoNewPrivileges=true",
            "ProtectSystem=strict",
            f"ReadWritePaths=-{quote(str(site.inventory.state_dir))}",
            "UMask=0027",
        ]
        text = _unit(comment, "mlx-medic exporter", service)
        files.append(
            Rendered(PurePosixPath(TARGET) / node.name / "mlx-medic-exporter.service", text)
        )
        files.append(tmpfiles.rendered(site.inventory, node, TARGET))
    return files


def _models(site: Site) -> list[Rendered]:
    files = []
    for model in services.wrapper_models(site.inventory, "systemd"):
        stdout, stderr = services.log_paths(model)
        where = f"models.{model.name}.log_files"
        service = [
            *([f"User={model.service.user}"] if model.service.user else []),
            _environment(services.environment(model)),
            _exec(services.serve_argv(site.inventory, model)),
            "Restart=always",
            f"RestartSec={services.THROTTLE_SECONDS}",
            # SIGTERM to the wrapper alone: it takes its ranks down itself; what is left
            # when TimeoutStopSec runs out is SIGKILLed, the whole cgroup.
            "KillMode=mixed",
            "KillSignal=SIGTERM",
            f"TimeoutStopSec={services.stop_bound(model)}",
            f"StandardOutput=append:{output_path(stdout, where)}",
            f"StandardError=append:{output_path(stderr, where)}",
        ]
        comment = (
            f"Model {model.name} on its head {model.head}: the serve wrapper. Install in\n"
            f"/etc/systemd/system as {services.unit_name(model.service.label)}.\n"
            "TimeoutStopSec: SIGKILL only after the wrapper's own teardown bound\n"
            f"(policy.stop_timeout, {model.policy.stop_timeout:g} s) has passed."
        )
        text = _unit(comment, f"mlx-medic serve {model.name}", service)
        path = services.head_dir(TARGET, model) / services.unit_name(model.service.label)
        files.append(Rendered(path, text))
    return files


def _remediator(site: Site) -> Rendered:
    comment = (
        "The remediator beside Alertmanager. Install in /etc/systemd/system, then\n"
        "  systemctl enable --now mlx-medic-remediator\n"
        f"Its config is {site.remediator_config}: on this host the on-call commands\n"
        "(mlx-medic pause, resume, log, remediate) find it there without --config.file,\n"
        "and so the journal it names (MLX_MEDIC_CONFIG below). Moved elsewhere: render again\n"
        "with --remediator.config and set the same variable for on-call shells, else they\n"
        "refuse (no config at the default path). Under sudo they write the journal as its\n"
        "owner (User= below), never as root.\n"
        f"Its state dir is its own, /var/lib/{REMEDIATOR_STATE_DIRECTORY} (the config's\n"
        "journal), never a node's: two units with one StateDirectory= re-own it in turn.\n"
        f"{JOURNAL_NOTE}mlx-medic-remediator)."
    )
    service = [
        _environment(services.remediator_environment(site.remediator_config)),
        _exec(services.remediator_argv(site.remediator_command)),
        "# SIGTERM lets a run finish its step and release the model lock.",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=60",
        "Restart=on-failure",
        "RestartSec=5",
        f"User={site.remediator_user}",
        f"StateDirectory={REMEDIATOR_STATE_DIRECTORY}",
        "StateDirectoryMode=0755",  # searchable; the journal's files are 0640 (UMask too)
        "UMask=0027",
        "NoNewPrivileges=true",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "PrivateTmp=true",
    ]
    text = _unit(comment, "mlx-medic remediator (Alertmanager webhook)", service)
    return Rendered(PurePosixPath(TARGET) / "mlx-medic-remediator.service", text)


def render(site: Site) -> list[Rendered]:
    return [*_exporters(site), *_models(site), _remediator(site)]
