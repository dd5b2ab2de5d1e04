"""`mlx-medic render TARGET --inventory INVENTORY --out DIR`: deployment files."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_medic.command_line import (
    EXIT_FAILED,
    CommandError,
    add_inventory_flag,
    file_error,
)

TARGETS = {  # name -> module under mlx_medic.render; `all` renders each in this order
    "launchd": "launchd",
    "systemd": "systemd",
    "supervisord": "supervisord",
    "sudoers": "sudoers",
    "authorized-keys": "authorized_keys",
    "newsyslog": "newsyslog",
    "logrotate": "logrotate",
    "prometheus": "prometheus",
    "alertmanager": "alertmanager",
    "rules": "rules",
}
KEYS_TARGET = "authorized-keys"  # the target that reads the public keys


@dataclass(frozen=True)
class Required:
    """A flag some targets cannot render without, and which."""

    flag: str  # as written, with its metavar
    targets: tuple[str, ...] = ()  # () for every target

    def needed_by(self, names: Iterable[str]) -> list[str]:
        """Those of the chosen targets that need it."""
        return [n for n in names if not self.targets or n in self.targets]

    def note(self) -> str:
        """What `--help` says of it."""
        return f"(required for {', '.join(self.targets)})" if self.targets else "(required)"


# The one table of required flags (argparse dest -> what needs it): the start-up check
# names every one missing for the chosen targets, and `--help` marks each from it.
REQUIRED = {
    "inventory": Required("--inventory FILE"),
    "out": Required("--out DIR"),
    "remediator_url": Required("--remediator.url URL", ("prometheus", "alertmanager")),
    "alertmanager": Required("--alertmanager.address HOST:PORT", ("prometheus",)),
}

DESCRIPTION = """\
Render deployment files from the inventory into DIR (each target in a folder of its own:
launchd/NODE/..., systemd/NODE/..., sudoers/NODE/mlx-medic, ...; prometheus.yml,
alertmanager.yml and rules/ at the top).

