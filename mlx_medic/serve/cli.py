"""`mlx-medic serve MODEL [--inventory FILE]`: the model's service on its head node.

Refuse at once when another wrapper starts or serves the model; else take the model
lock, sweep and clean every node, record the new run (with a lease) everywhere, choose
the backend (durable choice, ledger, smoke test: JACCL, else ring with `--pipeline`),
run mlx.launch with every rank guarded and tagged with the run id, release the lock once
the model answers, and supervise: on SIGTERM/SIGINT or a rank's failure, end every rank
of the run on every node within `policy.stop_timeout`.

Exit status: 0 stopped by a signal after a clean teardown; 1 the start failed or a rank
failed (the reason on stderr, and in the head's serve record unless the model lock could
not be taken); 2 bad arguments; 3 another wrapper starts or serves the model (nothing
touched).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mlx_medic.command_line import add_inventory_flag, add_log_flags, file_error, unknown_model
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.serve.run import EXIT_BAD_ARGUMENTS, EXIT_BUSY, EXIT_FAILED

if TYPE_CHECKING:
    from mlx_medic.serve.record import ServeRecord

log = logging.getLogger("mlx_medic.serve")

DEFAULT_CONFIG = Path("/etc/mlx-medic/inventory.yaml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("model", help="the model's name in the inventory")
    add_inventory_flag(parser, f"the inventory (default {DEFAULT_CONFIG})", DEFAULT_CONFIG)
    add_log_flags(parser)


def run(args: argparse.Namespace) -> int:
    try:
        inventory = load_inventory(args.inventory)
        model = inventory.model(args.model)
    except InventoryError as exc:
        raise file_error(exc, EXIT_BAD_ARGUMENTS) from None
    except KeyError:
        names = (m.name for m in inventory.models)
        raise unknown_model(args.model, names, args.inventory) from None
    return asyncio.run(serve(inventory, model))


def wrapper_ssh(inventory: Inventory, model: Model) -> Inventory:
    """The inventory as the wrapper reaches the peers: with its own key (`serve.identity_file`,
    else the service user's default keys), never the remediator's `ssh.identity_file`."""
    ssh = inventory.ssh.model_copy(update={"identity_file": model.serve.identity_file})
    return inventory.model_copy(update={"ssh": ssh})


async def serve(inventory: Inventory, model: Model) -> int:
    from mlx_medic.model_lock import ModelLocks, process_start_time
    from mlx_medic.node.client import NodeHelpers
    from mlx_medic.serve.nodes import ModelNodes, StartRefused
    from mlx_medic.serve.record import RecordKeeper, read_serve_record
    from mlx_medic.serve.relaunch import Relaunches
    from mlx_medic.serve.run import RunResult, ServeRun, WrapperContext
    from mlx_medic.serve.start import AlreadyServed, phase, refuse_if_live, take_lock
    from mlx_medic.state.files import StateFileError
    from mlx_medic.state.runs import new_run_id
    from mlx_medic.transport import LocalTransport, RoutedTransport, SshTransport

    logging.getLogger("asyncssh").setLevel(logging.WARNING)  # one line per channel otherwise
    state_dir = inventory.state_dir
    try:
        previous = read_serve_record(state_dir, model.name)
    except StateFileError as exc:
        log.warning("the serve record cannot be read (%s); starting afresh", exc)
        previous = None
    try:
        refuse_if_live(model, previous)
    except AlreadyServed as exc:
        print(f"mlx-medic serve: {exc}", file=sys.stderr)
        return EXIT_BUSY
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        log.warning(
            "serve %s: %s: ending every rank of this run", model.name, signal.Signals(signum).name
        )
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    peers = SshTransport(wrapper_ssh(inventory, model))
    transport = RoutedTransport(model.head, LocalTransport(), peers)
    limit = model.policy.kill_grace + inventory.ssh.connect_timeout + 30.0
    nodes = ModelNodes(NodeHelpers(transport, inventory, limit), model, limit)
    locks = ModelLocks(inventory, transport, this_node=model.head, in_process=True)
    relaunches = Relaunches(
        model.serve.relaunch_limit, model.serve.relaunch_window, model.serve.relaunch_interval
    )
    holder = f"serve pid {os.getpid()} on {model.head}"
    records: RecordKeeper | None = None
    ended: ServeRun | None = None  # a run that crashed, whose ranks the next start sweeps
    not_before = 0.0
    try:
        while True:
            run_id = new_run_id()
            try:
                with phase("model lock"):
                    lock = await take_lock(locks, model, run_id)
            except (AlreadyServed, StartRefused) as exc:
                print(f"mlx-medic serve: {exc}", file=sys.stderr)
                if ended is not None:  # leave nothing of the crashed run behind
                    await ended.teardown(RunResult(EXIT_FAILED))
                return EXIT_BUSY if isinstance(exc, AlreadyServed) else EXIT_FAILED
            if records is None:
                try:  # a wrapper recorded between our first look and the lock
                    with contextlib.suppress(StateFileError):
                        refuse_if_live(model, read_serve_record(state_dir, model.name))
                except AlreadyServed as exc:
                    await locks.release(lock)
                    print(f"mlx-medic serve: {exc}", file=sys.stderr)
                    return EXIT_BUSY
                records = RecordKeeper(
                    state_dir,
                    model.name,
                    first_record(previous, run_id, os.getpid(), process_start_time(os.getpid())),
                )
            else:
                records.update("starting", run_id=run_id)
            log.info("serve %s: run %s starting (%s)", model.name, run_id, holder)
            context = WrapperContext(
                inventory,
                model,
                run_id,
                holder,
                nodes,
                locks,
                lock,
                stop,
                records,
                not_before,
                ended.w.run_id if ended is not None else None,
            )
            run = ServeRun(context)
            result = await run.run()
            if not result.relaunch or not relaunches.allow():
                if result.relaunch:
                    log.error(
                        "serve %s: %d relaunches within %gs spent (serve.relaunch_limit):"
                        " exiting, for the service manager to restart",
                        model.name,
                        model.serve.relaunch_limit,
                        model.serve.relaunch_window,
                    )
                await run.teardown(result)
                return result.code
            relaunches.record()
            await run.end_launch()
            ended = run
            not_before = relaunches.not_before(result.launched_at)
            log.warning(
                "serve %s: relaunching at once (%d of %d within %gs); the start sweep"
                " ends what the crashed launch left on every node",
                model.name,
                relaunches.used,
                model.serve.relaunch_limit,
                model.serve.relaunch_window,
            )
    finally:
        await transport.close()


def first_record(
    previous: ServeRecord | None, run_id: str, pid: int, pid_start: float | None
) -> ServeRecord:
    """This wrapper's record, carrying over what a KeepAlive restart must not lose: why
    the last start failed (the fallback's evidence, kept until a start serves) and each
    backend's last success and error (the smoke test's skip rule)."""
    from mlx_medic.serve.record import ServeRecord

    if previous is None:
        return ServeRecord(run_id, pid, pid_start, "starting")
    return ServeRecord(
        run_id,
        pid,
        pid_start,
        "starting",
        failed_starts=previous.failed_starts,
        failures=previous.failures,
        reboot=previous.reboot,
        last_jaccl_success=previous.last_jaccl_success,
        jaccl_error_at=previous.jaccl_error_at,
        last_ring_success=previous.last_ring_success,
        ring_error_at=previous.ring_error_at,
    )
