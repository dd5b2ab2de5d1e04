"""`mlx-medic log`: the remediation journal for on-call, at 3 a.m., in 100 columns.

Newest run first, each with its steps and their outcomes, and for an escalation
the next action in words. Pauses and open circuits are shown first: they are
why nothing happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable
from typing import TextIO

from mlx_medic.inventory.fields import parse_duration
from mlx_medic.remediator.cli_common import (
    CliError,
    OnCall,
    add_config_argument,
    fail,
    run_oncall,
)
from mlx_medic.remediator.journal import ControlView, DecisionView, Journal, RunView, StepView
from mlx_medic.remediator.outcomes import StepOutcome

WIDTH = 100
FOLLOW_INTERVAL = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--model", default=None, help="only this model's runs")
    parser.add_argument(
        "--since",
        default=None,
        metavar="DURATION",
        help="only runs queued within this long, e.g. 30m, 2h, 1d",
    )
    parser.add_argument("--limit", type=int, default=20, help="at most this many runs (20)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="JSON: {controls, runs, events} (events: recent decisions, repeats folded, each"
        " with count, first and last); with --follow one run per line",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep printing runs as they start, change and end (Ctrl-C stops)",
    )


def _clock(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stamp))


def _took(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


_COMMAND = re.compile(r"`[^`]*`")


def _wrapped(label: str, text: str, indent: int = 6) -> list[str]:
    """Wrapped to WIDTH; a `command` in backticks is never split (on-call copies it)."""
    prefix = " " * indent + label
    glued = _COMMAND.sub(lambda m: m.group(0).replace(" ", "\0"), " ".join(text.split()))
    lines = textwrap.wrap(
        glued,
        WIDTH,
        initial_indent=prefix,
        subsequent_indent=" " * len(prefix),
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [line.replace("\0", " ") for line in lines]


RUN_HEADER = f"{'RUN':<6}{'QUEUED (UTC)':<21}{'MODEL':<18}{'TRIGGER':<22}{'OUTCOME':<22}TOOK"


def format_run(run: RunView) -> list[str]:
    outcome = run.outcome + (" (dry run)" if run.dry_run else "")
    lines = [
        f"{'#' + str(run.id):<6}{_clock(run.queued_at):<21}{_cut(run.model, 17):<18}"
        f"{_cut(run.trigger, 21):<22}{_cut(outcome, 21):<22}{_took(run.duration)}"
    ]
    for step in run.steps:
        lines.append(format_step(step))
        if step.targets:
            lines += _wrapped("   ", "targets: " + ", ".join(step.targets), indent=12)
        if step.detail and step.outcome not in (StepOutcome.OK, StepOutcome.PLANNED):
            lines += _wrapped("   ", step.detail, indent=12)
    if run.detail:
        lines += _wrapped("why:  ", run.detail)
    if run.next_action:
        lines += _wrapped("NEXT: ", run.next_action)
    return lines


def format_step(step: StepView) -> str:
    what = " ".join(step.command) if step.command else step.description
    took = "-" if step.outcome == StepOutcome.PLANNED else _took(step.duration)
    head = (
        f"      {step.seq:>2} {_cut(step.name, 14):<15}{_cut(step.node, 10):<11}"
        f"{step.outcome:<16}{took:>6}  "
    )
    return head + _cut(what, WIDTH - len(head))


def bare_command(*words: str) -> str:
    return " ".join(["mlx-medic", *words])


def format_control(control: ControlView, command: Callable[..., str] = bare_command) -> list[str]:
    """The pause or open circuit; `command` spells the undo (OnCall.command: with the
    `--config.file` this run needed)."""
    scope = control.model or "ALL MODELS"
    state = "PAUSED" if control.kind == "pause" else "CIRCUIT OPEN"
    lines = [f"{state}: {scope} since {_clock(control.since)}Z by {control.by_whom}"]
    if control.reason:
        lines += _wrapped("why:  ", control.reason, 2)
    if control.next_action:
        lines += _wrapped("NEXT: ", control.next_action, 2)
    else:
        undo = command("resume", *([control.model] if control.model else []))
        lines.append(f"  undo: `{undo}`")
    return lines


EVENTS_SHOWN = 10  # folded decisions, and as many that need a person (Journal.recent_decisions)


def format_event(event: DecisionView) -> list[str]:
    """A decision: its newest time; a fold of repeats says how many, from when."""
    run = f" run #{event.run_id}" if event.run_id else ""
    head = (
        f"{_clock(event.time):<21}{_cut(event.kind, 15):<16}{_cut(event.model or '-', 17):<18}"
        f"{_cut(event.fingerprint or '-', 18)}{run}"
    )
    folded = [f"{'':<21}×{event.count} from {_clock(event.first)}"] if event.count > 1 else []
    return [head, *folded, *(_wrapped("", event.detail) if event.detail else [])]


def render(
    runs: list[RunView],
    controls: list[ControlView],
    events: list[DecisionView] | None = None,
    command: Callable[..., str] = bare_command,
) -> str:
    lines: list[str] = []
    for control in controls:
        lines += format_control(control, command)
    if controls:
        lines.append("")
    if not runs:
        lines.append("no remediation runs in the journal for this selection")
    else:
        lines.append(RUN_HEADER)
        for run in runs:
            lines += format_run(run)
            lines.append("")
    if events:
        lines.append("RECENT DECISIONS (newest first; repeats folded into one, ×N from the first)")
        for event in events:
            lines += format_event(event)
    return "\n".join(lines).rstrip("\n") + "\n"


def _since(args: argparse.Namespace) -> float | None:
    if args.since is None:
        return None
    try:
        return time.time() - parse_duration(args.since)
    except ValueError as exc:
        raise CliError(f"--since: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        return fail(CliError("--limit must be at least 1"), args.command)
    try:
        since = _since(args)
    except CliError as exc:
        return fail(exc, args.command)
    return run_oncall(args, lambda oncall: _show(oncall, args, since), writes=False)


def _show(oncall: OnCall, args: argparse.Namespace, since: float | None) -> int:
    journal = oncall.journal
    try:
        if args.follow:
            with contextlib.suppress(KeyboardInterrupt):
                follow(journal, args.model, since, args.limit, as_json=args.json)
            return 0
        runs = journal.list_runs(model=args.model, since=since, limit=args.limit)
        controls = [
            c for c in journal.controls() if c.model in (None, args.model) or not args.model
        ]
        events = journal.recent_decisions(args.model, since, EVENTS_SHOWN)
        if args.json:
            json.dump(
                {
                    "controls": [c.to_dict() for c in controls],
                    "runs": [r.to_dict() for r in runs],
                    "events": [e.to_dict() for e in events],
                },
                sys.stdout,
                indent=2,
            )
            sys.stdout.write("\n")
        else:
            sys.stdout.write(render(runs, controls, events, oncall.command))
        return 0
    except BrokenPipeError:  # `mlx-medic log | head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def follow(
    journal: Journal,
    model: str | None,
    since: float | None,
    limit: int,
    *,
    as_json: bool,
    out: TextIO | None = None,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print each run again whenever its outcome or steps change, oldest first."""
    out = out or sys.stdout
    shown: dict[int, tuple[str, int, str]] = {}
    done = 0
    if not as_json:
        out.write(RUN_HEADER + "\n")
    while rounds is None or done < rounds:
        runs = journal.list_runs(model=model, since=since, limit=limit)
        for run in reversed(runs):
            state = (run.outcome, len(run.steps), run.steps[-1].outcome if run.steps else "")
            if shown.get(run.id) == state:
                continue
            shown[run.id] = state
            if as_json:
                out.write(json.dumps(run.to_dict()) + "\n")
            else:
                out.write("\n".join(format_run(run)) + "\n\n")
        out.flush()
        done += 1
        if rounds is None or done < rounds:
            sleep(FOLLOW_INTERVAL)
