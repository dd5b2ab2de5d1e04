"""`mlx-medic exporter`: serve this node's collectors on /metrics."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from mlx_medic.exporter import collectors as _collectors  # noqa: F401  (registers every collector)
from mlx_medic.exporter.collector import REGISTRY, ExporterContext, ScrapeCollector
from mlx_medic.inventory import InventoryError, load_inventory
from mlx_medic.listen_address import parse_listen
from mlx_medic.node_identity import resolve_node

log = logging.getLogger("mlx_medic.exporter")

DEFAULT_LISTEN = "0.0.0.0:10900"  # outside the 9100-9999 public allocation range

LANDING = """<!doctype html><html><head><title>mlx-medic exporter</title></head><body>
<h1>mlx-medic exporter</h1><p>Node <b>{node}</b>. Collectors: {collectors}.</p>
<p><a href="/metrics">Metrics</a></p></body></html>"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config.file",
        dest="config_file",
        type=Path,
        default=None,
        help="inventory YAML; without it, MLX processes are discovered",
    )
    parser.add_argument(
        "--web.listen-address",
        dest="listen",
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--node", default=None,
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
    for name, registration in sorted(REGISTRY.items()):
        parser.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=registration.default_enabled,
            help=registration.help or f"enable the {name} collector",
        )
    # BooleanOptionalAction spells the negative --no-collector.NAME; done above.


def build(args: argparse.Namespace) -> tuple[ExporterContext, ScrapeCollector]:
    inventory = load_inventory(args.config_file) if args.config_file else None
    state_dir = args.state_dir or (inventory.state_dir if inventory else Path("/var/lib/mlx-medic"))
    node = resolve_node(inventory, args.node, state_dir)
    context = ExporterContext(node=node, inventory=inventory, state_dir=state_dir)
    enabled = [name for name in sorted(REGISTRY) if getattr(args, f"collector_{name}")]
    collectors = [REGISTRY[name].factory(context) for name in enabled]
    return context, ScrapeCollector(collectors)


def make_handler(registry: CollectorRegistry, landing: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype = generate_latest(registry), CONTENT_TYPE_LATEST
            elif path == "/":
                body, ctype = landing, "text/html; charset=utf-8"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


# Scrapes are serialized: collectors keep state between scrapes.
_scrape_lock = threading.Lock()


class _SerialRegistry(CollectorRegistry):
    def collect(self):  # type: ignore[no-untyped-def]
        with _scrape_lock:
            yield from list(super().collect())


def run(args: argparse.Namespace) -> int:
    try:
        host, port = parse_listen(args.listen)
        context, scrape = build(args)
    except InventoryError as exc:
        log.error("%s", exc.report())
        return 2
    except (LookupError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    registry = _SerialRegistry(auto_describe=False)
    registry.register(scrape)
    names = ", ".join(c.name for c in scrape.collectors) or "none"
    log.info("node %s; collectors: %s", context.node, names)
    for model in context.models_here():
        log.info("watching model %s (port %d, from the inventory)", model.name, model.port)
    if context.inventory is None:
        log.info("no inventory: discovering MLX processes by command line on this node")
    if args.once:
        sys.stdout.buffer.write(generate_latest(registry))
        scrape.close()
        return 0
    landing = LANDING.format(node=context.node, collectors=names).encode()
    server = ThreadingHTTPServer((host, port), make_handler(registry, landing))
    log.info("serving on http://%s:%d/metrics", host, server.server_port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        scrape.close()
    return 0
