"""The on-call log page: what the remediator did, newest first, readable at 3 a.m.

Server-rendered HTML with inline CSS and no scripts or external assets, so it
works behind any proxy and cannot leak. Everything shown is escaped: label
values come from whoever can post an alert. A run shows the links of the alert
that started it (runbook, the alert in Prometheus, Alertmanager), as links only
when `links.refusal` allows (http or https); each run is `#run-N`, and a decision
names its run with a link there when the run is on the page. Long commands and
outputs wrap instead of scrolling sideways, and under 600 px the decisions table
becomes one card per decision, each cell named, so the page reads on a phone.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from html import escape
from typing import Any

from mlx_medic.remediator.control_state import Hold
from mlx_medic.remediator.links import LINK_NAMES, refusal
from mlx_medic.remediator.outcomes import RunOutcome, StepOutcome
from mlx_medic.remediator.utc_time import iso_utc

REFRESH_SECONDS = 30
OUTPUT_EXCERPT_CHARS = 2000

# Outcomes map to a closed set of CSS classes; a value is never used as a class name.
_OUTCOME_CLASS: dict[str, str] = {
    RunOutcome.SUCCEEDED: "good",
    StepOutcome.OK: "good",
    RunOutcome.PLANNED: "info",
    RunOutcome.SKIPPED: "info",
    RunOutcome.QUEUED: "info",
    StepOutcome.NOT_IMPLEMENTED: "info",
    RunOutcome.RUNNING: "busy",
    RunOutcome.FAILED: "bad",
    RunOutcome.ESCALATED: "bad",
    RunOutcome.INTERRUPTED: "bad",
    RunOutcome.INCONCLUSIVE: "bad",
    RunOutcome.UNREACHABLE: "bad",
    RunOutcome.MISCONFIGURED: "bad",
    StepOutcome.UNKILLABLE: "bad",
    RunOutcome.CANCELLED: "muted",
    RunOutcome.LOCKED: "muted",
}

_CSS = """
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
 background:#f4f5f7;color:#1d2330}
