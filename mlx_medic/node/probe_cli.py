"""`mlx-medic node probe MODEL [--timeout SECONDS]`: the model's health probe on its head,
where its server is reached (a model listening on loopback answers nowhere else).

The remediator asks it over SSH when the model is to be probed on its head
(remediator.model_health): from its own machine, 127.0.0.1 is the wrong machine, and
"connection refused" there would act on a healthy model. The same probe as `mlx-medic
probe` (mlx_medic.probe_cli, whose --timeout and verdict it shares), at the address the
head reaches the model on (health.probe_host) and its port, under the node's probe locks
(health.probe_lock_dir), so it never overlaps the exporter's probe of the same server.
The inventory says where: the key may ask for no other address, port or dir.

Exit 0 with the verdict in the document, whatever it is; 1 when it cannot probe (the
probe locks cannot be used: no verdict, so nothing acts on it); 2 for a bad command line.
"""

from __future__ import annotations

import argparse

from mlx_medic.health import ProbeAnswer, probe_host, probe_lock_dir, probe_model
from mlx_medic.node.cli import EXIT_OK, HelperError, add_node_arguments, emit, node_context
from mlx_medic.node.model_arg import placed_model
from mlx_medic.probe_cli import add_timeout_argument
from mlx_medic.state.layout import StateFileError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an inventory model whose head is this node")
    add_timeout_argument(parser)
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    model = placed_model(context, args.model, on_head=True)
    host = probe_host(model.host)
    try:
        lock_dir = probe_lock_dir(context.state_dir)
        result = probe_model(host, model.port, timeout=args.timeout, lock_dir=lock_dir)
    except StateFileError as exc:  # a lock this user may not use: no probe, no verdict
        raise HelperError(f"cannot use the probe locks: {exc}") from None
    answer = ProbeAnswer.of(result)
    verdict = "up" if answer.up else "down" if answer.conclusive else "inconclusive"
    document = {"model": model.name, "host": host, "port": model.port, **answer.to_document()}
    text = f"{model.name} on {host}:{model.port}: {verdict}: {answer.reason}"
    emit("probe", document, args.json, text)
    return EXIT_OK
