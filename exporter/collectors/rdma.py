"""`rdma`: Thunderbolt RDMA port state and the kernel's live RDMA object counts.

JACCL needs every `rdma_enX` port PORT_ACTIVE, and each device has a budget of
11 protection domains and queue pairs that leaked ranks keep until reboot;
the count rising with no rank alive is the early sign of
`[jaccl] Couldn't allocate protection domain`.

On a host without `ibv_devinfo` / `ioclasscount` (Linux, an Intel Mac) the
series are absent, never a fake zero, and the collector still succeeds. A
tool that is present but fails, hangs or prints something unrecognisable
makes the collector fail (`mlx_medic_collector_success{collector="rdma"} 0`,
the reason in the log): a broken probe must not look like a healthy zero.

    mlx_rdma_port_active{device="rdma_en2",port="1"} 1.0
    mlx_rdma_objects{kind="protection_domain"} 3.0
    mlx_rdma_objects{kind="queue_pair"} 6.0
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.platform.commands import Runner, run_command
from mlx_medic.platform.macos_rdma import (
    IBV_DEVINFO_ARGV,
    IOCLASSCOUNT_ARGV,
    RdmaPort,
    parse_ibv_devinfo,
    rdma_object_counts,
    rdma_tool_output,
)

log = logging.getLogger("mlx_medic.exporter.rdma")

COMMAND_TIMEOUT = 5.0


class RdmaCollector(Collector):
    name = "rdma"

    def __init__(self, *, runner: Runner = run_command, timeout: float = COMMAND_TIMEOUT):
        self._runner = runner
        self._timeout = timeout
        self._missing_logged: set[str] = set()

    def _run(self, argv: tuple[str, ...]) -> str | None:
        """stdout, or None when the tool is not installed; failures raise CommandError."""
        text = rdma_tool_output(self._runner, argv, self._timeout)
        if text is None and argv[0] not in self._missing_logged:
            log.info("%s is not installed: its RDMA series are left out", argv[0])
            self._missing_logged.add(argv[0])
        return text

    def ports(self) -> list[RdmaPort] | None:
        text = self._run(IBV_DEVINFO_ARGV)
        return None if text is None else parse_ibv_devinfo(text)

    def object_counts(self) -> dict[str, int] | None:
        text = self._run(IOCLASSCOUNT_ARGV)
        return None if text is None else rdma_object_counts(text)

    def collect(self) -> Iterable[Metric]:
        # Read both before yielding anything: a failure fails the whole collector.
        ports = self.ports()
        counts = self.object_counts()
        if ports is not None:
            family = GaugeMetricFamily(
                "mlx_rdma_port_active",
                "1 if the RDMA port is PORT_ACTIVE (ibv_devinfo), else 0. JACCL needs "
                "every port it uses active; PORT_DOWN means a cable, a peer without "
                "RDMA enabled, or a link that needs a reboot.",
                labels=["device", "port"],
            )
            for port in ports:
                family.add_metric([port.device, str(port.port)], 1.0 if port.active else 0.0)
            yield family
        if counts is not None:
            family = GaugeMetricFamily(
                "mlx_rdma_objects",
                "Live RDMA objects in the kernel (ioclasscount: protection_domain ="
                " AppleThunderboltRDMAProtectionDomain, queue_pair ="
                " AppleThunderboltRDMAQueuePair). Each device allows 11; objects held with no"
                " rank alive are leaked until reboot.",
                labels=["kind"],
            )
            for kind, count in counts.items():
                family.add_metric([kind], float(count))
            yield family


@register("rdma", help="Thunderbolt RDMA port state (ibv_devinfo) and PD/QP counts (ioclasscount)")
def make(context: ExporterContext) -> Collector:
    return RdmaCollector()
