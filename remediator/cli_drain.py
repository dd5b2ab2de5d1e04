"""`mlx-medic drain NODE [--yes] [--silence --alertmanager.url URL]`: take a node out of
service before a person reboots it (seed 000: only a reboot frees what a `Us+` survivor
holds).

It shows first what it will do: every model placed on the node, each one's other nodes,
the backend each serves on now and on meanwhile (none: every backend places a rank on the
node), and the protection domains the node's survivors of SIGKILL hold. Unless `--yes`, it
asks. Then it pauses automatic remediation of each model, runs the `drain` playbook for
each (stop the service, with the drain as the head's stop record; sweep every node of the
model, so no rank is left an orphan), optionally silences the node's alerts and each
model's in Alertmanager (v2 API; the silences expire by themselves after `--silence.for`)
and journals the drain with the node's boot id. `mlx-medic undrain NODE` ends it.

Exit status: 0 drained; 1 drained, but a model's stop did not succeed (journaled), or the
node's record or a silence could not be made (said on stderr); 2 nothing done: usage,
config, unknown node, already drained, not confirmed, the node did not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from mlx_medic.inventory.fields import parse_duration
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import HelperCallError
from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.remediator.cli_common import CliError, OnCall, add_config_argument, run_oncall
from mlx_medic.remediator.cli_remediate import manual_engine
from mlx_medic.remediator.drain import (
    DRAIN_EVENT,
    DrainRecord,
    SilenceError,
    create_silence,
    open_drains,
)
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.outcomes import RunOutcome
from mlx_medic.remediator.playbooks import Playbook
from mlx_medic.remediator.playbooks.drain import DRAIN, UNDRAIN, DrainPlaybook, UndrainPlaybook


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("node", help="the node's name in the inventory")
    parser.add_argument("--yes", action="store_true", help="drain without asking")
    parser.add_argument(
        "--silence",
        action="store_true",
        help="silence the node's alerts and those of each model placed there (needs"
        " --alertmanager.url); the silence ids are journaled and undrain expires them",
    )
    parser.add_argument(
        "--alertmanager.url",
        dest="alertmanager",
        default=None,
        metavar="URL",
        help="Alertmanager's base URL for --silence, e.g. http://alertmanager:9093",
    )
    parser.add_argument(
        "--silence.for",
        dest="silence_for",
        metavar="DURATION",
        default="4h",
        help="how long the silences last unless undrain expires them first (default 4h)",
    )


def run(args: argparse.Namespace) -> int:
    return run_oncall(args, lambda oncall: drain(oncall, args), writes=True)


def checked_node(inventory: Inventory, node: str, config_inventory: object) -> str:
    names = [n.name for n in inventory.nodes]
    if node not in names:
        raise CliError(f"no node {node!r} in {config_inventory} (known: {', '.join(names)})")
    return node


def drain(oncall: OnCall, args: argparse.Namespace) -> int:
    inventory = oncall.load_inventory()
    node = checked_node(inventory, args.node, oncall.config.inventory)
    already = open_drains(oncall.journal).get(node)
    if already is not None:
        raise CliError(
            f"{node} is drained already (by {already.by}, boot {already.boot_id}); end it"
            f" with `{oncall.command('undrain', node)}` after the reboot"
        )
    ends = None
    if args.silence:
        if not args.alertmanager:
            raise CliError("--silence needs --alertmanager.url (Alertmanager's base URL)")
        try:
            ends = time.time() + parse_duration(args.silence_for)
        except ValueError as exc:
            raise CliError(f"--silence.for: {exc}") from None
    return asyncio.run(_drain(oncall, args, inventory, node, ends))


async def run_playbook(engine: Engine, model: str, playbook: str) -> bool:
    """A by-hand run of `playbook` for the model, said in a line; whether it succeeded."""
    run_id = await engine.run_manual(model, dry_run=False, playbook=playbook)
    view = engine.journal.get_run(run_id)
    assert view is not None
    print(f"run {run_id} ({playbook} {model}): {view.outcome}: {view.detail}")
    return view.outcome == RunOutcome.SUCCEEDED


def drain_playbooks(node: str) -> dict[str, Playbook]:
    return {DRAIN: DrainPlaybook(node), UNDRAIN: UndrainPlaybook()}


async def node_drain_record(engine: Engine, node: str, *args: str) -> str:
    """`node drain set|clear ...` on `node` (the record on the node); what went wrong, if
    anything (the journal keeps the drain whatever the node said)."""
    try:
        reply = await engine.helpers.call(node, "drain", *args)
    except HelperCallError as exc:
        return f"the drain record on {node} not {args[0]}: {exc}"
    if not reply.ok:
        return f"the drain record on {node} not {args[0]}: {reply.stderr.strip()[-300:]}"
    return ""


async def node_facts(engine: Engine, node: str, model: str | None) -> FactsReply:
    """`node facts [MODEL]` on `node`; CliError naming the node when it cannot answer."""
    try:
        reply = await engine.helpers.call(node, FactsReply, *([model] if model else []))
    except HelperCallError as exc:
        raise CliError(f"{node} did not answer `node facts`: {exc}") from None
    if not reply.ok or reply.answer.boot_id is None:
        raise CliError(f"{node}: `node facts` gave no boot id: {reply.stderr.strip()[-300:]}")
    return reply.answer


async def _drain(
    oncall: OnCall, args: argparse.Namespace, inventory: Inventory, node: str, ends: float | None
) -> int:
    models = inventory.models_on(node)
    async with manual_engine(oncall, inventory, drain_playbooks(node)) as engine:
        facts = await node_facts(engine, node, models[0].name if models else None)
        print(f"drain {node} (boot {facts.boot_id}):")
        for model in models:
            others = [n for n in model.nodes if n != node]
            head = await node_facts(engine, model.head, model.name)
            now = head.serving_backend or "not serving"
            print(
                f"  model {model.name}: head {model.head}, other nodes"
                f" {', '.join(others) or 'none'}; backend now {now}, meanwhile none"
                f" (stopped: every backend places a rank on {node})"
            )
        if not models:
            print(f"  no model is placed on {node}")
        held = sum(s.domains for s in facts.survivors)
        print(f"  survivors of SIGKILL on {node}: {len(facts.survivors)}, holding {held}")
        for survivor in facts.survivors:
            print(
                f"    pid {survivor.pid} (model {survivor.model or '?'}, {survivor.backend or '?'}"
                f" backend): {survivor.domains} protection domain(s) on"
                f" {', '.join(survivor.devices) or 'its devices'}, until {node} reboots"
            )
        print(
            "it will pause each model's remediation, stop each service and sweep every node"
            " of each model" + (", silence the alerts" if ends is not None else "")
        )
        if not args.yes and not _confirmed(f"drain {node}? [y/N] "):
            raise CliError("not confirmed; nothing was done (pass --yes to drain without asking)")
        journal, by = oncall.journal, oncall.actor
        for model in models:
            if journal.set_pause(
                model.name, reason=f"drain of {node}", by_whom=by, now=time.time()
            ):
                journal.add_event(
                    "paused", now=time.time(), model=model.name, detail=f"drain of {node} by {by}"
                )
            print(f"paused automatic remediation of {model.name}")
        not_stopped = [m.name for m in models if not await run_playbook(engine, m.name, DRAIN)]
        names = ",".join(m.name for m in models)
        marked = await node_drain_record(
            engine, node, "set", "--by", by, *(["--models", names] if names else [])
        )
    silences, problem = _silence(oncall, args, node, [m.name for m in models], ends)
    problem = "; ".join(p for p in (marked, problem) if p)
    record = DrainRecord(
        node=node,
        boot_id=str(facts.boot_id),
        models=tuple(m.name for m in models),
        by=oncall.actor,
        since=time.time(),
        silences=tuple(silences),
        alertmanager=args.alertmanager if silences else None,
        not_stopped=tuple(not_stopped),
    )
    journal.add_event(DRAIN_EVENT, now=record.since, detail=record.to_detail())
    print(f"drained {node}; after its reboot: {oncall.command('undrain', node)}")
    if not_stopped or problem:
        print(
            "mlx-medic drain: "
            + "; ".join(
                ([f"not stopped: {', '.join(not_stopped)} (see their runs)"] if not_stopped else [])
                + ([problem] if problem else [])
            ),
            file=sys.stderr,
        )
        return 1
    return 0


def _silence(
    oncall: OnCall, args: argparse.Namespace, node: str, models: list[str], ends: float | None
) -> tuple[list[str], str]:
    """The silences made (the node's, then each model's), and what went wrong, if anything."""
    if ends is None:
        return [], ""
    made: list[str] = []
    comment = f"mlx-medic drain {node}: rebooting; undrain expires this"
    for label, value in [("node", node), *(("model", m) for m in models)]:
        try:
            silence = create_silence(
                args.alertmanager,
                label,
                value,
                now=time.time(),
                ends=ends,
                by=oncall.actor,
                comment=comment,
            )
        except SilenceError as exc:
            return made, f"silence of {label}={value} not made: {exc}"
        made.append(silence)
        print(f"silenced {label}={value} until it expires: {silence}")
    return made, ""


def _confirmed(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(question).strip().lower() in ("y", "yes")
