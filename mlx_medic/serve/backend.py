"""Choosing the backend: the model's durable choice on the head (a ring pin mlx-medic set
itself is lifted once a node has rebooted since), then each node's protection-domain
ledger per RDMA device, then a smoke test. JACCL first (tensor parallel), else ring with
the ring hostfile (`--pipeline` by default).

The ledger is judged per device (docs/decisions.md): a JACCL start needs, on each node,
one domain on every device of that node's row in the JACCL hostfile, so it is tried only
while each of those devices has spent less than the model's reserve. Spends whose device
is unknown count against every device of their node.

The smoke test (a strict init and an all-reduce) is skipped for a backend whose last
start came up since every node's current boot with no error of it seen since, and for
ring when it is the last backend to try. JACCL's is never skipped otherwise:
mlx_lm.server's `init()` is not strict, and where the JACCL backend is not available at
all it returns single-process groups, whose rank 0 then answers alone; only a strict init
tells. Ring is always available, so a ring that cannot start fails its launch instead.
The JACCL smoke test is itself an init/teardown cycle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_medic.inventory.model import Backend, Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.serve.record import Failure, ServeRecord
from mlx_medic.state.backend_choice import BackendChoice, write_backend_choice

log = logging.getLogger("mlx_medic.serve")
SERVE_CHOOSER = "mlx-medic serve"  # who lifts or sets a pin from the wrapper


@dataclass(frozen=True)
class Candidate:
    name: str  # jaccl | ring
    backend: Backend


def candidates(model: Model, choice: BackendChoice) -> tuple[list[Candidate], list[Failure]]:
    """The backends to try in order, and why the others are out (as failures to report)."""
    configured = dict(model.backends.in_order())
    wanted = ["jaccl", "ring"] if choice.choice == "auto" else [choice.choice]
    found, refused = [], []
    for name in wanted:
        if name in configured:
            found.append(Candidate(name, configured[name]))
        else:
            refused.append(
                Failure(
                    name,
                    model.head,
                    f"pinned to {name} by"
                    f" {choice.by or 'someone'} ({choice.reason}) but the"
                    f" model has no {name} backend",
                )
                if choice.pinned
                else Failure(name, model.head, f"the model has no {name} backend")
            )
    return found, refused


Ledgers = dict[str, dict[str, Any]]  # node -> {boot_id, debt_by_unit} or {error}


def jaccl_devices(model: Model) -> dict[str, tuple[str, ...]]:
    """Node -> the RDMA devices its rank uses (its row of the model's JACCL hostfile);
    a node whose row cannot be read here is left out: its busiest device is judged."""
    from mlx_medic.processes.placement import hostfile_devices

    found = {node: hostfile_devices(model, node) for node in model.nodes}
    return {node: devices for node, devices in found.items() if devices}


def ledger_refusal(
    model: Model,
    ledgers: Ledgers,
    inventory: Inventory | None = None,
    devices: dict[str, tuple[str, ...]] | None = None,
) -> Failure | None:
    """A reason not to start JACCL: a device a node needs at the model's reserve, or a
    ledger that cannot be read (an unknown debt is not room for another spend). The
    refusal names every model placed on that node: they share its devices."""
    from mlx_medic.state.ledger import device_debt, jaccl_allowed

    needed = jaccl_devices(model) if devices is None else devices
    reserve = model.policy.pd_reserve
    for node in model.nodes:
        ledger = ledgers.get(node) or {"error": "no answer"}
        if "error" in ledger or "debt_by_unit" not in ledger:
            return Failure("jaccl", node, f"its ledger cannot be read ({ledger.get('error')})")
        units = {str(k): int(v) for k, v in (ledger.get("debt_by_unit") or {}).items()}
        wanted = needed.get(node, ())
        if jaccl_allowed(units, reserve, wanted):
            continue
        full = [d for d in wanted if device_debt(units, d) >= reserve] or sorted(units)
        spent = ", ".join(f"{d}: {device_debt(units, d)} spent" for d in full)
        sharing = (
            [m.name for m in inventory.models_on(node)] if inventory is not None else [model.name]
        )
        return Failure(
            "jaccl",
            node,
            f"the protection-domain ledger is at the reserve on"
            f" {spent} (reserve {reserve} per device, this boot): no JACCL start"
            f" there until it reboots (models placed on {node}: "
            f"{', '.join(sharing)})",
        )
    return None


def boot_ids(ledgers: Ledgers) -> dict[str, str]:
    return {
        node: str(ledger["boot_id"]) for node, ledger in ledgers.items() if ledger.get("boot_id")
    }


def fail_back(
    state_dir: Path, model: Model, choice: BackendChoice, boots: dict[str, str]
) -> tuple[BackendChoice, str | None]:
    """The choice to start with. A ring pin mlx-medic set itself is stamped with the
    nodes' boot ids at the first start under it, and lifted (to auto, once) when a node
    has rebooted since: a reboot frees the domains its failure left. A person's pin
    stays. The second value says what was done, for the log and the record."""
    if choice.choice != "ring" or not choice.automatic:
        return choice, None
    current = {node: boots[node] for node in model.nodes if node in boots}
    if not choice.boots:
        stamped = write_backend_choice(
            state_dir,
            model.name,
            "ring",
            by=choice.by,
            reason=choice.reason,
            now=choice.at,
            boots=current,
        )
        return stamped, None
    rebooted = choice.rebooted_since(current)
    if not rebooted:
        return choice, None
    said = (
        f"{', '.join(rebooted)} rebooted since {choice.by} pinned ring ({choice.reason});"
        " JACCL is tried again, with its smoke test"
    )
    lifted = write_backend_choice(
        state_dir,
        model.name,
        "auto",
        by=SERVE_CHOOSER,
        reason=f"ring pin lifted: {said}",
        boots=current,
    )
    return lifted, said


def pin_ring_again(state_dir: Path, model: Model, boots: dict[str, str], why: str) -> None:
    """After a lifted pin's JACCL start failed: ring again until the next reboot."""
    write_backend_choice(
        state_dir,
        model.name,
        "ring",
        by=SERVE_CHOOSER,
        reason=f"JACCL failed again after the reboot: {why}"[:500],
        boots={n: boots[n] for n in model.nodes if n in boots},
    )


def smoke_can_be_skipped(
    record: ServeRecord | None, boots: dict[str, str], nodes: list[str], backend: str = "jaccl"
) -> bool:
    """The backend's last start came up in every node's current boot, and no error of
    it (a failed start, a JACCL error line) has been seen since."""
    if record is None:
        return False
    success = record.last_success(backend)
    if success is None:
        return False
    if any(boots.get(n) is None or success.boot_ids.get(n) != boots[n] for n in nodes):
        return False
    error_at = record.error_at(backend)
    return error_at is None or error_at < success.at
