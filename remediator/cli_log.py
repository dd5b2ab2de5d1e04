"""`mlx-medic log`: the remediation journal for on-call, at 3 a.m., at the terminal's width.

Newest run first, each with the links of the alert that started it (`runbook:`,
`alert:` in Prometheus, `alertmanager:`), its steps and their outcomes, and for an
escalation the next action in words. Pauses and open circuits are shown first: they
are why nothing happens. Table columns may be cut with "…"; a reason (`why:`), a next
action (`NEXT:`) and a link never are: they wrap under their label, a URL whole on its
line. A link that is not an http or https URL is shown as text, "(not a link: WHY)"
after it (`links.refusal`). Times are ISO 8601 UTC.

`--journal FILE` (again for each replica) reads those journals instead, read-only, and
shows them as one: runs newest first, each named `REPLICA#ID`, decisions and controls
with their replica (log_replicas.py); `--follow` polls each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sqlite3
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TextIO

from mlx_medic.inventory.fields import parse_duration
from mlx_medic.remediator.cli_common import (
    CliError,
    add_config_argument,
    fail,
    run_oncall,
)
from mlx_medic.remediator.control_state import concerning
from mlx_medic.remediator.journal import ControlView, DecisionView, RunView, StepView
from mlx_medic.remediator.links import LINK_NAMES, printable, refusal
from mlx_medic.remediator.log_replicas import Replica, merged, named, open_journals
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.utc_time import iso_utc

WIDTH = 100  # when stdout is not a terminal (piped) and COLUMNS is not set
FOLLOW_INTERVAL = 1.0


def terminal_width() -> int:
    """COLUMNS, else the terminal's width, else WIDTH; never so narrow nothing fits."""
    return max(40, shutil.get_terminal_size((WIDTH, 24)).columns)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "--journal",
        dest="journals",
        action="append",
        type=Path,
        metavar="FILE",
        help="read this journal instead of the config's, read-only; again for each replica"
        " (their runs newest first, each named REPLICA#ID: the host of its owner, or the"
        " journal's file name when two have the same host)",
    )
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
        " with count, first and last); times ISO 8601 UTC, durations in duration_seconds;"
        " with --follow one run or decision per line; each record has its `journal` (path)"
        " and `replica`",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep printing runs as they start, change and end, and decisions as they are"
        " made (Ctrl-C stops), polling every journal read; with --json each line has"
        " `record`: run or decision",
    )


def _clock(stamp: float | None) -> str:
    return "-" if stamp is None else iso_utc(stamp)


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
    return _fit(text, width)


def _fit(line: str, width: int) -> str:
    """A table line within `width`, its end cut with "…"."""
    return line if len(line) <= width else line[: width - 1] + "…"


_COMMAND = re.compile(r"`[^`]*`")


