"""`mlx-medic node service MODEL stop|start|restart|status`: the model's service on its head,
through the service manager's own command, and the record of who stopped it.

`stop --by RUN` writes "stopped by RUN" BEFORE it runs the manager's stop, so a service
left stopped (the caller crashed, gave up, or the stop half-worked) is always explained on
the head, and answers with the record it replaced (`replaced`: a stop another run, say a
replica that died, left behind); `start` and `restart` clear the record only after the
manager's command succeeded, and report where the head stood just before it
(`log_sizes`, the serve wrapper's `failed_starts`: a verify reads what this start did).
Only the manager's command goes through `sudo -n` (`service_argv`); this helper runs as
the service user. supervisord without sudo, its config named: the helper asks supervisord
over the socket that config's `[supervisorctl]` section names (the same XML-RPC calls
supervisorctl makes, `rpc` in the document, `argv` null) instead of starting supervisorctl,
a Python program of its own; any other config runs supervisorctl.

A stop of a job that is already gone counts as stopped (decided here, from the managers'
verbatim answers, not guessed):
- launchd: `launchctl bootout system/LABEL` of a job that is not loaded exits 3 with
  `Boot-out failed: 3: No such process` (seen verbatim in DeterminateSystems/nix-installer
  issue #1148 and TOSS-Soft/toss-agent-runtime issue #42);
- supervisord (4.2.5) and systemd already exit 0 for a stop of a stopped job
  (`PROGRAM: ERROR (not running)`, exit 0: shown by this helper's test).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_medic.node.cli import (
    EXIT_FAILED,
    EXIT_OK,
    HelperError,
    add_node_arguments,
    emit,
    node_context,
)
from mlx_medic.node.log_marks import log_sizes
from mlx_medic.node.model_arg import placed_model
from mlx_medic.platform.commands import (
    CommandError,
    CommandNotFound,
    CommandTimeout,
    run_command,
)
from mlx_medic.platform.supervisord_config import SupervisorSocket, socket_of
from mlx_medic.serve.record import read_serve_record
from mlx_medic.service_manager import ServiceAction, service_argv
from mlx_medic.state.files import StateFileError
from mlx_medic.state.service_stop import (
    ServiceStop,
    clear_service_stop,
    read_service_stop,
    record_service_stop,
)

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Service

DEFAULT_TIMEOUT = 120.0
LAUNCHD_NOT_LOADED = (3, "Boot-out failed: 3: No such process")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an inventory model whose head is this node")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    stop = actions.add_parser("stop", help="record who stops it, then stop it")
    stop.add_argument("--by", required=True, help="the run (or person) that stops it")
    stop.add_argument("--reason", default="", help="why, for the record")
    start = actions.add_parser("start", help="start it; clear the stop record after success")
    start.add_argument("--by", default="", help="who starts it (shown in the document)")
    restart = actions.add_parser("restart", help="restart it; clear the record after success")
    for sub in (stop, start, restart):
        sub.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            help=f"the manager command's limit ({DEFAULT_TIMEOUT:g}s)",
        )
    status = actions.add_parser("status", help="the stop record, or null")
    for sub in (stop, start, restart, status):
        add_node_arguments(sub)


def _record(stop: ServiceStop | None) -> dict[str, Any] | None:
    return asdict(stop) if stop is not None else None


def already_stopped(manager: str, exit_status: int, stderr: str) -> bool:
    """The manager's failed stop says the job was not there to stop (launchd only)."""
    status, message = LAUNCHD_NOT_LOADED
    return manager == "launchd" and exit_status == status and message in stderr


