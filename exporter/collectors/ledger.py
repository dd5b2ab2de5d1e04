"""`ledger`: this node's protection-domain ledger (mlx_medic.state.ledger), served here
so the name has one owner: the debt (the node's total and per RDMA device), each model's
reserve beside it, and the survivors of SIGKILL still alive here with the domains they
hold, so the reboot alert works from the node's own scrape.

A domain held by a SIGKILLed or vanished JACCL rank, or by a survivor, stays spent until
the node reboots; at a model's reserve on a device it needs, no JACCL start of the model
is tried. Failed JACCL starts and init/teardown cycles spend nothing (disputed, shown by
`mlx-medic node ledger`). Without an inventory node name (discovery mode) the ledger,
being per node, is not served.

    mlx_pd_debt 2.0
    mlx_pd_device_debt{device="rdma_en2"} 2.0
    mlx_pd_reserve{model="m1"} 5.0
    mlx_unkillable_processes{model="m1"} 1.0
    mlx_unkillable_domains{model="m1"} 2.0
    mlx_node_models_info{models="m1,m2"} 1.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.node.boot_id import current_boot_id
from mlx_medic.processes.placement import hostfile_devices
from mlx_medic.state.ledger import (
    debt_by_device,
    live_survivors,
    process_alive,
    read_ledger,
)

DEBT_HELP = (
    "JACCL processes this node has counted as spending protection domains since it"
    " booted, from its ledger: each SIGKILLed or vanished JACCL rank and each survivor of"
    " SIGKILL, once per process, whatever its devices (per device: mlx_pd_device_debt)."
    " Failed JACCL starts and init/teardown cycles are disputed and not counted."
)
DEVICE_DEBT_HELP = (
    "Protection domains spent this boot on each RDMA device of this node, from its ledger:"
    " one per counted process that used the device, plus every counted process whose"
    ' devices are unknown (device="node" alone when no device is known). The budget is'
    " about 11 per device; they stay spent until reboot."
)
RESERVE_HELP = (
    "The model's policy.pd_reserve, per RDMA device: no JACCL start of the model is tried"
    " while a device it needs on this node has mlx_pd_device_debt at or above it."
)
UNKILLABLE_HELP = (
    "Processes of the model that survive SIGKILL (uninterruptible sleep) and still live on"
    " this node (same pid and start time), as a sweep recorded them in the node's ledger;"
    " only a reboot ends them. 0 for every model placed here when there is none."
)
DOMAINS_HELP = (
    "Protection domains the model's live survivors of SIGKILL on this node are believed to"
    " hold: one per RDMA device of a JACCL survivor (at least 1 when its devices are"
    " unknown), 0 for a ring rank or a non-rank process."
)
MODELS_INFO_HELP = (
    "Always 1; models: every inventory model placed on this node, comma-separated and"
    " sorted (what a reboot of the node interrupts)."
)


class LedgerCollector(Collector):
    name = "ledger"

    def __init__(
        self,
        context: ExporterContext,
        boot_id: Callable[[], str] = current_boot_id,
        alive: Callable[[int, float], bool] = process_alive,
    ):
        self._context = context
        self._boot_id = boot_id
        self._alive = alive

    def collect(self) -> Iterable[Metric]:
        node = self._context.node
        if node is None:
            return
        ledger = read_ledger(self._context.state_dir, node, self._boot_id())
        models = self._context.models_here()
        yield GaugeMetricFamily("mlx_pd_debt", DEBT_HELP, value=ledger.debt)
        devices = {d for model in models for d in hostfile_devices(model, node)}
        device_debt = GaugeMetricFamily("mlx_pd_device_debt", DEVICE_DEBT_HELP, labels=["device"])
        for device, debt in debt_by_device(ledger.debt_by_unit(), devices).items():
            device_debt.add_metric([device], debt)
        yield device_debt
        reserve = GaugeMetricFamily("mlx_pd_reserve", RESERVE_HELP, labels=["model"])
        for model in models:
            reserve.add_metric([model.name], model.policy.pd_reserve)
        yield reserve
        processes: dict[str, int] = {model.name: 0 for model in models}
        domains: dict[str, int] = dict(processes)
        for entry in live_survivors(ledger, self._alive):
            name = entry.model or ""
            processes[name] = processes.get(name, 0) + 1
            domains[name] = domains.get(name, 0) + entry.survivor(node).domains
        unkillable = GaugeMetricFamily(
            "mlx_unkillable_processes", UNKILLABLE_HELP, labels=["model"]
        )
        held = GaugeMetricFamily("mlx_unkillable_domains", DOMAINS_HELP, labels=["model"])
        for name, count in processes.items():
            unkillable.add_metric([name], count)
            held.add_metric([name], domains[name])
        yield unkillable
        yield held
        info = GaugeMetricFamily("mlx_node_models_info", MODELS_INFO_HELP, labels=["models"])
        info.add_metric([",".join(sorted(model.name for model in models))], 1)
        yield info


@register(
    "ledger",
    help="the node's protection-domain debt this boot (total and per RDMA"
    " device), each model's reserve, the survivors of SIGKILL here and the models"
    " placed here",
)
def make(context: ExporterContext) -> Collector:
    return LedgerCollector(context)