def _wrapped(label: str, text: str, width: int, indent: int = 6) -> list[str]:
    """Every word, wrapped to `width` under its label; a `command` in backticks and a
    word longer than a line (a path) are never split (on-call copies them)."""
    prefix = " " * indent + label
    glued = _COMMAND.sub(lambda m: m.group(0).replace(" ", "\0"), " ".join(text.split()))
    lines = textwrap.wrap(
        glued,
        width,
        initial_indent=prefix,
        subsequent_indent=" " * len(prefix),
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [line.replace("\0", " ") for line in lines]


def run_header(run_column: int = 6) -> str:
    return (
        f"{'RUN':<{run_column}}{'QUEUED (UTC)':<21}{'MODEL':<18}{'TRIGGER':<22}{'OUTCOME':<22}TOOK"
    )


RUN_HEADER = run_header()


def run_column(run_names: Iterable[str]) -> int:
    """The RUN column's width: 6, or wider for `REPLICA#ID` names."""
    return max([6, *(len(name) + 1 for name in run_names)])


def format_run(
    run: RunView, width: int = WIDTH, name: str | None = None, column: int = 6
) -> list[str]:
    """The run's line (`name`: `#ID`, or `REPLICA#ID` read with other journals), then each
    step's (under it, its condition when it runs only if an earlier one fails
    verification; a step that did not run shows no duration), why it acted (`re-check:`,
    never cut, like `why:` and `NEXT:`), why it ended, the next action."""
    outcome = run.outcome + (" (dry run)" if run.dry_run else "")
    lines = [
        _fit(
            f"{name or '#' + str(run.id):<{column}}{_clock(run.queued_at):<21}"
            f"{_cut(run.model, 17):<18}"
            f"{_cut(run.trigger, 21):<22}{_cut(outcome, 21):<22}{_took(run.duration)}",
            width,
        )
    ]
    lines += format_links(run, width)
    for step in run.steps:
        lines.append(format_step(step, width))
        if step.condition:
            lines += _wrapped("   ", step.condition, width, indent=12)
        if step.targets:
            lines += _wrapped("   ", "targets: " + ", ".join(step.targets), width, indent=12)
        if step.detail and step.outcome not in (StepOutcome.OK, StepOutcome.PLANNED):
            lines += _wrapped("   ", step.detail, width, indent=12)
    if run.recheck:
        lines += _wrapped("re-check: ", run.recheck, width)
    if run.detail:
        lines += _wrapped("why:  ", run.detail, width)
    if run.next_action:
        lines += _wrapped("NEXT: ", run.next_action, width)
    return lines


LINK_LABEL_WIDTH = 2 + max(len(label) for label, _ in LINK_NAMES.values())


def format_links(run: RunView, width: int = WIDTH) -> list[str]:
    """A line per link the run's alert sent, the URL never cut (on-call copies it)."""
    lines: list[str] = []
    for name, (label, _) in LINK_NAMES.items():
        url = run.links.get(name)
        if url is None:
            continue
        why = refusal(url)
        text = url if why is None else f"{printable(url)} (not a link: {why})"
        lines += _wrapped(f"{label + ':':<{LINK_LABEL_WIDTH}}", text, width)
    return lines


def format_step(step: StepView, width: int = WIDTH) -> str:
    what = " ".join(step.command) if step.command else step.description
    took = _took(step.duration)  # "-": the step did not run (planned) or still runs
    head = (
        f"      {step.seq:>2} {_cut(step.name, 14):<15}{_cut(step.node, 10):<11}"
        f"{step.outcome:<16}{took:>6}  "
    )
    return _fit(head + _cut(what, max(1, width - len(head))), width)


def bare_command(*words: str) -> str:
    return " ".join(["mlx-medic", *words])


def format_control(
    control: ControlView,
    command: Callable[..., str] = bare_command,
    width: int = WIDTH,
    replica: str | None = None,
) -> list[str]:
    """The pause or open circuit; `command` spells the undo (OnCall.command: with the
    `--config.file` this run needed); `replica`: the one whose journal holds it (the
    undo is run there)."""
    scope = control.model or "ALL MODELS"
    state = "PAUSED" if control.kind == "pause" else "CIRCUIT OPEN"
    head = f"{scope} since {_clock(control.since)} by {control.by_whom}"
    where = f" on {replica}" if replica else ""
    head += f", held by replica {replica}" if replica else ""
    lines = _wrapped(f"{state}: ", head, width, 0)
    if control.reason:
        lines += _wrapped("why:  ", control.reason, width, 2)
    if control.next_action:
        lines += _wrapped("NEXT: ", control.next_action, width, 2)
    else:
        undo = command("resume", *([control.model] if control.model else []))
        lines += _wrapped("undo: ", f"`{undo}`{where}", width, 2)
    return lines


EVENTS_SHOWN = 10  # folded decisions, and as many that need a person (Journal.recent_decisions)


def format_event(
    event: DecisionView, width: int = WIDTH, replica: Replica | None = None
) -> list[str]:
    """A decision: its newest time, its replica when read with other journals, the run
    it names; a fold of repeats says how many, from when."""
    name = replica.run_name if replica else lambda run_id: f"#{run_id}"
    run = f" run {name(event.run_id)}" if event.run_id else ""
    shown = f"{_cut(replica.name, 15):<16}" if replica and replica.merged else ""
    head = (
        f"{_clock(event.time):<21}{shown}{_cut(event.kind, 15):<16}"
        f"{_cut(event.model or '-', 17):<18}"
        f"{_cut(event.fingerprint or '-', 18)}{run}"
    )
    folded = [f"{'':<21}×{event.count} from {_clock(event.first)}"] if event.count > 1 else []
    detail = _wrapped("", event.detail, width) if event.detail else []
    return [_fit(head, width), *(_fit(line, width) for line in folded), *detail]


def render(
    runs: list[tuple[Replica, RunView]],
    controls: list[tuple[Replica, ControlView]],
    events: list[tuple[Replica, DecisionView]] | None = None,
    command: Callable[..., str] = bare_command,
    width: int = WIDTH,
) -> str:
    lines: list[str] = []
    for replica, control in controls:
        lines += format_control(control, command, width, replica.name if replica.merged else None)
    if controls:
        lines.append("")
    if not runs:
        lines.append("no remediation runs in the journal for this selection")
    else:
        column = run_column(replica.run_name(run.id) for replica, run in runs)
        lines.append(_fit(run_header(column), width))
        for replica, run in runs:
            lines += format_run(run, width, replica.run_name(run.id), column)
            lines.append("")
    if events:
        lines += _wrapped(
            "",
            "RECENT DECISIONS (newest first; repeats folded into one, ×N from the first)",
            width,
            0,
        )
        for replica, event in events:
            lines += format_event(event, width, replica)
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
    if args.journals:
        return _show_journals(args, since)
    return run_oncall(
        args,
        lambda oncall: _show(named([oncall.journal]), args, since, oncall.command),
        writes=False,
    )


def _show_journals(args: argparse.Namespace, since: float | None) -> int:
    """`--journal`: those files, read-only, instead of the config's journal."""
    try:
        replicas = open_journals(args.journals)
    except CliError as exc:
        return fail(exc, args.command)
    try:
        for replica in replicas:
            print(
                f"mlx-medic: journal {replica.path} (replica {replica.name}), read-only",
                file=sys.stderr,
            )
        return _show(replicas, args, since, bare_command)
    except sqlite3.Error as exc:
        return fail(CliError(f"reading the journals: {exc}"), args.command)
    finally:
        for replica in replicas:
            replica.journal.close()


def _show(
    replicas: list[Replica],
    args: argparse.Namespace,
    since: float | None,
    command: Callable[..., str],
) -> int:
    try:
        if args.follow:
            with contextlib.suppress(KeyboardInterrupt):
                follow(replicas, args.model, since, args.limit, as_json=args.json)
            return 0
        runs = merged(
            replicas,
            lambda j: j.list_runs(model=args.model, since=since, limit=args.limit),
            lambda run: run.queued_at,
        )[: args.limit]
        controls = merged(
            replicas,
            lambda j: concerning(j.controls(), args.model or None),
            lambda control: control.since,
            newest_first=False,
        )
        events = merged(
            replicas,
            lambda j: j.recent_decisions(args.model, since, EVENTS_SHOWN),
            lambda event: event.time,
        )
        if args.json:
            json.dump(
                {
                    "controls": [r.mark(c.to_dict()) for r, c in controls],
                    "runs": [r.mark(run.to_dict()) for r, run in runs],
                    "events": [r.mark(e.to_dict()) for r, e in events],
                },
                sys.stdout,
                indent=2,
            )
            sys.stdout.write("\n")
        else:
            sys.stdout.write(render(runs, controls, events, command, terminal_width()))
        return 0
    except BrokenPipeError:  # `mlx-medic log | head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def follow(
    replicas: Sequence[Replica],
    model: str | None,
    since: float | None,
    limit: int,
    *,
    as_json: bool,
    out: TextIO | None = None,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    width: int | None = None,
) -> None:
    """Print each run again whenever its outcome or steps change, and each decision as
    it is made (a fold of repeats again as it grows), in the order they happened; every
    journal polled each round."""
    out = out or sys.stdout
    width = width or terminal_width()
    column = run_column(replica.run_name(999_999) for replica in replicas)
    runs_shown: dict[tuple[str, int], tuple[str, int, str]] = {}
    decisions_shown: dict[tuple[str, str, str | None, float], int] = {}
    done = 0
    if not as_json:
        out.write(_fit(run_header(column), width) + "\n")
    while rounds is None or done < rounds:
        news: list[tuple[float, str]] = []
        for replica in replicas:
            for run in replica.journal.list_runs(model=model, since=since, limit=limit):
                state = (run.outcome, len(run.steps), run.steps[-1].outcome if run.steps else "")
                if runs_shown.get((replica.name, run.id)) != state:
                    runs_shown[replica.name, run.id] = state
                    text = _followed_run(replica, run, as_json, width, column)
                    news.append((_last_change(run), text))
            for event in replica.journal.recent_decisions(model, since, limit):
                fold = (replica.name, event.kind, event.model, event.first)
                if decisions_shown.get(fold) != event.count:
                    decisions_shown[fold] = event.count
                    news.append((event.time, _followed_decision(replica, event, as_json, width)))
        out.writelines(text for _, text in sorted(news, key=lambda item: item[0]))
        out.flush()
        done += 1
        if rounds is None or done < rounds:
            sleep(FOLLOW_INTERVAL)


def _last_change(run: RunView) -> float:
    stamps = [run.queued_at, run.started_at, run.ended_at]
    stamps += [s.ended_at or s.started_at for s in run.steps]
    return max(stamp for stamp in stamps if stamp is not None)


FOLLOWED_DECISION = "decision  "


def _followed_run(replica: Replica, run: RunView, as_json: bool, width: int, column: int) -> str:
    if as_json:
        return json.dumps({"record": "run", **replica.mark(run.to_dict())}) + "\n"
    return "\n".join(format_run(run, width, replica.run_name(run.id), column)) + "\n\n"


def _followed_decision(replica: Replica, event: DecisionView, as_json: bool, width: int) -> str:
    """One line of JSON, or the decision as RECENT DECISIONS shows it, marked."""
    if as_json:
        return json.dumps({"record": "decision", **replica.mark(event.to_dict())}) + "\n"
    indent = " " * len(FOLLOWED_DECISION)
    head, *rest = format_event(event, width - len(indent), replica)
    return "\n".join([FOLLOWED_DECISION + head, *(indent + line for line in rest)]) + "\n\n"
