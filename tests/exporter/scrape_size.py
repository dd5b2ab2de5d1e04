"""One whole exporter scrape in-process, every collector on injected sources, to count
what a model costs: the series a scrape gains when the node gets one more model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.core import Metric

from mlx_medic.exporter.collector import REGISTRY, Collector, ExporterContext, ScrapeCollector
from mlx_medic.exporter.collectors.ledger import LedgerCollector
from mlx_medic.exporter.collectors.logs import LogsCollector, service_logs
from mlx_medic.exporter.collectors.memory import MemoryCollector
from mlx_medic.exporter.collectors.processes import ProcessesCollector
from mlx_medic.exporter.collectors.rdma import RdmaCollector
from mlx_medic.exporter.collectors.serve import ServeCollector
from mlx_medic.exporter.collectors.service import ModelServiceCollector, targets_for
from mlx_medic.exporter.collectors.tmpdirs import (
    BackgroundWalker,
    TmpDirsCollector,
    TmpWalker,
    watched_dirs,
)
from mlx_medic.health import ProbeResult
from mlx_medic.inventory.load import parse_inventory
from mlx_medic.platform.commands import CommandNotFound, CompletedCommand
from mlx_medic.platform.open_paths import PathsInUse
from mlx_medic.processes.info import ProcessInfo
from mlx_medic.signatures import signatures_for

NOW = 1_000_000.0
BOOT = "boot-1"
HEAD, PEER = "n1", "n2"


def inventory_text(root: Path, models: int) -> str:
    """`models` alike models on n1 (head) and n2, each with both backends, its own log
    file and its own tmp dir: what a model usually brings."""
    lines = ["nodes:", f"  {HEAD}: {{ssh: 127.0.0.2}}", f"  {PEER}: {{ssh: 127.0.0.3}}", "models:"]
    for index in range(1, models + 1):
        name = f"m{index}"
        tmp = root / "tmp" / name
        tmp.mkdir(parents=True, exist_ok=True)
        log = root / f"{name}.log"
        log.touch()
        lines += [
            f"  {name}:",
            f"    model: /models/{name}",
            f"    nodes: [{HEAD}, {PEER}]",
            f"    port: {8080 + index}",
            f"    service: {{manager: supervisord, label: {name}}}",
            "    backends: {jaccl: {hostfile: /etc/jaccl.json}, ring: {hostfile: /etc/ring.json}}",
            f"    tmp_dirs: [{tmp}]",
            f"    log_files: [{log}]",
        ]
    return "\n".join(lines) + "\n"


class _Table:
    def __init__(self, processes: Sequence[ProcessInfo]):
        self.processes = list(processes)

    def snapshot(self) -> list[ProcessInfo]:
        return list(self.processes)


def _no_tool(argv: Sequence[str], timeout: float) -> CompletedCommand:
    raise CommandNotFound(argv[0])


def collectors(context: ExporterContext, processes: Sequence[ProcessInfo]) -> list[Collector]:
    """Every registered collector, each on sources the test controls (no thread, no probe,
    no /proc, no RDMA tool)."""
    assert context.inventory is not None and context.node is not None
    service = ModelServiceCollector(
        targets_for(context),
        probe=lambda host, port, **_: ProbeResult(True, "answered", 0.1),
        start=False,
        clock=lambda: NOW,
    )
    service.probe_all_once()
    walker = TmpWalker(
        watched_dirs(context), lambda: [], clock=lambda: NOW, in_use=lambda: PathsInUse()
    )
    background = BackgroundWalker(walker.walk)
    background.latest = walker.walk()
    made: list[Collector] = [
        ProcessesCollector(
            node=context.node,
            inventory=context.inventory,
            state_dir=context.state_dir,
            table=_Table(processes),
            clock=lambda: NOW,
            established=lambda sshd: True,
            listening=lambda: lambda pid, port: False,
            read_file=lambda process, path: None,
            boot_id=lambda: BOOT,
        ),
        LedgerCollector(context, boot_id=lambda: BOOT),
        ServeCollector(context),
        service,
        LogsCollector(
            service_logs(context),
            signatures_for(context.inventory),
            context.state_dir / "logs.json",
        ),
        TmpDirsCollector(background, clock=lambda: NOW, first_scrape_wait=0),
        MemoryCollector(available_bytes=lambda: 1 << 30, platform="linux"),
        RdmaCollector(runner=_no_tool),
    ]
    assert {c.name for c in made} == set(REGISTRY), "a collector is left out of the count"
    return made


def scrape(
    root: Path, models: int, node: str = HEAD, processes: Sequence[ProcessInfo] = ()
) -> list[Metric]:
    """One scrape of `node` in a cluster of `models` alike models."""
    (root / "state").mkdir(parents=True, exist_ok=True)
    inventory = parse_inventory(inventory_text(root, models))
    context = ExporterContext(
        node=node, inventory=inventory, state_dir=root / "state", clock=lambda: NOW
    )
    scraper = ScrapeCollector(collectors(context, processes), node=node)
    try:
        return list(scraper.collect())
    finally:
        scraper.close()


def series_by_family(families: Sequence[Metric]) -> Counter[str]:
    """Series per family, counters under their `_total` name (`_created` left out)."""
    counts: Counter[str] = Counter()
    for family in families:
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                counts[sample.name] += 1
    return counts


def model_cost(root: Path, node: str = HEAD, **kwargs: object) -> Counter[str]:
    """Series per family that one more model adds to `node`'s scrape."""
    one = series_by_family(scrape(root / "one", 1, node, **kwargs))  # type: ignore[arg-type]
    two = series_by_family(scrape(root / "two", 2, node, **kwargs))  # type: ignore[arg-type]
    two.subtract(one)
    return +two
