"""`ledger`: this node's protection-domain ledger (mlx_medic.node.ledger), served here
so the name has one owner, with each model's reserve beside it.

A domain spent by a SIGKILLed JACCL rank or a failed JACCL start stays spent until the
node reboots; at a model's reserve no JACCL start is tried on the node. Without an
inventory node name (discovery mode) the ledger, being per node, is not served.

    mlx_pd_debt 2.0
    mlx_pd_reserve{model="m1"} 5.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.node.boot_id import current_boot_id
from mlx_medic.node.ledger import read_ledger

DEBT_HELP = (
    "Protection domains this node has spent since it booted, from its ledger: each"
    " SIGKILLed JACCL rank or failed JACCL start, once per process; they stay spent until"
    " reboot (about 11 per RDMA device). Disputed init/teardown cycles are not counted."
)
RESERVE_HELP = (
    "The model's policy.pd_reserve: no JACCL start is tried on a node whose mlx_pd_debt"
    " has reached it."
)


class LedgerCollector(Collector):
    name = "ledger"

    def __init__(self, context: ExporterContext,
                 boot_id: Callable[[], str] = current_boot_id):  # fmt: skip
        self._context = context
        self._boot_id = boot_id

    def collect(self) -> Iterable[Metric]:
        node = self._context.node
        if node is None:
            return
        ledger = read_ledger(self._context.state_dir, node, self._boot_id())
        yield GaugeMetricFamily("mlx_pd_debt", DEBT_HELP, value=ledger.debt)
        reserve = GaugeMetricFamily("mlx_pd_reserve", RESERVE_HELP, labels=["model"])
        for model in self._context.models_here():
            reserve.add_metric([model.name], model.policy.pd_reserve)
        yield reserve


@register("ledger", help="the node's protection-domain debt this boot and each model's reserve")
def make(context: ExporterContext) -> Collector:
    return LedgerCollector(context)