--inventory names the one file that says what runs where (nodes, users, labels, log
files, timeouts): every rendered file is made from it, and the exporter, the serve
wrapper and the node helpers read it on every node (nodes.*.medic_config). The
remediator's own config is another file (--remediator.config, default below). What the
inventory cannot know is given by flags: where the remediator and Alertmanager run, and
the remediator's and the serve wrappers' public keys. A flag the chosen targets need and
that is missing stops render before anything is written, with every missing one named
(exit 2); so does a value they cannot use. --config.file is still read as --inventory
(deprecated: it names the remediator's config elsewhere).

The inventory does not say which nodes run macOS or Linux: launchd and systemd each
render an exporter job for every node (install the one for the node's system); a model's
own service is rendered by its service.manager's target only. Every log file a launchd
job writes is rotated by newsyslog (the newsyslog target), supervisord rotates its
programs' logs itself, and the systemd units of the exporter and the remediator log to
the journal."""


def _help(text: str, dest: str) -> str:
    return f"{text} {REQUIRED[dest].note()}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("target", choices=[*TARGETS, "all"])
    add_inventory_flag(
        parser, _help("the inventory YAML (check it: mlx-medic check-config FILE)", "inventory")
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=_help("directory to write into (made if missing; files replaced)", "out"),
    )
    parser.add_argument(
        "--remediator.url",
        dest="remediator_url",
        default=None,
        metavar="URL",
        help=_help(
            "the remediator as Alertmanager and Prometheus reach it, e.g."
            " https://remediator.example:10901",
            "remediator_url",
        ),
    )
    parser.add_argument(
        "--remediator.command",
        dest="remediator_command",
        default="/opt/mlx-medic/.venv/bin/mlx-medic",
        help="mlx-medic on the remediator's host (default %(default)s)",
    )
    parser.add_argument(
        "--remediator.user",
        dest="remediator_user",
        default="mlx-medic",
        help="the user the remediator runs as (default %(default)s)",
    )
    parser.add_argument(
        "--remediator.config",
        dest="remediator_config",
        default="/etc/mlx-medic/remediator.yml",
        help="the remediator's config on its host (default %(default)s)",
    )
    parser.add_argument(
        "--alertmanager.address",
        dest="alertmanager",
        default=None,
        metavar="HOST:PORT",
        help=_help("Alertmanager, as Prometheus reaches it", "alertmanager"),
    )
    parser.add_argument(
        "--alertmanager.credentials-file",
        dest="am_credentials",
        default="/etc/alertmanager/mlx-medic.token",
        help="the webhook token file on Alertmanager's host (default %(default)s)",
    )
    parser.add_argument(
        "--prometheus.credentials-file",
        dest="prom_credentials",
        default="/etc/prometheus/mlx-medic.token",
        help="the token file Prometheus scrapes the remediator with (default %(default)s)",
    )
    parser.add_argument(
        "--ssh.public-key",
        dest="public_key",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"the remediator's public key ({KEYS_TARGET}); default: the"
        " inventory's ssh.identity_file with .pub added",
    )
    parser.add_argument(
        "--serve.public-key",
        dest="serve_public_key",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"the serve wrappers' public key ({KEYS_TARGET}), for every model"
        " whose serve.identity_file is set; default: each model's"
        " serve.identity_file with .pub added",
    )
    parser.add_argument(
        "--rules.file",
        dest="rules_file",
        type=Path,
        default=None,
        help="the rule file to render (default: the rules shipped with"
        " mlx-medic, alerting-rules/mlx-medic.rules.yaml in a checkout)",
    )
    parser.add_argument(
        "--rules.for",
        dest="rules_for",
        action="append",
        default=[],
        metavar="ALERT=DURATION",
        help="override an alert's `for:` (repeat)",
    )
    parser.add_argument(
        "--rules.interval",
        dest="rules_interval",
        default=None,
        metavar="DURATION",
        help="every rule group's evaluation interval",
    )
    parser.add_argument(
        "--rules.held-for",
        dest="rules_held_for",
        default=None,
        metavar="DURATION",
        help="how long a pause, an open circuit or a node's drain may stay on before"
        " MLXMedicPausedTooLong, MLXMedicCircuitOpenTooLong and MLXMedicNodeDrainedTooLong"
        " warn (default 4h)",
    )
    parser.add_argument(
        "--prometheus.interval",
        dest="prometheus_interval",
        default=None,
        metavar="DURATION",
        help="Prometheus's scrape and evaluation interval (default 15s)",
    )
    parser.add_argument(
        "--alertmanager.group-wait",
        dest="am_group_wait",
        default=None,
        metavar="DURATION",
        help="every route's group_wait (default 10s for"
        " the remediator's routes, 30s for on-call's)",
    )
    parser.add_argument(
        "--alertmanager.group-interval",
        dest="am_group_interval",
        default=None,
        metavar="DURATION",
        help="every route's group_interval"
        " (default 1m for the remediator's routes, 5m for on-call's)",
    )
    parser.add_argument(
        "--alertmanager.oncall-url",
        dest="oncall_url",
        default=None,
        metavar="URL",
        help="on-call's webhook (default a placeholder: your pager)",
    )


def _read_key(path: Path, setting: str, default: str, problems: list[str]) -> str | None:
    """The public key line in `path`, or None with the problem added: `setting` and, when
    the path is its default, which (`default`)."""
    from mlx_medic.render.authorized_keys import check_public_key

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        which = f"{default} {path}" if default else str(path)
        why = exc.strerror or str(exc)
        problems.append(f"{setting} (for {KEYS_TARGET}: {which} cannot be read: {why})")
        return None
    return check_public_key(text, str(path))


def _public_key(args: argparse.Namespace, inventory: Any, problems: list[str]) -> str | None:
    """The remediator's key: --ssh.public-key, else ssh.identity_file's .pub."""
    if args.public_key is not None:
        return _read_key(args.public_key, "--ssh.public-key FILE", "", problems)
    if inventory is None:  # its default is the inventory's, and --inventory is missing
        return None
    if inventory.ssh.identity_file is None:
        problems.append(
            f"--ssh.public-key FILE (for {KEYS_TARGET}; or the inventory's ssh.identity_file,"
            " with its .pub beside it)"
        )
        return None
    path = Path(f"{inventory.ssh.identity_file}.pub")
    return _read_key(path, "--ssh.public-key FILE", "ssh.identity_file's .pub", problems)


def _serve_public_keys(
    args: argparse.Namespace, inventory: Any, problems: list[str]
) -> dict[str, str]:
    """model -> its wrapper's key line, for the models whose wrapper logs in to its peers
    with serve.identity_file; each file read once."""
    from mlx_medic.render.files import RenderError

    if inventory is None:
        return {}
    models = [m for m in inventory.models if m.serve.identity_file is not None]
    if args.serve_public_key is not None and not models:
        raise RenderError(
            f"--serve.public-key {args.serve_public_key}: no model sets"
            " serve.identity_file (the key its wrapper logs in to peers with)"
        )
    read: dict[Path, str | None] = {}
    keys = {}
    for model in models:
        path = args.serve_public_key or Path(f"{model.serve.identity_file}.pub")
        if path not in read:
            default = (
                "" if args.serve_public_key else f"models.{model.name}.serve.identity_file's .pub"
            )
            read[path] = _read_key(path, "--serve.public-key FILE", default, problems)
        key = read[path]
        if key is not None:
            keys[model.name] = key
    return keys


def _missing_flags(args: argparse.Namespace, names: list[str]) -> list[str]:
    """Each required flag that is missing, with the chosen targets that need it."""
    problems = []
    for dest, required in REQUIRED.items():
        needed_by = required.needed_by(names)
        if needed_by and getattr(args, dest) is None:
            for_whom = "" if not required.targets else f" (for {', '.join(needed_by)})"
            problems.append(required.flag + for_whom)
    return problems


def _rules_overrides(items: list[str]) -> dict[str, str]:
    from mlx_medic.render.files import RenderError

    overrides = {}
    for item in items:
        alert, sep, duration = item.partition("=")
        if not sep or not alert:
            raise RenderError(f"--rules.for {item!r}: write ALERT=DURATION")
        overrides[alert] = duration
    return overrides


def run(args: argparse.Namespace) -> int:
    """Every missing setting named at once, and any bad value, before anything is written
    (exit 2); a file that cannot be written is exit 1."""
    from mlx_medic.render.files import RenderError

    try:
        return _render(args)
    except RenderError as exc:
        raise CommandError(str(exc)) from None


def _render(args: argparse.Namespace) -> int:
    from mlx_medic.inventory.load import load_inventory
    from mlx_medic.inventory.methods import InventoryError
    from mlx_medic.render import authorized_keys, rules
    from mlx_medic.render.files import RenderError, RulesOptions, Site, write

    names = list(TARGETS) if args.target == "all" else [args.target]
    inventory = None
    if args.inventory is not None:
        try:
            inventory = load_inventory(args.inventory)
        except InventoryError as exc:
            raise file_error(exc) from None
    problems = _missing_flags(args, names)
    public_key, serve_keys = None, {}
    if KEYS_TARGET in names:
        public_key = _public_key(args, inventory, problems)
        serve_keys = _serve_public_keys(args, inventory, problems)
        if inventory is not None:
            problems += [
                f"{setting} (for {KEYS_TARGET}: {why})"
                for setting, why in authorized_keys.missing_in_inventory(inventory)
            ]
    if problems or inventory is None:
        raise CommandError("missing settings: " + "; ".join(problems))
    site = Site(
        inventory=inventory,
        rules=RulesOptions(
            args.rules_file or rules.SOURCE,
            _rules_overrides(args.rules_for),
            args.rules_interval,
            args.rules_held_for,
        ),
        remediator_url=args.remediator_url,
        remediator_command=args.remediator_command,
        remediator_user=args.remediator_user,
        remediator_config=args.remediator_config,
        alertmanager=args.alertmanager,
        alertmanager_credentials_file=args.am_credentials,
        prometheus_credentials_file=args.prom_credentials,
        public_key=public_key,
        serve_public_keys=serve_keys,
        prometheus_interval=args.prometheus_interval,
        alertmanager_group_wait=args.am_group_wait,
        alertmanager_group_interval=args.am_group_interval,
        **({"oncall_url": args.oncall_url} if args.oncall_url else {}),
    )
    files = []
    for name in names:  # every target rendered before anything is written
        module = importlib.import_module(f"mlx_medic.render.{TARGETS[name]}")
        try:
            files += module.render(site)
        except RenderError as exc:
            raise CommandError(f"{name}: {exc}") from None
    try:
        write(args.out, files)
    except OSError as exc:  # each file is replaced whole; those before it are written
        raise CommandError(f"cannot write {exc.filename}: {exc.strerror}", EXIT_FAILED) from None
    for item in files:
        print(args.out / item.path)
    return 0
