"""`mlx-medic exporter`: serve this node's collectors on /metrics. As root it first refuses
to run from an interpreter, virtualenv, package or inventory another user could change
(mlx_medic.exporter.trusted_files): exit 2, each path named with its owner and mode."""

from __future__ import annotations

import argparse
import html
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.registry import CollectorRegistry

from mlx_medic.command_line import (
    CommandError,
    add_inventory_flag,
    add_log_flags,
    file_error,
    listen_error,
)
from mlx_medic.exporter import collectors as _collectors  # noqa: F401  (registers every collector)
from mlx_medic.exporter.collector import REGISTRY, ExporterContext, ScrapeCollector
from mlx_medic.exporter.exposition import generate_latest
from mlx_medic.exporter.settings import add_flags, describe, settings_from_args
from mlx_medic.exporter.web import MetricsServer
from mlx_medic.listen_address import parse_listen
from mlx_medic.state.layout import DEFAULT_STATE_DIR
from mlx_medic.state.node_identity import resolve_node

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory

log = logging.getLogger("mlx_medic.exporter")

DEFAULT_LISTEN = "0.0.0.0:10900"  # outside the 9100-9999 public allocation range

LANDING = """<!doctype html><html><head><title>mlx-medic exporter</title></head><body>
<h1>mlx-medic exporter</h1><p>Node: {node}.</p>
<p>Collectors and their settings (<code>--collector.NAME.SETTING</code>):</p><ul>{collectors}</ul>
<p><a href="/metrics">Metrics</a></p></body></html>"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inventory_flag(parser, "the inventory YAML; without it, MLX processes are discovered")
    parser.add_argument(
        "--web.listen-address",
        dest="listen",
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--node",
        default=None,
        help="this node's name in the inventory (default: <state dir>/node-id)",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="override the inventory's state_dir"
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one scrape to stdout and exit (for checks and tests)",
    )
    add_log_flags(parser)
    for name, registration in sorted(REGISTRY.items()):
        group = parser.add_argument_group(f"collector {name}")
        group.add_argument(  # BooleanOptionalAction also makes --no-collector.NAME
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=registration.default_enabled,
            help=registration.help or f"enable the {name} collector",
        )
        if registration.settings is not None:
            add_flags(group, name, registration.settings)


def load(inventory: Path) -> Inventory:
    """The inventory, read without its schema (pydantic, PyYAML: 12 MiB, a quarter of the
    exporter's memory, bench/busy_node) unless the file is bad: from its validated
    snapshot, else validated by a child process (mlx_medic.inventory.snapshot). A bad
    file is a CommandError naming every problem."""
    from mlx_medic.inventory.methods import InventoryError
    from mlx_medic.inventory.snapshot import load_inventory_apart

    try:
        return load_inventory_apart(inventory)
    except InventoryError as exc:
        raise file_error(exc) from None


def build(args: argparse.Namespace) -> tuple[ExporterContext, ScrapeCollector]:
    inventory = load(args.inventory) if args.inventory else None
    state_dir = args.state_dir or (inventory.state_dir if inventory else DEFAULT_STATE_DIR)
    node = resolve_node(inventory, args.node, state_dir)
    enabled = [REGISTRY[name] for name in sorted(REGISTRY) if getattr(args, f"collector_{name}")]
    settings = {
        r.settings: settings_from_args(args, r.name, r.settings) for r in enabled if r.settings
    }
    context = ExporterContext(
        node=node, inventory=inventory, state_dir=state_dir, settings=settings
    )
    context.prepare_state_dir()  # before any collector writes there
    collectors = [registration.factory(context) for registration in enabled]
    return context, ScrapeCollector(collectors, node=node)


def landing_page(context: ExporterContext, scrape: ScrapeCollector) -> bytes:
    """Which node, which collectors with which settings: what a scrape's HELP cannot say."""
    if context.node is None:
        node = "not named (no inventory): series carry no <code>node</code> label"
    else:
        node = f"<b>{html.escape(context.node)}</b>, the <code>node</code> label of every series"
    items = []
    for collector in scrape.collectors:
        kind = REGISTRY[collector.name].settings
        said = f": {describe(context.settings_for(kind))}" if kind else ""
        items.append(f"<li>{html.escape(collector.name + said)}</li>")
    return LANDING.format(node=node, collectors="".join(items) or "<li>none</li>").encode()


def make_registry(scrape: ScrapeCollector) -> CollectorRegistry:
    # Collectors without names are always asked, so `name[]` filters their samples.
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(scrape)
    return registry


def untrusted_files(args: argparse.Namespace) -> list[str]:
    """Why this exporter must not run (as root, from files another user could change:
    mlx_medic.exporter.trusted_files); checked before the inventory is read."""
    from mlx_medic.exporter.trusted_files import refusal

    return refusal(args.inventory)


def listen(host: str, port: int, address: str) -> MetricsServer:
    """The bound server (mlx_medic.exporter.web), before anything else is built: a taken
    or refused address is said first and alone (CommandError). Its registry and landing
    page are set once the collectors exist; no request is served before serve_forever."""
    try:
        return MetricsServer(host, port)
    except OSError as exc:
        raise listen_error(exc, address) from None


def run(args: argparse.Namespace) -> int:
    refused = untrusted_files(args)
    if refused:
        for problem in refused:
            log.error("refusing to run as root: %s", problem)
        return 2
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    server = None if args.once else listen(host, port, args.listen)
    try:
        context, scrape = build(args)
    except BaseException as exc:
        if server is not None:
            server.server_close()
        if isinstance(exc, LookupError | ValueError):  # this node's name
            raise CommandError(str(exc)) from None
        raise
    registry = make_registry(scrape)
    names = ", ".join(c.name for c in scrape.collectors) or "none"
    if context.node is None:
        log.info("node not named (no inventory): series carry no node label; collectors: %s", names)
    else:
        log.info("node %s; collectors: %s", context.node, names)
    for model in context.models_here():
        log.info("watching model %s (port %d, from the inventory)", model.name, model.port)
    if context.inventory is None:
        log.info("no inventory: discovering MLX processes by command line on this node")
    if server is None:  # --once
        sys.stdout.buffer.write(generate_latest(registry))
        scrape.close()
        return 0
    server.registry = registry
    server.landing = landing_page(context, scrape)
    log.info("serving on http://%s:%d/metrics", host, server.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        scrape.close()
    return 0
