"""`mlx-medic serve MODEL [--config.file FILE]`: the model's service on its head node.

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

from mlx_medic.inventory import Inventory, InventoryError, Model, load_inventory
from mlx_medic.serve.run import EXIT_BAD_ARGUMENTS, EXIT_BUSY, EXIT_FAILED

log = logging.getLogger("mlx_medic.serve")

DEFAULT_CONFIG = Path("/etc/mlx-medic/inventory.yaml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("model", help="the model's name in the inventory")
    parser.add_argument("--config.file", dest="config_file", type=Path, default=DEFAULT_CONFIG,
                        help=f"the inventory (default {DEFAULT_CONFIG})")


def run(args: argparse.Namespace) -> int:
    try:
        inventory = load_inventory(args.config_file)
        model = inventory.model(args.model)
    except InventoryError as exc:
        print(f"mlx-medic serve: {exc.report()}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    except KeyError:
        print(f"mlx-medic serve: no model {args.model!r} in {args.config_file}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    return asyncio.run(serve(inventory, model))


def wrapper_ssh(inventory: Inventory, model: Model) -> Inventory:
    """The inventory as the wrapper reaches the peers: with its own key (`serve.identity_file`,
    else the service user's default keys), never the remediator's `ssh.identity_file`."""
    ssh = inventory.ssh.model_copy(update={"identity_file": model.serve.identity_file})
    return inventory.model_copy(update={"ssh": ssh})


async def serve(inventory: Inventory, model: Model) -> int:
    from mlx_medic.model_lock import ModelLocks, process_start_time
    from mlx_medic.node.client import NodeHelpers
    from mlx_medic.runs import new_run_id
    from mlx_medic.serve.nodes import ModelNodes, StartRefused
    from mlx_medic.serve.record import RecordKeeper, ServeRecord, read_serve_record
    from mlx_medic.serve.run import RunContext, ServeRun
    from mlx_medic.serve.start import AlreadyServed, refuse_if_live, take_lock
    from mlx_medic.state_files import StateFileError
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
    run_id = new_run_id()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        log.warning("serve %s: %s: ending every rank of this run", model.name,
                    signal.Signals(signum).name)  # fmt: skip
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    peers = SshTransport(wrapper_ssh(inventory, model))
    transport = RoutedTransport(model.head, LocalTransport(), peers)
    limit = model.policy.kill_grace + inventory.ssh.connect_timeout + 30.0
    nodes = ModelNodes(NodeHelpers(transport, inventory, limit), model, limit)
    locks = ModelLocks(inventory, transport, this_node=model.head)
    try:
        try:
            lock = await take_lock(locks, model, run_id)
        except AlreadyServed as exc:
            print(f"mlx-medic serve: {exc}", file=sys.stderr)
            return EXIT_BUSY
        except StartRefused as exc:
            print(f"mlx-medic serve: {exc}", file=sys.stderr)
            return EXIT_FAILED
        try:  # a wrapper recorded between our first look and the lock
            with contextlib.suppress(StateFileError):
                refuse_if_live(model, read_serve_record(state_dir, model.name))
        except AlreadyServed as exc:
            await locks.release(lock)
            print(f"mlx-medic serve: {exc}", file=sys.stderr)
            return EXIT_BUSY
        records = RecordKeeper(state_dir, model.name, ServeRecord(
            run_id, os.getpid(), process_start_time(os.getpid()), "starting",
            failed_starts=previous.failed_starts if previous else 0,
            # a KeepAlive restart must not hide why the last start failed (the fallback's
            # evidence): kept until a start serves
            failures=previous.failures if previous else (),
            last_jaccl_success=previous.last_jaccl_success if previous else None,
            jaccl_error_at=previous.jaccl_error_at if previous else None,
        ))  # fmt: skip
        holder = f"serve pid {os.getpid()} on {model.head}"
        log.info("serve %s: run %s starting (%s)", model.name, run_id, holder)
        context = RunContext(inventory, model, run_id, holder, nodes, locks, lock, stop, records)
        return await ServeRun(context).run()
    finally:
        await transport.close()