def run_manager(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(exit status or None when it did not run or finish, stdout, stderr)."""
    try:
        done = run_command(argv, timeout)
    except CommandNotFound:
        return None, "", f"{argv[0]}: not found"
    except CommandTimeout as exc:
        return None, exc.stdout, f"{argv[0]} did not finish within {timeout:g}s"
    except CommandError as exc:
        return None, "", str(exc)  # could not run it (not executable, ...): the reason
    return done.returncode, done.stdout, done.stderr


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    model = placed_model(context, args.model, on_head=True)
    state_dir = context.state_dir
    action: str = args.action
    try:
        if action == "status":
            stop = read_service_stop(state_dir, model.name)
            document: dict[str, Any] = {
                "model": model.name,
                "action": action,
                "argv": None,
                "rpc": None,
                "exit_status": None,
                "stdout": "",
                "stderr": "",
                "stopped_by": _record(stop),
            }
            where = f"stopped by {stop.run} ({stop.reason})" if stop else "no stop recorded"
            emit("service", document, args.json, f"{model.name}: {where}")
            return EXIT_OK
        replaced = None
        if action == "stop":  # the record it replaces: a stop another run left
            replaced = read_service_stop(state_dir, model.name)
            record_service_stop(state_dir, model.name, args.by, args.reason)
        wanted = _action(action)
        rpc_socket = supervisord_socket(model.service)
        # where the head stands before a start: a verify reads what this start did
        marks = log_sizes(model.log_files) if action != "stop" else None
        failed_starts = _failed_starts(state_dir, model.name) if action != "stop" else None
        began = time.monotonic()
        argv: list[str] | None = None
        rpc: dict[str, Any] | None = None
        if rpc_socket is not None:  # http.client and xmlrpc only here
            from mlx_medic.platform.supervisord_rpc import ask_supervisord, methods

            label = model.service.label
            rpc = {"socket": str(rpc_socket.path), "methods": methods(wanted), "name": label}
            exit_status, stdout, stderr = ask_supervisord(rpc_socket, wanted, label, args.timeout)
            asked = f"supervisord at {rpc_socket.url}"
        else:
            argv = service_argv(model, wanted)
            exit_status, stdout, stderr = run_manager(argv, args.timeout)
            asked = " ".join(argv)
        manager_seconds = round(time.monotonic() - began, 3)
        done = exit_status == 0 or (
            action == "stop"
            and exit_status is not None
            and already_stopped(model.service.manager, exit_status, stderr)
        )
        cleared = None
        if done and action != "stop":
            cleared = read_service_stop(state_dir, model.name)
            clear_service_stop(state_dir, model.name)
        stop = read_service_stop(state_dir, model.name)
    except (StateFileError, ValueError) as exc:
        raise HelperError(str(exc)) from None
    document = {
        "model": model.name,
        "action": action,
        "argv": argv,
        "rpc": rpc,
        "exit_status": exit_status,
        "stdout": stdout,
        "stderr": stderr,
        "stopped_by": _record(stop),
        "done": done,
        # the manager's own time (a stop waits out the job's exit, up to its stop
        # grace): kept apart from the remediator's own time in the run log
        "manager_seconds": manager_seconds,
    }
    if action == "stop":
        document["replaced"] = _record(replaced)
    if action == "start":
        document["started_by"] = args.by
    if action != "stop":
        document["cleared"] = _record(cleared)
        document["log_sizes"], document["failed_starts"] = marks, failed_starts
    verdict = "done" if done else f"failed (exit {exit_status}): {stderr.strip()[-300:]}"
    emit("service", document, args.json, f"{model.name}: {action} {verdict}")
    if not done:
        print(
            f"mlx-medic node service: {asked}: exit {exit_status}: {stderr.strip()}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def supervisord_socket(service: Service) -> SupervisorSocket | None:
    """supervisord's socket, where the helper asks it directly instead of running
    supervisorctl (`Service.socket_config`, and a unix socket in that config)."""
    config = service.socket_config
    return socket_of(config) if config is not None else None


def _failed_starts(state_dir: Path, model: str) -> int | None:
    """The serve wrapper's count of failed starts of the model; None without its record."""
    try:
        record = read_serve_record(state_dir, model)
    except StateFileError:
        return None
    return record.failed_starts if record is not None else None


def _action(action: str) -> ServiceAction:
    if action not in ("stop", "start", "restart"):
        raise ValueError(f"unknown service action {action!r}")
    return action  # type: ignore[return-value]
