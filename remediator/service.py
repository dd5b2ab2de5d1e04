"""`mlx-medic remediator`: the Alertmanager webhook service.

Loads everything it needs before it listens (config, credentials, inventory,
journal), so a bad file stops it with a clear message instead of half-serving;
stops gracefully on SIGTERM so an interrupted run is the exception, not the rule;
reloads its credentials files on SIGHUP (remediator.auth); prunes its journal at start
and every `journal_retention.interval`, off the event loop (remediator.journal_pruning).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from mlx_medic.command_line import CommandError, add_log_flags, listen_error
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.listen_address import parse_listen
from mlx_medic.remediator.auth import AuthError, CredentialStore, load_credentials
from mlx_medic.remediator.config import (
    ConfigError,
    ConfigSource,
    RemediatorConfig,
    TlsConfig,
    check_routing,
    find_config_file,
    load_config,
)
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.journal_pruning import PruneMetrics, prune_periodically
from mlx_medic.remediator.playbooks import Playbook, builtin_playbooks
from mlx_medic.remediator.webapp import make_app
from mlx_medic.transport import SshTransport

log = logging.getLogger("mlx_medic.remediator.service")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config.file",
        dest="config_file",
        type=Path,
        default=None,
        help="remediator config (YAML); default: $MLX_MEDIC_CONFIG, else"
        " /etc/mlx-medic/remediator.yml if it exists, else embedded defaults",
    )
    parser.add_argument(
        "--web.listen-address",
        dest="listen",
        default=None,
        metavar="HOST:PORT",
        help="overrides the config's listen (default 127.0.0.1:10901); port 0 picks a free one",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="plan and journal every step and what live mode would do; take no lock, execute"
        " nothing",
    )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=None,
        help="serve without credentials (only behind something that checks them)",
    )
    add_log_flags(parser)


class StartupError(Exception):
    """Something the operator must fix before the service can start."""


def make_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """Server TLS; with `client_ca_file` a client certificate signed by it is required."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        if tls.client_ca_file is not None:
            context.load_verify_locations(cafile=str(tls.client_ca_file))
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(f"tls: cannot load certificates: {exc}") from exc
    return context


def effective_config(args: argparse.Namespace) -> RemediatorConfig:
    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        raise StartupError(f"config: {exc.report()}") from exc
    overrides: dict[str, Any] = {}
    if args.listen is not None:
        overrides["listen"] = args.listen
    if args.dry_run:
        overrides["dry_run"] = True
    if args.insecure_no_auth:
        overrides["insecure_no_auth"] = True
    return config.model_copy(update=overrides)


async def serve(
    config: RemediatorConfig,
    credentials: CredentialStore | None,
    playbooks: Mapping[str, Playbook] | None = None,
    config_source: ConfigSource | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, reloading the credentials on SIGHUP; `playbooks`
    (name -> instance) are the ones the config may route to, the built-in ones unless
    given; `config_source` is the config file read (the commands the page and the runs'
    next actions show name it)."""
    playbooks = builtin_playbooks(config) if playbooks is None else playbooks
    try:
        host, port = parse_listen(config.listen, default_host="127.0.0.1")
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    ssl_context = make_ssl_context(config.tls) if config.tls is not None else None
    try:
        inventory = load_inventory(config.inventory)
    except InventoryError as exc:
        raise StartupError(exc.report()) from exc

    try:
        check_routing(config.routing, playbooks)
    except ConfigError as exc:
        raise StartupError(f"config: {exc}") from exc
    try:
        config.journal.parent.mkdir(parents=True, exist_ok=True)
        journal = Journal(config.journal)
    except Exception as exc:  # sqlite3/OS errors: the message names the file
        raise StartupError(f"journal {config.journal}: {exc}") from exc

    registry = CollectorRegistry()
    transport = SshTransport(inventory)
    try:
        engine = Engine(
            config,
            inventory,
            journal,
            transport,
            playbooks=playbooks,
            registry=registry,
            hostname=socket.gethostname(),
            config_source=config_source,
        )
    except ConfigError as exc:
        await transport.close()
        journal.close()
        raise StartupError(f"config: {exc}") from exc
    prune_metrics = PruneMetrics(registry, config.journal)
    app = make_app(engine, journal, config, registry, credentials, config_source)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if credentials is not None:
        loop.add_signal_handler(signal.SIGHUP, credentials.reload, "SIGHUP")

    await engine.start()
    windows = [m.policy.window for m in inventory.models]
    pruning: asyncio.Task[None] | None = None
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=1024)
        try:
            await site.start()
        except OSError as exc:
            raise listen_error(exc, config.listen) from None
        log.info(
            "listening",
            extra={
                "addresses": [f"{a[0]}:{a[1]}" for a in runner.addresses],
                "tls": ssl_context is not None,
                "mutual_tls": bool(config.tls and config.tls.client_ca_file),
                **(
                    {"auth": "none (insecure)"}
                    if credentials is None
                    else credentials.access.describe()
                ),
                "dry_run": config.dry_run,
                "inventory": str(config.inventory),
                "journal": str(config.journal),
                "models": [m.name for m in inventory.models],
                "node": engine.this_node,
            },
        )
        # Pruned once listening: a service that cannot bind its port exits with one line.
        pruning = asyncio.create_task(
            prune_periodically(config.journal, config.journal_retention, windows, prune_metrics)
        )
        await stop.wait()
        log.info("stopping", extra={"reason": "signal"})
    finally:
        if pruning is not None:
            pruning.cancel()
        await runner.cleanup()
        await engine.close()
        await transport.close()
        journal.close()


def config_source(args: argparse.Namespace) -> ConfigSource | None:
    """The config file the service reads, by an absolute path: a hint that names it works
    from any directory."""
    source = find_config_file(args.config_file)
    return None if source is None else ConfigSource(source.path.absolute(), source.found_by)


def _lean_logging() -> None:
    """Skip what log lines here never show (caller's file and line, thread and process
    names): the logging HOWTO's optimisations, worth ~20 % of a webhook request's CPU."""
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def run(args: argparse.Namespace, playbooks: Mapping[str, Playbook] | None = None) -> int:
    _lean_logging()
    try:
        config = effective_config(args)
        credentials = load_credentials(config.auth, config.insecure_no_auth)
        if credentials is None:
            log.warning(
                "serving WITHOUT authentication (insecure_no_auth): anyone who can"
                " reach the port can trigger remediations"
            )
        elif config.auth.read_only_open:
            log.warning(
                "serving /, /api/* and /metrics WITHOUT authentication (auth.read_only_open):"
                " anyone who can reach the port can read the remediation log; posting alerts"
                " still needs the credentials"
            )
        asyncio.run(serve(config, credentials, playbooks, config_source(args)))
    except (StartupError, AuthError) as exc:
        raise CommandError(str(exc)) from None
    return 0