header{background:#1d2330;color:#fff;padding:.8rem 1rem}
header h1{margin:0;font-size:1.25rem}
header p{margin:.2rem 0 0;color:#c8cdd8;font-size:.85rem}
main{max-width:72rem;margin:0 auto;padding:1rem}
.run{background:#fff;border:1px solid #d5d9e0;border-left:6px solid #8a94a6;
 border-radius:6px;margin:0 0 1rem;padding:.8rem 1rem}
.run.good{border-left-color:#1f8a4c}.run.bad{border-left-color:#c62828}
.run.busy{border-left-color:#d68a00}.run.info{border-left-color:#2a6fdb}
.run h2{margin:0 0 .4rem;font-size:1.1rem;display:flex;flex-wrap:wrap;gap:.5rem;
 align-items:center}
.model{font-family:ui-monospace,Menlo,Consolas,monospace;overflow-wrap:anywhere}
.badge{display:inline-block;font-size:.75rem;font-weight:600;padding:.1rem .5rem;
 border-radius:999px;background:#e3e6eb;color:#333;text-transform:uppercase;letter-spacing:.03em}
.badge.good{background:#d6f2e1;color:#125c32}.badge.bad{background:#fbdada;color:#8e1414}
.badge.busy{background:#fdeccc;color:#7a4d00}.badge.info{background:#dbe7fb;color:#173f80}
.badge.muted{background:#eceef1;color:#5b6472}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:.15rem .8rem;margin:.3rem 0 .6rem;
 font-size:.9rem}
dl.meta dt{color:#5b6472}dl.meta dd{margin:0;overflow-wrap:anywhere;min-width:0}
.next{background:#fff4c2;border:2px solid #e0a800;border-radius:6px;padding:.6rem .8rem;
 margin:.4rem 0 .7rem;font-size:1rem;overflow-wrap:anywhere}
.next strong{display:block;color:#7a4d00;text-transform:uppercase;font-size:.8rem}
ol.steps{list-style:none;margin:0;padding:0;border-top:1px solid #e3e6eb}
.step{padding:.45rem 0;border-bottom:1px solid #e3e6eb;min-width:0}
.step-head{display:flex;flex-wrap:wrap;gap:.5rem;align-items:baseline}
.step-name{font-weight:600}.step-node,.step-dur{color:#5b6472;font-size:.85rem}
.step-note{color:#3d4555;font-size:.85rem;overflow-wrap:anywhere}
h2.events{font-size:1rem;margin:1.5rem 0 .4rem}
pre{white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-word;margin:.3rem 0 0;
 padding:.4rem .6rem;border-radius:4px;font:13px/1.4 ui-monospace,Menlo,Consolas,monospace;
 max-width:100%}
pre.cmd{background:#1d2330;color:#e8ebf0}pre.out{background:#f0f2f5;color:#1d2330}
table{width:100%;border-collapse:collapse;background:#fff;font-size:.85rem;table-layout:fixed}
th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #e3e6eb;
 overflow-wrap:anywhere;vertical-align:top}
.empty,.not-link{color:#5b6472;font-style:italic}
.alarm{background:#fbdada;border:2px solid #c62828;border-left-width:6px;border-radius:6px;
 color:#5c0d0d;padding:.7rem 1rem;margin:0 0 1rem;overflow-wrap:anywhere}
.alarm strong{display:block;color:#8e1414;text-transform:uppercase;font-size:.85rem}
@media (max-width:600px){dl.meta{grid-template-columns:1fr}dl.meta dt{margin-top:.3rem}
 main{padding:.5rem}.run{padding:.6rem}
 table.decisions,table.decisions tbody,table.decisions tr,table.decisions td{display:block}
 table.decisions{background:none}
 table.decisions thead{position:absolute;width:1px;height:1px;overflow:hidden;clip-path:inset(50%)}
 table.decisions tr{background:#fff;border:1px solid #d5d9e0;border-radius:6px;margin:0 0 .5rem;
  padding:.3rem .6rem}
 table.decisions td{display:grid;grid-template-columns:6.5rem minmax(0,1fr);gap:.5rem;
  border:0;padding:.1rem 0}
 table.decisions td:empty{display:none}
 table.decisions td::before{content:attr(data-label);color:#5b6472;font-weight:600}}
"""


def _text(value: Any) -> str:
    """Escaped text; NUL and other control characters are shown, not passed through."""
    if value is None:
        return ""
    text = str(value)
    text = "".join(
        ch if ch in "\n\t" or (ord(ch) >= 0x20 and ord(ch) != 0x7F) else f"\\x{ord(ch):02x}"
        for ch in text
    )
    return escape(text, quote=True)


def _first(mapping: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = mapping.get(key)
        if value not in (None, ""):
            return value
    return None


def _outcome_class(outcome: Any) -> str:
    return _OUTCOME_CLASS.get(str(outcome or "").lower(), "muted")


def _when(value: Any) -> str:
    """ISO 8601 UTC (utc_time), as `to_dict` gives a time; a Unix time or datetime made so."""
    if value in (None, ""):
        return ""
    if isinstance(value, datetime):
        value = value.timestamp()
    if isinstance(value, int | float):
        return iso_utc(value)
    return str(value)


def format_duration(seconds: Any) -> str:
    if seconds in (None, ""):
        return ""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _trigger(run: Mapping[str, Any]) -> str:
    """What started the run: the alert (name, fingerprint, since when, labels) or a person."""
    if run.get("trigger_kind") == "manual":
        return f"by hand ({run.get('owner') or 'unknown'})"
    parts = [
        _first(run, "alertname"),
        f"fingerprint {run['fingerprint']}" if run.get("fingerprint") else None,
        f"firing since {run['starts_at']}" if run.get("starts_at") else None,
    ]
    labels = run.get("labels")
    if isinstance(labels, Mapping) and labels:
        parts.append(", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    text = " · ".join(str(p) for p in parts if p)
    return text or str(run.get("trigger") or "")


def _output(value: Any) -> str:
    text = "" if value is None else str(value)
    if len(text) > OUTPUT_EXCERPT_CHARS:
        text = text[:OUTPUT_EXCERPT_CHARS] + "\n… (cut; the full excerpt is in the journal)"
    return text


def _command(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value)
    return "" if value is None else str(value)


def _render_step(step: Mapping[str, Any]) -> str:
    outcome = _first(step, "outcome") or StepOutcome.RUNNING
    klass = _outcome_class(outcome)
    command = _command(step.get("command"))
    output = _output(step.get("output"))
    duration = format_duration(step.get("duration_seconds"))
    targets = step.get("targets") or []
    notes = [
        _first(step, "condition"),
        _first(step, "description"),
        f"targets: {', '.join(str(t) for t in targets)}" if targets else None,
        f"exit status {step['exit_status']}" if step.get("exit_status") is not None else None,
        _first(step, "detail"),
    ]
    note = " · ".join(str(n) for n in notes if n)
    parts = [
        f'<li class="step {klass}"><div class="step-head">',
        f'<span class="step-name">{_text(step.get("name"))}</span>',
        f'<span class="step-node">on {_text(step["node"])}</span>' if step.get("node") else "",
        f'<span class="badge {klass}">{_text(outcome)}</span>',
        f'<span class="step-dur">{_text(duration)}</span>' if duration else "",
        "</div>",
        f'<div class="step-note">{_text(note)}</div>' if note else "",
        f'<pre class="cmd">$ {_text(command)}</pre>' if command else "",
        f'<pre class="out">{_text(output)}</pre>' if output else "",
        "</li>",
    ]
    return "".join(parts)


def _link(url: str) -> str:
    """An http(s) URL as a link that opens without telling the target where from;
    anything else as text saying why it is not one."""
    why = refusal(url)
    if why is not None:
        return f'{_text(url)} <span class="not-link">(not a link: {_text(why)})</span>'
    return f'<a href="{_text(url)}" rel="noopener noreferrer">{_text(url)}</a>'


def _link_rows(run: Mapping[str, Any]) -> str:
    """The alert's runbook, the alert in Prometheus and Alertmanager, those it sent."""
    given = {**(run.get("unsafe_links") or {}), **(run.get("links") or {})}
    return "".join(
        f"<dt>{label}</dt><dd>{_link(given[name])}</dd>"
        for name, (_, label) in LINK_NAMES.items()
        if isinstance(given.get(name), str)
    )


def _meta_rows(meta: Iterable[tuple[str, Any]]) -> str:
    return "".join(f"<dt>{name}</dt><dd>{_text(value)}</dd>" for name, value in meta if value)


def _run_anchor(run_id: Any) -> str:
    """The id of a run's article, which a decision naming it links to."""
    return f"run-{int(run_id)}"


def _render_run(run: Mapping[str, Any]) -> str:
    outcome = _first(run, "outcome") or RunOutcome.RUNNING
    klass = _outcome_class(outcome)
    next_action = _first(run, "next_action")
    meta = [
        ("Trigger", _trigger(run)),
        ("Queued", _when(run.get("queued_at"))),
        ("Started", _when(run.get("started_at"))),
        ("Ended", _when(run.get("ended_at"))),
        ("Duration", format_duration(run.get("duration_seconds"))),
        ("Why", _first(run, "detail")),
        ("Re-check", _first(run, "recheck")),
        ("Playbook", _first(run, "playbook")),
        (
            "Mode",
            "dry run: planned and journaled, nothing executed" if run.get("dry_run") else None,
        ),
        ("Run", f"#{run['id']} by {run.get('owner') or '?'}" if run.get("id") else None),
    ]
    rows = _meta_rows(meta[:1]) + _link_rows(run) + _meta_rows(meta[1:])
    steps = run.get("steps") or []
    step_html = (
        '<ol class="steps">' + "".join(_render_step(s) for s in steps) + "</ol>"
        if steps
        else '<p class="empty">no steps recorded</p>'
    )
    next_html = (
        f'<p class="next"><strong>Next action for on-call</strong>{_text(next_action)}</p>'
        if next_action
        else ""
    )
    anchor = f' id="{_run_anchor(run["id"])}"' if run.get("id") else ""
    return (
        f'<article class="run {klass}"{anchor}><h2>'
        f'<span class="model">{_text(run.get("model"))}</span>'
        f'<span class="badge {klass}">{_text(outcome)}</span></h2>'
        f'{next_html}<dl class="meta">{rows}</dl>{step_html}</article>'
    )


def _folded(event: Mapping[str, Any]) -> str:
    """How many decisions a folded row stands for, and since when; "" for one."""
    count = event.get("count") or 1
    return f"×{count} from {_when(event.get('first'))}" if count > 1 else ""


# The decisions table's columns: each header, and the label a cell shows on a phone.
_DECISION_COLUMNS = ("Time (last)", "Times", "Decision", "Model", "Fingerprint", "Run", "Detail")


def _decision_cells(event: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        _when(event.get("time")),
        _folded(event),
        event.get("kind"),
        event.get("model"),
        event.get("fingerprint"),
        event.get("run_id"),
        event.get("detail"),
    )


def _cell(label: str, value: Any, runs_shown: Collection[int]) -> str:
    """A decision's cell; its run a link to the run's article when that is on the page."""
    if label == "Run" and value in runs_shown:
        return f'<a href="#{_run_anchor(value)}">{_text(value)}</a>'
    return _text(value)


def _render_events(events: Iterable[Mapping[str, Any]], runs_shown: Collection[int] = ()) -> str:
    """The decisions as a table; on a narrow screen each row is a card whose cells
    carry their column's name (`data-label`), so nothing scrolls sideways."""
    rows = [
        "<tr>"
        + "".join(
            f'<td data-label="{label}">{_cell(label, cell, runs_shown)}</td>'
            for label, cell in zip(_DECISION_COLUMNS, _decision_cells(event), strict=True)
        )
        + "</tr>"
        for event in events
    ]
    if not rows:
        return ""
    head = "".join(f"<th>{label}</th>" for label in _DECISION_COLUMNS)
    return (
        '<h2 class="events">Recent decisions (repeats folded)</h2><table class="decisions">'
        f"<thead><tr>{head}</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _render_journal_problem(problem: str | None) -> str:
    if problem is None:
        return ""
    return (
        '<p class="alarm" role="alert"><strong>The journal is failing: nothing acts</strong>'
        f"{_text(problem)}. Alertmanager's deliveries are answered 503 (it retries them) until"
        " the journal records again; what is shown below may be out of date.</p>"
    )


_HOLD_CSS = """
.hold{background:#fff4c2;border:2px solid #e0a800;border-left-width:6px;border-radius:6px;
 color:#4a3200;padding:.7rem 1rem;margin:0 0 1rem;overflow-wrap:anywhere}
.hold>strong{display:block;color:#7a4d00;text-transform:uppercase;font-size:.85rem}
.hold ul{margin:.3rem 0 0;padding-left:1.2rem}.hold li{margin:.3rem 0}
.hold code{font:13px/1.4 ui-monospace,Menlo,Consolas,monospace;background:#1d2330;
 color:#e8ebf0;padding:.1rem .35rem;border-radius:3px;overflow-wrap:anywhere}
"""


def _render_hold(hold: Hold, now: datetime) -> str:
    control = hold.control
    scope = control.model or "all models"
    state = "Paused" if hold.is_pause else "Circuit open"
    age = format_duration(max(0.0, now.timestamp() - control.since))
    parts = [
        f'<b>{state}: <span class="model">{_text(scope)}</span></b>',
        f" since {iso_utc(control.since)} (for {_text(age)})",
        f" by {_text(control.by_whom)}" if control.by_whom else "",
        f", opened by run #{hold.run_id}" if hold.run_id is not None else "",
        f". Why: {_text(control.reason)}" if control.reason else "",
        f". Next: {_text(control.next_action)}" if control.next_action else "",
        f". Lift it with <code>{_text(hold.resume)}</code>",
    ]
    return "<li>" + "".join(parts) + "</li>"


def _render_holds(holds: Iterable[Hold], now: datetime) -> str:
    """The banner while a pause or an open circuit stops automatic action."""
    items = "".join(_render_hold(hold, now) for hold in holds)
    if not items:
        return ""
    return (
        '<section class="hold" role="status"><strong>Automatic remediation is held back'
        f"</strong><ul>{items}</ul></section>"
    )


def render_page(
    runs: Iterable[Mapping[str, Any]],
    *,
    now: datetime,
    model: str | None = None,
    events: Iterable[Mapping[str, Any]] = (),
    journal_problem: str | None = None,
    holds: Iterable[Hold] = (),
) -> str:
    """The whole page; `runs` are journal run dicts, newest first; `journal_problem`
    (why the journal cannot record) heads it in red, then the pauses and open circuits
    (`holds`) that stop automatic action."""
    runs = list(runs)
    scope = f" for {_text(model)}" if model else ""
    body = (
        _render_journal_problem(journal_problem)
        + _render_holds(holds, now)
        + (
            "".join(_render_run(r) for r in runs)
            or f'<p class="empty">No remediations recorded{scope}.</p>'
        )
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        f"<title>mlx-medic remediations{scope}</title><style>{_CSS}{_HOLD_CSS}</style></head><body>"
        f"<header><h1>mlx-medic: remediations{scope}</h1>"
        f"<p>Newest first · {len(runs)} shown · rendered {_when(now)}"
        f" · refreshes every {REFRESH_SECONDS} s</p></header>"
        f"<main>{body}{_render_events(events, {r['id'] for r in runs if r.get('id')})}</main>"
        "</body></html>"
    )
