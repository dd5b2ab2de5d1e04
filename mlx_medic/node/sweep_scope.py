"""The sweep's scope rules: which processes of this node are a model's to end (a role and
one of its keys, or a role and one of its run ids; never an `mlx-medic` command), and the
backend a rank runs on. Stricter than the exporter's scoping, which only counts
(mlx_medic.node.sweep says why).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from mlx_medic.processes.command_line import flag_value, invocation, launch_script_env
from mlx_medic.processes.info import (
    ENV_HOSTFILE,
    ENV_IBV_DEVICES,
    ENV_JACCL_COORDINATOR,
    ENV_MODEL,
    ENV_RANK,
    ProcessInfo,
)
from mlx_medic.processes.orphans import run_id_of
from mlx_medic.processes.scope import ModelScoper, scope_argv, under_any

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model


class Mode(StrEnum):
    SCOPE = "scope"  # everything in scope
    ORPHANS_ONLY = "orphans-only"  # what the shared orphan rules call orphans
    RUN = "run"  # the processes of one run
    START_SWEEP = "start-sweep"  # the serve wrapper's own start sweep, under the model lock


def is_medic_command(cmdline: tuple[str, ...]) -> bool:
    """`mlx-medic ...` or `python -m mlx_medic...`: the wrapper, a helper, the exporter."""
    inv = invocation(cmdline)
    if inv is None:
        return False
    if inv.kind == "module":
        return inv.target == "mlx_medic" or inv.target.startswith("mlx_medic.")
    return inv.kind in ("script", "program") and inv.target == "mlx-medic"


def model_tag(proc: ProcessInfo) -> str | None:
    return proc.env.get(ENV_MODEL) or launch_script_env(proc.cmdline).get(ENV_MODEL) or None


def carries_key(proc: ProcessInfo, model: Model, run_ids: set[str]) -> bool:
    """One of the model's keys: its `--model`, `--port`, a path under its tmp dirs, its
    model tag, or one of `run_ids` (the model's runs)."""
    argv = scope_argv(proc.cmdline)
    if flag_value(argv, "--model") == model.model:
        return True
    if flag_value(argv, "--port") == str(model.port):
        return True
    if model.tmp_dirs and any(under_any(arg, model.tmp_dirs) for arg in argv):
        return True
    if model_tag(proc) == model.name:
        return True
    run_id = run_id_of(proc)
    return run_id is not None and run_id in run_ids


def in_sweep_scope(proc: ProcessInfo, model: Model, scoper: ModelScoper, run_ids: set[str]) -> bool:
    """The model's pattern (a role, and the exporter's scoping says this model) and one of
    its keys, or a role and one of the model's run ids; never an `mlx-medic` command."""
    if proc.role is None or is_medic_command(proc.cmdline):
        return False
    found = scoper.model_of(proc)
    if found is None and run_id_of(proc) in run_ids:
        return True  # placed by nothing else, but tagged with one of the model's runs
    return found == model.name and carries_key(proc, model, run_ids)


def is_jaccl_rank(proc: ProcessInfo) -> bool:
    return ENV_IBV_DEVICES in proc.env or ENV_JACCL_COORDINATOR in proc.env


def backend_of(proc: ProcessInfo) -> str:
    """The backend a process is a rank of: jaccl, ring, none (no rank: a launcher, an ssh
    client), or unknown (a rank whose placement its environment does not say)."""
    if is_jaccl_rank(proc):
        return "jaccl"
    if ENV_HOSTFILE in proc.env:
        return "ring"
    return "unknown" if ENV_RANK in proc.env or proc.role == "rank" else "none"
