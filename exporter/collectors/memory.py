"""`memory`: how close this node is to running out, since a JACCL error on one
Mac can be caused by another Mac running out of memory.

Everywhere: `mlx_memory_available_bytes` (psutil). On macOS also the kernel's
pressure level and, from `vm_stat`, wired memory (Metal-wired model weights
land there) and the compressor's share. A macOS tool that fails leaves its
series absent with a warning in the log; the psutil reading still counts.

    mlx_memory_available_bytes 6.9e+10
    mlx_memory_pressure_level 1.0
    mlx_memory_wired_bytes 1.2e+11
    mlx_memory_compressor_bytes 1.5e+09

With an inventory, for each model placed on the node, by the rule the serve wrapper's
room check applies before a start (mlx_medic.node.room): the memory a rank of it may take
here (available, at most a nonzero macOS `iogpu.wired_limit_mb`) and the memory it needs
(`serve.memory_needed`, else its share of the weights held here plus 20%; no series when
neither is known, as on a node the weights have not reached yet).

    mlx_model_memory_free_bytes{model="m1"} 6.9e+10
    mlx_model_memory_needed_bytes{model="m1"} 4.2e+10
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.platform.commands import (
    CommandError,
    ParseError,
    Runner,
    output_of,
    run_command,
)
from mlx_medic.platform.macos_memory import (
    PRESSURE_ARGV,
    VM_STAT_ARGV,
    VmStat,
    parse_pressure_level,
    parse_vm_stat,
)

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model

log = logging.getLogger("mlx_medic.exporter.memory")

COMMAND_TIMEOUT = 5.0


def psutil_available_bytes() -> int:
    return int(psutil.virtual_memory().available)


class MemoryCollector(Collector):
    name = "memory"

    def __init__(
        self,
        *,
        available_bytes: Callable[[], int] = psutil_available_bytes,
        platform: str = sys.platform,
        runner: Runner = run_command,
        timeout: float = COMMAND_TIMEOUT,
        models: Sequence[Model] = (),
        state_dir: Path | None = None,
    ):
        """`models`: the inventory's models placed on this node (their room is published)."""
        self._models = list(models)
        self._state_dir = state_dir
        self._platform = platform
        self._available_bytes = available_bytes
        self._macos = platform == "darwin"
        self._runner = runner
        self._timeout = timeout
        self._last_problem: dict[str, str] = {}

    def _read(self, what: str, argv: tuple[str, ...], parse: Callable[[str], object]):
        """Parsed tool output, or None with a warning (logged again only when it changes)."""
        try:
            value = parse(output_of(self._runner, argv, self._timeout))
        except (CommandError, ParseError) as exc:
            problem = str(exc)
            if self._last_problem.get(what) != problem:
                log.warning("%s unavailable, series left out: %s", what, problem)
            self._last_problem[what] = problem
            return None
        if self._last_problem.pop(what, None) is not None:
            log.info("%s readable again", what)
        return value

    def collect(self) -> Iterable[Metric]:
        available = self._available_bytes()
        yield GaugeMetricFamily(
            "mlx_memory_available_bytes",
            "Memory available to new allocations without swapping (psutil; on macOS "
            "free + inactive pages).",
            value=available,
        )
        yield from self._model_room(available)
        if not self._macos:
            return
        level = self._read("memory pressure level", PRESSURE_ARGV, parse_pressure_level)
        if isinstance(level, int):
            yield GaugeMetricFamily(
                "mlx_memory_pressure_level",
                "macOS kern.memorystatus_vm_pressure_level: 1 normal, 2 warn, 4 critical.",
                value=level,
            )
        stats = self._read("vm_stat", VM_STAT_ARGV, parse_vm_stat)
        if isinstance(stats, VmStat):
            if stats.wired_bytes is not None:
                yield GaugeMetricFamily(
                    "mlx_memory_wired_bytes",
                    "macOS wired memory (vm_stat 'Pages wired down' x page size); "
                    "Metal-wired model weights count here and cannot be paged out.",
                    value=stats.wired_bytes,
                )
            if stats.compressor_bytes is not None:
                yield GaugeMetricFamily(
                    "mlx_memory_compressor_bytes",
                    "macOS memory held by the compressor (vm_stat 'Pages occupied by "
                    "compressor' x page size); growth means the node is squeezing memory.",
                    value=stats.compressor_bytes,
                )

    def _model_room(self, available: int) -> Iterable[Metric]:
        from mlx_medic.node.room import (
            available_memory,
            memory_needed,
            usable_memory,
            weights_manifest,
        )

        if not self._models or self._state_dir is None:
            return
        free = GaugeMetricFamily(
            "mlx_model_memory_free_bytes",
            "Memory a rank of the model may take on this node, as the serve wrapper's room"
            " check reads it before a start: available, at most a nonzero macOS"
            " iogpu.wired_limit_mb.",
            labels=["model"],
        )
        needed = GaugeMetricFamily(
            "mlx_model_memory_needed_bytes",
            "Memory a rank of the model needs free on this node before a start:"
            " serve.memory_needed, else its share of the weights held here plus 20%.",
            labels=["model"],
        )
        try:
            memory = available_memory(self._state_dir, self._runner, self._platform, available)
        except (OSError, ValueError) as exc:
            log.warning("model memory unavailable, series left out: %s", exc)
            return
        for model in self._models:
            free.add_metric([model.name], usable_memory(memory))
            weights = model.weights_path()
            manifest = weights_manifest(weights) if weights is not None else None
            need = memory_needed(model, sum(manifest.values()) if manifest else None)
            if need is not None:
                needed.add_metric([model.name], need)
        yield free
        if needed.samples:
            yield needed


@register("memory", help="available memory; on macOS also pressure level, wired and compressed")
def make(context: ExporterContext) -> Collector:
    inventory, node = context.inventory, context.node
    models = inventory.models_on(node) if inventory is not None and node is not None else []
    return MemoryCollector(models=models, state_dir=context.state_dir)
