"""What a failed helper call says about how mlx-medic is deployed on the node, as data.

A node can answer and still be unusable for a reason no retry changes and no person
should have to dig out of stderr: its helper cannot read its inventory, mlx-medic is not
installed where the inventory says, its forced command refuses the call, or it runs
another mlx-medic than the caller. Each is a `Misconfiguration`: the node, its kind, what
was found, the path concerned and the one fix. `classify_document` and `classify_failure`
read it from what came back (mlx_medic.node.client raises it as HelperMisconfigured);
anything else stays the caller's plain HelperCallError.

Versions: every helper document carries its `schema` and the mlx-medic `version` that
wrote it (mlx_medic.node.cli.helper_document). A caller uses only documents of its own
schema and version: the nodes are upgraded first, then the remediator, and until both
run the same version the caller refuses before any step acts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mlx_medic.command_line import EXIT_USAGE, version
from mlx_medic.node.cli import SCHEMA

UPGRADE_ORDER = "nodes first, then the remediator"
SHELL_NOT_FOUND = 127  # what a shell answers for a command that is not there
SHELL_NOT_EXECUTABLE = 126  # there, but not something it can run

# `mlx-medic node lock: /etc/mlx-medic/inventory.yaml: cannot read: No such file or directory`
# (mlx_medic.node.cli.helper_inventory; the forced command's own inventory alike)
_CANNOT_READ = re.compile(
    r"^mlx-medic node (?P<helper>[\w-]+): (?P<path>.+?): cannot read: (?P<why>.+)$", re.M
)
_REFUSED = re.compile(r"^mlx-medic forced command: refused .*$", re.M)
# argparse's own words when a helper does not know a flag or a helper the caller sends
_UNKNOWN_TO_IT = re.compile(
    r"error: (?P<what>unrecognized arguments: .+|argument [^:]+: invalid choice: .+)$", re.M
)


class MisconfigurationKind(StrEnum):
    """The `kind` label of mlx_medic_node_misconfigured_total."""

    CONFIG_UNREADABLE = "config-unreadable"
    HELPER_MISSING = "helper-missing"
    REFUSED = "refused"
    VERSION_MISMATCH = "version-mismatch"


@dataclass(frozen=True)
class Misconfiguration:
    """A node whose mlx-medic cannot serve this call as deployed: `kind`, what was found
    (`detail`), the file concerned (`path`, when there is one) and the one `fix`."""

    node: str
    kind: MisconfigurationKind
    detail: str
    path: str | None
    fix: str

    def __str__(self) -> str:
        return f"{self.detail}; fix: {self.fix}"


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def _later(schema: object) -> bool:
    """A helper document schema from after the caller's."""
    return isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA


def version_mismatch(
    node: str, theirs: str | None, caller: str, schema: object = SCHEMA
) -> Misconfiguration:
    """`node` runs mlx-medic `theirs` (None: one from before documents carried a version),
    the caller this one: upgrade the older side, nodes first."""
    ours = version()
    if theirs is not None:
        running = f"mlx-medic {theirs}"
    else:
        running = f"an mlx-medic older than {ours}" if schema == SCHEMA else "another mlx-medic"
    if schema != SCHEMA:
        running += f" (helper documents of schema {schema!r}, not {SCHEMA})"
    detail = f"{node} runs {running}, {caller} {ours}"
    newer = _numbers(theirs) > _numbers(ours) if theirs is not None else _later(schema)
    if newer:
        to = f"mlx-medic {theirs}" if theirs is not None else f"the mlx-medic {node} runs"
        fix = f"upgrade {caller} to {to} ({UPGRADE_ORDER}: {node} is done)"
    else:
        fix = f"upgrade mlx-medic on {node} to {ours} ({UPGRADE_ORDER})"
    return Misconfiguration(node, MisconfigurationKind.VERSION_MISMATCH, detail, None, fix)


def classify_document(node: str, document: dict[str, Any], caller: str) -> Misconfiguration | None:
    """A helper's document (it has `schema` and `command`) of another schema or mlx-medic
    version than the caller's, or from before documents carried a version."""
    theirs, schema = document.get("version"), document.get("schema")
    if schema == SCHEMA and theirs == version():
        return None
    return version_mismatch(node, theirs if isinstance(theirs, str) else None, caller, schema)


def classify_failure(
    node: str, argv: Sequence[str], exit_status: int, stderr: str, caller: str
) -> Misconfiguration | None:
    """A call that gave no helper document: a deployment problem this names, or None."""
    command = argv[0] if argv else "mlx-medic"
    if exit_status in (SHELL_NOT_FOUND, SHELL_NOT_EXECUTABLE):
        why = "not found" if exit_status == SHELL_NOT_FOUND else "not executable"
        said = stderr.strip().splitlines()[-1:] or [f"exit {exit_status}"]
        return Misconfiguration(
            node,
            MisconfigurationKind.HELPER_MISSING,
            f"mlx-medic on {node} is {why} at {command} ({said[0][:300]})",
            command,
            f"install mlx-medic on {node} at {command} (nodes.{node}.medic_command)",
        )
    if exit_status != EXIT_USAGE:
        return None
    if (refused := _REFUSED.search(stderr)) is not None:
        return Misconfiguration(
            node,
            MisconfigurationKind.REFUSED,
            f"{node}'s forced command refused the call: {refused.group(0)[:300]}",
            None,
            f"render and install authorized-keys for {node} again (mlx-medic render"
            " authorized-keys): its forced command does not allow this call",
        )
    if (unreadable := _CANNOT_READ.search(stderr)) is not None:
        path = unreadable["path"]
        setting = f"nodes.{node}.medic_config"
        if unreadable["helper"] == "forced-command":  # the inventory its key line names
            setting = f"render and install authorized-keys for {node} again from {setting}"
        else:
            setting = f"set {setting} to where it is"
        return Misconfiguration(
            node,
            MisconfigurationKind.CONFIG_UNREADABLE,
            f"mlx-medic on {node} cannot read its inventory {path}: {unreadable['why']}",
            path,
            f"put the inventory at {path} on {node}, or {setting}",
        )
    if (unknown := _UNKNOWN_TO_IT.search(stderr)) is not None:
        found = version_mismatch(node, None, caller)
        detail = f"{found.detail}: it does not know this call ({unknown['what'][:200]})"
        return Misconfiguration(node, found.kind, detail, None, found.fix)
    return None
