"""`mlx-medic doctor --config.file FILE`: the remediator's host's view of every node.

What breaks a remediation on a node is mostly found only when an alert fires: a helper
that cannot read its inventory, mlx-medic missing where the inventory says, a forced
command that refuses a call the arm needs, another mlx-medic version. This runs, on
every node, over the transport the remediator uses (SSH as the node's login user, its
pinned host key, the remediator's key), the read-only form of every node helper call the
remediator's arm makes (`ARM_CALLS`), and reports per node: `ssh`, one check per call,
and `versions`. Every call goes through `ReadOnlyTransport`
(mlx_medic/doctor/commands.py): a call outside READ_ONLY_HELPER_CALLS is refused before it
is sent. Here, not in mlx_medic.doctor: it reads the remediator's config, and shared code
imports no deployable (tests/test_layering.py); `mlx-medic doctor` imports it by name.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_medic.command_line import CommandError, file_error, version
from mlx_medic.doctor.commands import NotReadOnly, ReadOnlyTransport
from mlx_medic.doctor.framework import (
    BUG_FIX,
    FAILED,
    PASSED,
    SKIPPED,
    CheckResult,
    Status,
)
from mlx_medic.doctor.report import Report
from mlx_medic.node.client import (
    REMEDIATOR,
    HelperCallError,
    HelperMisconfigured,
    HelperReply,
    NodeHelpers,
    helper_argv,
)
from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.node.misconfiguration import MisconfigurationKind
from mlx_medic.remediator.model_health import PROBE_TIMEOUT

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model
    from mlx_medic.inventory.schema import Inventory, Node
    from mlx_medic.transport import NodeTransport

EVERY_NODE, HEAD = "every node of the model", "its head"
# The model lock asks a node whether a lock holder's pid lives there; pid 1 always does.
LOCK_PID_CALL = ("pid-alive", "1")


@dataclass(frozen=True)
class ArmCall:
    """The read-only form of a helper call the arm makes, where it makes it, and who."""

    words: Callable[[Model], tuple[str, ...]]  # the helper and its arguments
    on: str  # EVERY_NODE or HEAD
    used_by: str


ARM_CALLS = (
    ArmCall(lambda m: ("facts", m.name), EVERY_NODE, "preflight, verify, escalation"),
    ArmCall(lambda m: ("orphans", m.name), EVERY_NODE, "sweep-orphans' re-check"),
    ArmCall(lambda m: ("sweep", m.name, "--dry-run"), EVERY_NODE, "recover's sweep"),
    ArmCall(
        lambda m: ("sweep", m.name, "--orphans-only", "--dry-run"), EVERY_NODE, "sweep-orphans"
    ),
    ArmCall(lambda m: ("clean", m.name, "--dry-run"), EVERY_NODE, "clean-tmp"),
    ArmCall(lambda m: ("service", m.name, "status"), HEAD, "the service steps"),
    ArmCall(lambda m: ("backend", m.name, "show"), HEAD, "pin-ring"),
    ArmCall(lambda m: ("lock", m.name, "show"), HEAD, "the model lock"),
    ArmCall(
        lambda m: ("probe", m.name, "--timeout", f"{PROBE_TIMEOUT:g}"),
        HEAD,
        "the health probe on the head",
    ),
)


def calls_on(inventory: Inventory, node: str) -> list[tuple[str, ...]]:
    """Every read-only call the arm's forms make on `node`: the lock's pid question, then
    each call of each model placed there (the head's calls where it heads one)."""
    calls: list[tuple[str, ...]] = [LOCK_PID_CALL]
    for model in inventory.models_on(node):
        calls += [
            call.words(model) for call in ARM_CALLS if call.on == EVERY_NODE or model.head == node
        ]
    return calls


def known_hosts(inventory: Inventory) -> str:
    path = inventory.ssh.known_hosts
    return str(path) if path is not None else "~/.ssh/known_hosts"


def ssh_fix(inventory: Inventory, node: Node, error: str) -> str:
    """The one fix for a node the remediator cannot log in to."""
    if "host key" in error.lower():
        return (
            f"compare {node.ssh}'s host key fingerprint with the one on {node.name}, then"
            f" put `ssh-keyscan -p {node.port} {node.ssh}` in {known_hosts(inventory)}"
            " (replacing its old line, if the key changed)"
        )
    key = inventory.ssh.identity_file or "the remediator user's default key"
    return (
        f"check that {node.name} is up, sshd listens on {node.ssh}:{node.port}, and"
        f" {node.user}'s authorized_keys holds the remediator's key ({key})"
    )


@dataclass
class NodeFindings:
    """What the calls to one node found, as the report's results."""

    node: Node
    inventory: Inventory
    results: list[CheckResult]
    versions: dict[str, str]  # mlx-medic, mlx, mlx-lm as the node's documents say them
    mismatch: HelperMisconfigured | None = None

    def add(self, name: str, status: Status, detail: str, fix: str = "") -> None:
        self.results.append(CheckResult(name, status, detail, fix, self.node.name))

    def answered(self, name: str, reply: HelperReply[Any]) -> None:
        self.versions.setdefault("mlx-medic", str(reply.document.get("version")))
        if isinstance(reply.answer, FactsReply):
            self.versions.setdefault("mlx", reply.answer.mlx or "not installed")
            self.versions.setdefault("mlx-lm", reply.answer.mlx_lm or "not installed")
        self.add(name, PASSED, f"answered, exit {reply.exit_status}, as {self.node.user}")

    def misconfigured(self, name: str, error: HelperMisconfigured) -> None:
        found = error.misconfiguration
        if found.kind is MisconfigurationKind.VERSION_MISMATCH:
            self.mismatch = self.mismatch or error
            self.add(name, SKIPPED, "answered as another mlx-medic: see `versions`")
            return
        path = found.path
        if found.kind is MisconfigurationKind.REFUSED:
            path = f"~{self.node.user}/.ssh/authorized_keys"
        where = f" ({path})" if path and path not in found.detail else ""
        self.add(name, FAILED, f"{found.detail}{where}", found.fix)

    def failed(self, name: str, words: tuple[str, ...], error: HelperCallError) -> None:
        if error.no_answer:
            fix = f"check that {self.node.name} is up and answers SSH; then run the doctor again"
        else:
            argv = shlex.join(helper_argv(self.node, words[0], words[1:]))
            fix = f"run `{argv}` on {self.node.name} as {self.node.user} and fix what it says"
        self.add(name, FAILED, str(error), fix)

    def versions_result(self) -> None:
        if self.mismatch is not None:
            found = self.mismatch.misconfiguration
            self.add("versions", FAILED, found.detail, found.fix)
            return
        if not self.versions:
            self.add("versions", SKIPPED, "no helper answered")
            return
        said = ", ".join(f"{name} {v}" for name, v in self.versions.items())
        self.add("versions", PASSED, f"{said} (this mlx-medic: {version()})")


async def check_node(helpers: NodeHelpers, inventory: Inventory, node: Node) -> list[CheckResult]:
    """`ssh`, each call, `versions` for one node; calls one at a time (one connection)."""
    findings = NodeFindings(node, inventory, [], {})
    calls = calls_on(inventory, node.name)
    call_results: list[tuple[str, tuple[str, ...], HelperReply[Any] | HelperCallError]] = []
    for words in calls:
        kind: type[FactsReply] | str = FactsReply if words[0] == "facts" else words[0]
        try:
            reply: HelperReply[Any] | HelperCallError = await helpers.call(
                node.name, kind, *words[1:]
            )
        except HelperCallError as exc:
            reply = exc
        except NotReadOnly as exc:  # a bug here: the call was never sent
            findings.add(" ".join(words), FAILED, str(exc), BUG_FIX)
            continue
        if isinstance(reply, HelperCallError) and reply.unreachable:
            findings.add("ssh", FAILED, str(reply), ssh_fix(inventory, node, str(reply)))
            for later in calls:
                findings.add(" ".join(later), SKIPPED, f"{node.name} was not reached")
            findings.add("versions", SKIPPED, f"{node.name} was not reached")
            return findings.results
        call_results.append((" ".join(words), words, reply))
    findings.add(
        "ssh",
        PASSED,
        f"{node.user}@{node.ssh}:{node.port}, its host key pinned in {known_hosts(inventory)}",
    )
    for name, words, result in call_results:
        if isinstance(result, HelperMisconfigured):
            findings.misconfigured(name, result)
        elif isinstance(result, HelperCallError):
            findings.failed(name, words, result)
        else:
            findings.answered(name, result)
    findings.versions_result()
    return findings.results


async def check_cluster(inventory: Inventory, transport: NodeTransport) -> list[CheckResult]:
    """Every node at once, each through the read-only guard, results in inventory order."""
    guarded = ReadOnlyTransport(transport)
    helpers = NodeHelpers(
        guarded, inventory, timeout=inventory.ssh.command_timeout, caller=REMEDIATOR
    )
    try:
        per_node = await asyncio.gather(
            *(check_node(helpers, inventory, node) for node in inventory.nodes)
        )
    finally:
        await guarded.close()
    return [result for results in per_node for result in results]


def cluster_header(config: str, inventory: Inventory, inventory_path: Path) -> dict[str, str]:
    identity = inventory.ssh.identity_file or "the user's default keys"
    return {
        "mlx-medic": version(),
        "config": config,
        "inventory": str(inventory_path),
        "ssh": f"each node's login user, key {identity}, known hosts {known_hosts(inventory)}",
        "nodes": ", ".join(node.name for node in inventory.nodes),
    }


def cluster_report(config_file: Path) -> Report:
    """The report of every node of the config's inventory, each reached as the remediator
    reaches it; CommandError (exit 2) when the config or its inventory cannot be read."""
    from mlx_medic.inventory.load import load_inventory
    from mlx_medic.inventory.methods import InventoryError
    from mlx_medic.remediator.config import ConfigError, find_config_file, read_config

    source = find_config_file(config_file)
    if source is None:  # never with the flag given; said rather than asserted
        raise CommandError(f"no remediator config at {config_file}")
    try:
        config = read_config(source)
        inventory = load_inventory(config.inventory)
    except (ConfigError, InventoryError) as exc:
        raise file_error(exc) from None
    results = asyncio.run(check_cluster(inventory, ssh_transport(inventory)))
    header = cluster_header(str(source.path), inventory, config.inventory)
    return Report(header, results, {})


def ssh_transport(inventory: Inventory) -> NodeTransport:
    """The remediator's transport (mlx_medic.remediator.service): asyncssh, pinned keys."""
    from mlx_medic.transport import SshTransport

    return SshTransport(inventory)
