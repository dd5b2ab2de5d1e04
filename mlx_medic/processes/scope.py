"""Scope: which model a process belongs to.

With an inventory, a process is put in a model's scope by its run tag, the model's
process patterns, its serving port, its arguments under the model's tmp dirs, or its
`--model` path (`ModelScoper`); without one, processes are grouped by `--model`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from mlx_medic.processes.command_line import flag_value, launch_script_env, launched_command
from mlx_medic.processes.info import ENV_MODEL, ProcessInfo, Role
from mlx_medic.processes.roles import PatternSet

if TYPE_CHECKING:  # types only: discovery mode never loads the inventory's schema
    from mlx_medic.inventory.model import Model
    from mlx_medic.inventory.schema import Inventory

UNKNOWN_MODEL = "unknown"
EXO_MODEL = "exo"


def scope_argv(proc_cmdline: Sequence[str]) -> tuple[str, ...]:
    """The argv that says what a process serves: the rank's own for ssh clients."""
    return launched_command(proc_cmdline) or tuple(proc_cmdline)


def under_any(path: str, roots: Iterable[os.PathLike[str] | str]) -> bool:
    """An absolute path at or below one of `roots` (lexically: no link is resolved)."""
    if not path.startswith("/"):
        return False
    candidate = PurePosixPath(os.path.normpath(path))
    for root in roots:
        root_path = PurePosixPath(str(root))
        if candidate == root_path or root_path in candidate.parents:
            return True
    return False


class ModelScoper:
    """Puts a process in a model's scope.

    With an inventory: the run tag's model, else the model whose process patterns match
    (for an ssh client: the rank command it launches), else the serving port (`--port`),
    else an argument under the model's tmp dirs, else the `--model` path. A process on a
    port no model serves stays out of scope even if its `--model` matches: a manual test
    server is not the service's rank. Without an inventory, processes are grouped by their
    `--model` argument.
    """

    def __init__(self, inventory: Inventory | None):
        self.models: list[Model] = list(inventory.models) if inventory else []
        self.discovery = inventory is None or not self.models
        self.patterns = PatternSet.of(inventory)

    def model_of(self, proc: ProcessInfo) -> str | None:
        if proc.role is Role.EXO_RUNNER:
            return EXO_MODEL  # exo places models itself; its runners carry no model argument
        argv = scope_argv(proc.cmdline)
        tagged = proc.env.get(ENV_MODEL) or launch_script_env(proc.cmdline).get(ENV_MODEL)
        model_arg = flag_value(argv, "--model")
        if self.discovery:
            return tagged or model_arg or UNKNOWN_MODEL
        names = {m.name for m in self.models}
        if tagged in names:
            return tagged
        matched = self.patterns.match(argv)
        if matched is not None:
            return matched.model
        port = flag_value(argv, "--port")
        if port is not None:
            by_port = [m for m in self.models if str(m.port) == port]
            if len(by_port) > 1 and model_arg is not None:
                by_port = [m for m in by_port if m.model == model_arg] or by_port
            return by_port[0].name if by_port else None
        for model in self.models:
            if model.tmp_dirs and any(under_any(arg, model.tmp_dirs) for arg in argv):
                return model.name
        by_path = [m for m in self.models if model_arg is not None and m.model == model_arg]
        return by_path[0].name if len(by_path) == 1 else None
