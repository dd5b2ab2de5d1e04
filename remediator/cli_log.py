"""`mlx-medic log`: the remediation journal for on-call, at 3 a.m., at the terminal's width.

Newest run first, each with the links of the alert that started it (`runbook:`,
`alert:` in Prometheus, `alertmanager:`), its steps and their outcomes, and for an
escalation the next action in words. Pauses and open circuits are shown first: they
are why nothing happens. Table columns may be cut with "…"; a reason (`why:`), a next
action (`NEXT:`) and a link never are: they wrap under their label, a URL whole on its
line. A link that is not an http or https URL is shown as text, "(not a link: WHY)"
after it (`links.refusal`). Times are ISO 8601 UTC.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
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
from mlx_medic.remediator.control_state import concerning
from mlx_medic.remediator.journal import ControlView, DecisionView, Journal, RunView, StepView
from mlx_medic.remediator.links import LINK_NAMES, printable, refusal
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.utc_time import iso_utc

WIDTH = 100  # when stdout is not a terminal (piped) and COLUMNS is not set
FOLLOW_INTERVAL = 1.0


def terminal_width() -> int:
    """COLUMNS, else the terminal's width, else WIDTH; never so narrow nothing fits."""
    return max(40, shutil.get_terminal_size((WIDTH, 24)).columns)


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
        " with count, first and last); times ISO 8601 UTC, durations in duration_seconds;"
        " with --follow one run or decision per line",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep printing runs as they start, change and end, and decisions as they are"
        " made (Ctrl-C stops); with --json each line has `record`: run or decision",
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


RUN_HEADER = f"{'RUN':<6}{'QUEUED (UTC)':<21}{'MODEL':<18}{'TRIGGER':<22}{'OUTCOME':<22}TOOK"


def format_run(run: RunView, width: int = WIDTH) -> list[str]:
    """The run's line, then each step's (under it, its condition when it runs only if an
    earlier one fails verification; a step that did not run shows no duration), why it
    acted (`re-check:`, never cut, like `why:` and `NEXT:`), why it ended, the next action."""
    outcome = run.outcome + (" (dry run)" if run.dry_run else "")
    lines = [
        _fit(
            f"{'#' + str(run.id):<6}{_clock(run.queued_at):<21}{_cut(run.model, 17):<18}"
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
    control: ControlView, command: Callable[..., str] = bare_command, width: int = WIDTH
) -> list[str]:
    """The pause or open circuit; `command` spells the undo (OnCall.command: with the
    `--config.file` this run needed)."""
    scope = control.model or "ALL MODELS"
    state = "PAUSED" if control.kind == "pause" else "CIRCUIT OPEN"
    head = f"{scope} since {_clock(control.since)} by {control.by_whom}"
    lines = _wrapped(f"{state}: ", head, width, 0)
    if control.reason:
        lines += _wrapped("why:  ", control.reason, width, 2)
    if control.next_action:
        lines += _wrapped("NEXT: ", control.next_action, width, 2)
    else:
        undo = command("resume", *([control.model] if control.model else []))
        lines += _wrapped("undo: ", f"`{undo}`", width, 2)
    return lines


EVENTS_SHOWN = 10  # folded decisions, and as many that need a person (Journal.recent_decisions)


def format_event(event: DecisionView, width: int = WIDTH) -> list[str]:
    """A decision: its newest time; a fold of repeats says how many, from when."""
    run = f" run #{event.run_id}" if event.run_id else ""
    head = (
        f"{_clock(event.time):<21}{_cut(event.kind, 15):<16}{_cut(event.model or '-', 17):<18}"
        f"{_cut(event.fingerprint or '-', 18)}{run}"
    )
    folded = [f"{'':<21}×{event.count} from {_clock(event.first)}"] if event.count > 1 else []
    detail = _wrapped("", event.detail, width) if event.detail else []
    return [_fit(head, width), *(_fit(line, width) for line in folded), *detail]


def render(
    runs: list[RunView],
    controls: list[ControlView],
    events: list[DecisionView] | None = None,
    command: Callable[..., str] = bare_command,
    width: int = WIDTH,
) -> str:
    lines: list[str] = []
    for control in controls:
        lines += format_control(control, command, width)
    if controls:
        lines.append("")
    if not runs:
        lines.append("no remediation runs in the journal for this selection")
    else:
        lines.append(_fit(RUN_HEADER, width))
        for run in runs:
            lines += format_run(run, width)
            lines.append("")
    if events:
        lines += _wrapped(
            "",
            "RECENT DECISIONS (newest first; repeats folded into one, ×N from the first)",
            width,
            0,
        )
        for event in events:
            lines += format_event(event, width)
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
        controls = concerning(journal.controls(), args.model or None)
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
            sys.stdout.write(render(runs, controls, events, oncall.command, terminal_width()))
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
    width: int | None = None,
) -> None:
    """Print each run again whenever its outcome or steps change, and each decision as
    it is made (a fold of repeats again as it grows), in the order they happened."""
    out = out or sys.stdout
    width = width or terminal_width()
    runs_shown: dict[int, tuple[str, int, str]] = {}
    decisions_shown: dict[tuple[str, str | None, float], int] = {}
    done = 0
    if not as_json:
        out.write(_fit(RUN_HEADER, width) + "\n")
    while rounds is None or done < rounds:
        news: list[tuple[float, str]] = []
        for run in journal.list_runs(model=model, since=since, limit=limit):
            state = (run.outcome, len(run.steps), run.steps[-1].outcome if run.steps else "")
            if runs_shown.get(run.id) != state:
                runs_shown[run.id] = state
                news.append((_last_change(run), _followed_run(run, as_json, width)))
        for event in journal.recent_decisions(model, since, limit):
            fold = (event.kind, event.model, event.first)
            if decisions_shown.get(fold) != event.count:
                decisions_shown[fold] = event.count
                news.append((event.time, _followed_decision(event, as_json, width)))
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


def _followed_run(run: RunView, as_json: bool, width: int) -> str:
    if as_json:
        return json.dumps({"record": "run", **run.to_dict()}) + "\n"
    return "\n".join(format_run(run, width)) + "\n\n"


def _followed_decision(event: DecisionView, as_json: bool, width: int) -> str:
    """One line of JSON, or the decision as RECENT DECISIONS shows it, marked."""
    if as_json:
        return json.dumps({"record": "decision", **event.to_dict()}) + "\n"
    indent = " " * len(FOLLOWED_DECISION)
    head, *rest = format_event(event, width - len(indent))
    return "\n".join([FOLLOWED_DECISION + head, *(indent + line for line in rest)]) + "\n\n"
