"""Generate mlx-medic's Grafana dashboards as JSON, so every panel follows the same conventions.

Plain dicts, no dependency: `python grafana/generate.py` rewrites grafana/dashboards/*.json;
`--check` exits 1 when the committed JSON differs from what this script produces.
Every query selects the data source through the `${datasource}` variable and uses only the
metric contract's names (tests/test_grafana_dashboards.py checks both). Every panel takes
a description (what it shows, what to do when it looks wrong), and every dashboard links to
the runbooks (the alerting rules' runbook base URL) and to the on-call page (the
`oncall_url` variable, default the remediator's address in deploy/remediator.yml).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
RULES = Path(__file__).resolve().parent.parent / "alerting-rules" / "mlx-medic.rules.yaml"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GIB = 1024**3
# Mirrors the alert thresholds in alerting-rules/mlx-medic.rules.yaml (T5, T6, T8, T11).
PD_HIGH, PD_BUDGET = 8, 11
STALE_TMP_BYTES = 50 * GIB
MEMORY_LOW_BYTES = 4 * GIB

Panel = dict[str, Any]

# Run outcomes that need a person (remediator/outcomes.py's RunOutcome), drawn red.
FAILED_OUTCOMES = ("failed", "escalated", "misconfigured", "unreachable")
# Where a person opens the on-call page: the remediator's listen address in
# deploy/remediator.yml, reached through `ssh -L 10901:127.0.0.1:10901` (docs/install.md).
ONCALL_URL = "http://127.0.0.1:10901/"


def runbooks_url() -> str:
    """The runbooks' index, under the base URL the alerting rules' runbook_url uses."""
    found = re.search(r"^# RUNBOOK_PATTERN: (\S+/)%s\.md$", RULES.read_text(), re.MULTILINE)
    if not found:
        raise SystemExit(f"{RULES}: no '# RUNBOOK_PATTERN: .../%s.md' line")
    return found.group(1) + "README.md"


# Every exporter series carries `node`, the node's name in the inventory (the exporter adds it).
NODE = 'node=~"$node"'
NODE_MODEL = 'node=~"$node", model=~"$model"'
# Present at 0 for every model and state; the breakdown by rule and role only while non-zero.
ORPHANS = f"mlx_orphan_processes{{{NODE_MODEL}}}"
ORPHANS_BY_RULE = f"mlx_orphan_processes_by_rule{{{NODE_MODEL}}}"
STUCK_ORPHANS = f'mlx_orphan_processes{{{NODE_MODEL}, state="uninterruptible"}}'


# Template variables ---------------------------------------------------------------------------


def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    """A multi-select variable with All, refreshed when the time range changes."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "regex": "",
        "options": [],
    }


def oncall_variable() -> dict[str, Any]:
    """The on-call page's URL, for the dashboard link: a text box, so a deployment whose
    remediator is elsewhere sets it (or passes ?var-oncall_url=...)."""
    return {
        "name": "oncall_url",
        "label": "On-call page",
        "type": "textbox",
        "query": ONCALL_URL,
        "current": {"text": ONCALL_URL, "value": ONCALL_URL},
        "options": [{"selected": True, "text": ONCALL_URL, "value": ONCALL_URL}],
        "hide": 0,
    }


# Panels ---------------------------------------------------------------------------------------


def target(expr: str, legend: str = "", ref: str = "A") -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def thresholds(*steps: tuple[str, float | None]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def timeseries(
    title: str,
    targets: list[dict[str, Any]],
    *,
    description: str,
    unit: str = "short",
    steps: tuple[tuple[str, float | None], ...] = (("green", None),),
    overrides: list[dict[str, Any]] | None = None,
    min_value: float | None = 0,
    max_value: float | None = None,
    stepped: bool = False,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """A time series; thresholds beyond the base step are drawn as dashed lines."""
    custom: dict[str, Any] = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10,
        "showPoints": "never",
        "lineInterpolation": "stepAfter" if stepped else "linear",
        "thresholdsStyle": {"mode": "dashed" if len(steps) > 1 else "off"},
    }
    defaults: dict[str, Any] = {"unit": unit, "custom": custom, "thresholds": thresholds(*steps)}
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_size": (width, height),
    }


def stat(
    title: str,
    targets: list[dict[str, Any]],
    *,
    description: str,
    unit: str = "short",
    steps: tuple[tuple[str, float | None], ...] = (("green", None),),
    overrides: list[dict[str, Any]] | None = None,
    mappings: list[dict[str, Any]] | None = None,
    text_mode: str = "value_and_name",
    width: int = 6,
    height: int = 5,
) -> Panel:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": thresholds(*steps),
                "mappings": mappings or [],
                "color": {"mode": "thresholds"},
            },
            "overrides": overrides or [],
        },
        "options": {
            "colorMode": "background",
            "graphMode": "none",
            "justifyMode": "auto",
            "textMode": text_mode,
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
        "_size": (width, height),
    }


def row(title: str) -> Panel:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def flag_mappings(on: str, color: str, off: str = "no") -> list[dict[str, Any]]:
    """A 0/1 series shown as words: `off` blends in, `on` stands out in `color`."""
    return [
        {
            "type": "value",
            "options": {
                "0": {"text": off, "color": "transparent", "index": 0},
                "1": {"text": on, "color": color, "index": 1},
            },
        }
    ]


def hold_mappings() -> list[dict[str, Any]]:
    """mlx_medic_paused + 2 * mlx_medic_circuit_open, in words."""
    return [
        {
            "type": "value",
            "options": {
                "0": {"text": "acting", "color": "transparent", "index": 0},
                "1": {"text": "paused", "color": "orange", "index": 1},
                "2": {"text": "circuit open", "color": "red", "index": 2},
                "3": {"text": "paused, circuit open", "color": "red", "index": 3},
            },
        }
    ]


def up_down_mappings(up: str, down: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "value",
            "options": {
                "0": {"text": down, "color": "red", "index": 0},
                "1": {"text": up, "color": "green", "index": 1},
            },
        }
    ]


def failed_outcomes_red(*, when_any: bool) -> list[dict[str, Any]]:
    """An override drawing the series of a failed outcome (legend ending in it) red: in a
    time series always (`when_any` False), in a stat once its count reaches 1."""
    color = (
        {"id": "thresholds", "value": thresholds(("green", None), ("red", 1))}
        if when_any
        else {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}
    )
    return [
        {
            "matcher": {"id": "byRegexp", "options": f"(^| )({'|'.join(FAILED_OUTCOMES)})$"},
            "properties": [color],
        }
    ]


def no_runs_mapping() -> list[dict[str, Any]]:
    """A quantile or mean over no runs is NaN: say so."""
    return [
        {"type": "special", "options": {"match": "nan", "result": {"text": "no runs", "index": 0}}}
    ]


def layout(panels: list[Panel]) -> list[Panel]:
    """Flow panels left to right in a 24-column grid; a row always starts a new line."""
    x = y = line_height = 0
    placed = []
    for panel_id, panel in enumerate(panels, start=1):
        width, height = panel.pop("_size")
        if panel["type"] == "row" or x + width > 24:
            x, y, line_height = 0, y + line_height, 0
        panel = {"id": panel_id, "gridPos": {"h": height, "w": width, "x": x, "y": y}, **panel}
        placed.append(panel)
        x, line_height = x + width, max(line_height, height)
        if panel["type"] == "row":
            x, y, line_height = 0, y + height, 0
    return placed


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[dict[str, Any]],
    panels: list[Panel],
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["mlx-medic"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "links": [
            {
                "title": "mlx-medic",
                "type": "dashboards",
                "tags": ["mlx-medic"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            },
            {
                "title": "Runbooks",
                "type": "link",
                "url": runbooks_url(),
                "tooltip": "One runbook per alert: what it means and what to do",
                "icon": "doc",
                "targetBlank": True,
            },
            {
                "title": "On-call page",
                "type": "link",
                "url": "${oncall_url}",
                "tooltip": "The remediator's runs and steps (set the On-call page variable)",
                "icon": "external link",
                "targetBlank": True,
            },
        ],
        "annotations": {"list": []},
        "templating": {"list": [datasource_variable(), *variables, oncall_variable()]},
        "panels": layout(panels),
    }


# Dashboards -----------------------------------------------------------------------------------


def cluster_overview() -> dict[str, Any]:
    variables = [
        query_variable("node", "Node", "label_values(mlx_medic_collector_success, node)"),
        query_variable("model", "Model", f"label_values(mlx_orphan_processes{{{NODE}}}, model)"),
    ]
    panels = [
        row("Models"),
        stat(
            "Model up",
            [target(f"mlx_model_up{{{NODE_MODEL}}}", "{{model}}")],
            description="1 when the port listens and a real request succeeds (head node)."
            " Down for 2m fires LLMModelDown and the remediator acts: follow it on the"
            " on-call page.",
            mappings=up_down_mappings("Up", "Down"),
            steps=(("red", None), ("green", 1)),
            width=8,
        ),
        stat(
            "Uninterruptible orphans",
            [target(f"sum by (model) ({STUCK_ORPHANS})", "{{model}}")],
            description="Orphans in U/D survive kill -9; only a reboot frees them. Above 0"
            " for 15m fires MLXOrphanProcessesUninterruptible: plan the node's reboot.",
            steps=(("green", None), ("red", 1)),
            width=8,
        ),
        stat(
            "Oldest orphan age",
            [
                target(
                    f"max by (model) (mlx_orphan_oldest_age_seconds{{{NODE_MODEL}}})", "{{model}}"
                )
            ],
            description="Age of the model's oldest orphaned rank; orange after 5m, when"
            " MLXOrphanProcesses fires and the remediator sweeps them. Growing past that:"
            " check the sweep's run on the on-call page.",
            unit="s",
            steps=(("green", None), ("orange", 300)),
            width=8,
        ),
        stat(
            "Backend serving",
            [
                target(
                    f"max by (model, backend) (mlx_serve_backend{{{NODE_MODEL}}})",
                    "{{model}}: {{backend}}",
                )
            ],
            description="The backend the current run serves on, from the serve wrapper's"
            " record on the head (ring after a JACCL fallback). None serving while the"
            " model should: see Serve wrapper state and the service's log.",
            mappings=flag_mappings("serving", "green", off="no"),
            steps=(("transparent", None),),
            width=6,
        ),
        stat(
            "Backend pinned",
            [
                target(
                    f"max by (model, backend) (mlx_serve_backend_pinned{{{NODE_MODEL}}})",
                    "{{model}}: {{backend}}",
                )
            ],
            description="A durable pin on the head (by the remediator's fallback or"
            " `mlx-medic backend MODEL ring|jaccl`); `auto` pins none. Unpin with"
            " `mlx-medic backend MODEL auto`.",
            mappings=flag_mappings("pinned", "orange", off="no"),
            steps=(("transparent", None),),
            width=6,
        ),
        stat(
            "Serve wrapper state",
            [
                target(
                    f"max by (model, state) (mlx_serve_state{{{NODE_MODEL}}})",
                    "{{model}}: {{state}}",
                )
            ],
            description="What `mlx-medic serve` last recorded (starting, serving, failed,"
            " stopped); every state no when the wrapper has recorded nothing. Failed: read"
            " the service's log and the MLXServeStartFailing runbook.",
            mappings=flag_mappings("yes", "blue", off="no"),
            steps=(("transparent", None),),
            width=4,
        ),
        stat(
            "Failed starts in range",
            [
                target(
                    "sum by (model) "
                    f"(increase(mlx_serve_failed_starts_total{{{NODE_MODEL}}}[$__range]))",
                    "{{model}}",
                )
            ],
            description="Starts of `mlx-medic serve` that failed in the dashboard's time"
            " range. Any: read the service's log and the MLXServeStartFailing runbook.",
            steps=(("green", None), ("red", 1)),
            width=4,
        ),
        stat(
            "Service left stopped for",
            [
                target(
                    f"max by (model) (mlx_service_stopped_since_seconds{{{NODE_MODEL}}})",
                    "{{model}}",
                )
            ],
            description="How long the service has been stopped by a recorded stop (a"
            " remediation run's or a person's `mlx-medic node service MODEL"
            " stop`); 0: no stop recorded. Red after 15m: MLXServiceLeftStopped's runbook"
            " says whom to ask before starting it.",
            unit="s",
            steps=(("green", None), ("orange", 300), ("red", 900)),
            width=4,
        ),
        timeseries(
            "Processes by model and state",
            [
                target(
                    f"sum by (model, state) (mlx_processes{{{NODE_MODEL}}})", "{{model}} {{state}}"
                )
            ],
            description="The model's MLX processes on the selected nodes by state. None"
            " while the model should serve, or many in uninterruptible: check Model up and"
            " the orphan panels below.",
            width=24,
        ),
        row("Orphans"),
        timeseries(
            "Orphans by model and state",
            [target(f"sum by (node, model, state) ({ORPHANS})", "{{node}} {{model}} {{state}}")],
            description="Ranks whose launch is gone, by node and state. Above 0 for 5m fires"
            " MLXOrphanProcesses and the remediator sweeps them; still there after the"
            " sweep: its runbook.",
            width=8,
        ),
        timeseries(
            "Orphans by model and rule",
            [
                target(
                    f"sum by (node, model, rule) ({ORPHANS_BY_RULE})",
                    "{{node}} {{model}} {{rule}}",
                )
            ],
            description="Which rule found them: stale_run_id, launcher_gone, "
            "ssh_client_lost, duplicate_rank, excess_ranks. Suspects "
            "(mlx_suspected_orphan_processes) are not counted here. The rule names why a"
            " rank counts as an orphan: see the MLXOrphanProcesses runbook.",
            width=8,
        ),
        timeseries(
            "Orphans by role",
            [target(f"sum by (node, role) ({ORPHANS_BY_RULE})", "{{node}} {{role}}")],
            description="Orphans by the role the process had (rank, launcher, ...). Growing"
            " over hours: MLXOrphanProcessesAccumulating's runbook.",
            width=8,
        ),
        row("Disk and launcher leftovers"),
        timeseries(
            "Stale tmp bytes",
            [target(f"mlx_stale_tmp_bytes{{{NODE}}}", "{{node}} {{dir}}")],
            description="Bytes in tmp dirs no process writes any more (interrupted downloads"
            " or shares). Orange at 50 GiB: for 30m fires MLXStaleTmpBytesHigh, whose runbook"
            " says what is safe to delete.",
            unit="bytes",
            steps=(("green", None), ("orange", STALE_TMP_BYTES)),
            width=8,
        ),
        timeseries(
            "Stale tmp dirs",
            [target(f"mlx_stale_tmp_dirs{{{NODE}}}", "{{node}} {{dir}}")],
            description="How many stale entries each tmp dir holds; read with Stale tmp bytes"
            " and MLXStaleTmpBytesHigh's runbook.",
            width=8,
        ),
        timeseries(
            "mlx.launch leftover files",
            [target(f"mlx_launch_leftover_files{{{NODE}}}", "{{node}}")],
            description="Pid files and hostfiles mlx.launch never deletes. Growing steadily:"
            " MLXLaunchLeftoversAccumulating's runbook.",
            width=8,
        ),
        row("Service logs"),
        timeseries(
            "Log errors per minute by signature",
            [
                target(
                    "60 * sum by (node, signature) "
                    f"(rate(mlx_log_errors_total{{{NODE}}}[$__rate_interval]))",
                    "{{node}} {{signature}}",
                )
            ],
            description="Error lines in the services' logs per minute, by known signature."
            " jaccl_protection_domain and metal_gpu_timeout each have an alert and a"
            " runbook.",
            unit="cpm",
            width=24,
        ),
        row("Memory and RDMA"),
        timeseries(
            "Memory available",
            [target(f"mlx_memory_available_bytes{{{NODE}}}", "{{node}}")],
            description="Memory the node can still give; red below 4 GiB, where"
            " MLXMemoryAvailableLow fires: see its runbook before starting a model there.",
            unit="bytes",
            steps=(("green", None), ("red", MEMORY_LOW_BYTES)),
            width=8,
        ),
        timeseries(
            "RDMA ports active",
            [target(f"mlx_rdma_port_active{{{NODE}}}", "{{node}} {{device}}/{{port}}")],
            description="1 = PORT_ACTIVE. Absent on hosts without RDMA. A port at 0 for 5m"
            " fires MLXRDMAPortDown: JACCL cannot start over it.",
            max_value=1,
            stepped=True,
            width=8,
        ),
        timeseries(
            "RDMA objects on the node (budget 11 per device)",
            [target(f"mlx_rdma_objects{{{NODE}}}", "{{node}} {{kind}}")],
            description="ioclasscount of protection domains and queue pairs: the node's"
            " total over all its RDMA devices, which it cannot tell apart;"
            " the budget is 11 per device (docs/decisions.md), so orange"
            " and red mark where one device may be near or at it (the MLXRDMAProtectionDomains"
            " runbooks).",
            steps=(("green", None), ("orange", PD_HIGH), ("red", PD_BUDGET)),
            stepped=True,
            width=8,
        ),
        timeseries(
            "Protection domains spent since boot, and the reserve",
            [
                target(f"mlx_pd_debt{{{NODE}}}", "{{node}} spent"),
                target(
                    f"min by (node) (mlx_pd_reserve{{{NODE_MODEL}}})",
                    "{{node}} reserve (lowest of its models)",
                ),
            ],
            description="The node's ledger: each SIGKILLed JACCL rank and each failed"
            " JACCL start spends a domain until reboot. At a model's reserve"
            " no JACCL start is tried on the node (the MLXPDDebt runbooks: a reboot pays it"
            " back).",
            stepped=True,
            width=24,
        ),
        row("Exporter health"),
        stat(
            "Exporters up",
            [target('up{job="mlx-medic-exporter"}', "{{instance}}")],
            description="By scrape target: Prometheus's own `up` has no node label, so the "
            "Node filter does not apply. Down: MLXMedicExporterDown's runbook.",
            mappings=up_down_mappings("Up", "Down"),
            steps=(("red", None), ("green", 1)),
            width=8,
            height=8,
        ),
        timeseries(
            "Collector success",
            [target(f"mlx_medic_collector_success{{{NODE}}}", "{{node}} {{collector}}")],
            description="1 when the collector's last run succeeded; at 0 its series are stale."
            " The exporter's log names the error (MLXMedicCollectorFailing's runbook).",
            max_value=1,
            stepped=True,
            width=8,
        ),
        timeseries(
            "Collector duration",
            [target(f"mlx_medic_collector_duration_seconds{{{NODE}}}", "{{node}} {{collector}}")],
            description="How long each collector's last run took. One near the scrape timeout"
            " makes scrapes fail: look at what it walks (tmp dirs, logs).",
            unit="s",
            width=8,
        ),
    ]
    return dashboard(
        "mlx-medic-cluster",
        "mlx-medic / Cluster overview",
        "Model health, orphaned ranks, stale tmp dirs, log signatures, memory and RDMA per node.",
        variables,
        panels,
    )


def remediator() -> dict[str, Any]:
    model = 'model=~"$model"'
    variables = [query_variable("model", "Model", "label_values(model)")]
    panels = [
        row("Now"),
        stat(
            "Remediations in progress",
            [target(f"sum by (model) (mlx_medic_remediation_in_progress{{{model}}})", "{{model}}")],
            description="1 while a run acts on the model. One that stays 30m fires"
            " MLXMedicRemediationStuck: follow the run on the on-call page.",
            steps=(("green", None), ("orange", 1)),
            width=6,
        ),
        stat(
            "Last verified backend",
            [
                target(
                    f"max by (model, backend) (mlx_medic_last_verified_backend{{{model}}})",
                    "{{model}}: {{backend}}",
                )
            ],
            description="Per model and backend: verified (the backend the remediator last"
            " saw the model answer on) or not; none verified yet shows every backend not."
            " Ring on a model with JACCL: a fallback (MLXServingOnRingFallback's runbook).",
            mappings=flag_mappings("verified", "blue", off="not"),
            steps=(("transparent", None),),
            width=6,
        ),
        stat(
            "Escalations in range",
            [
                target(
                    f"sum by (model, reason) "
                    f"(increase(mlx_medic_escalations_total{{{model}}}[$__range]))",
                    "{{model}} {{reason}}",
                )
            ],
            description="An escalation stops automatic action until `mlx-medic resume MODEL`."
            " Read the run on the on-call page and MLXMedicRemediationEscalated's runbook.",
            steps=(("green", None), ("red", 1)),
            width=6,
        ),
        stat(
            "Remediations in range by outcome",
            [
                target(
                    f"sum by (outcome) "
                    f"(increase(mlx_medic_remediations_total{{{model}}}[$__range]))",
                    "{{outcome}}",
                )
            ],
            description="Runs ended in the time range, by outcome; failed, escalated,"
            " misconfigured and unreachable turn red: each has a runbook, and the run's steps"
            " are on the on-call page.",
            overrides=failed_outcomes_red(when_any=True),
            width=6,
        ),
        stat(
            "Unkillable processes by node",
            [
                target(
                    f"sum by (model, node) (mlx_medic_unkillable_processes{{{model}}})",
                    "{{model}} on {{node}}",
                )
            ],
            description="What the remediator's last sweep of each node found unkillable"
            " (uninterruptible sleep): only a reboot of that node clears them"
            " (MLXMedicUnkillableProcesses' runbook).",
            steps=(("green", None), ("red", 1)),
            width=24,
            height=4,
        ),
        stat(
            "Paused or circuit open by model",
            [
                target(
                    f"max by (model) (mlx_medic_paused{{{model}}})"
                    f" + 2 * max by (model) (mlx_medic_circuit_open{{{model}}})",
                    "{{model}}",
                )
            ],
            description="What holds automatic remediation of each model back, read from the"
            " remediator's journal at every scrape: paused (by `mlx-medic pause` of all models"
            " or of the model), circuit open (the remediator escalated), or both; either"
            " lasts until `mlx-medic resume MODEL`, and MLXMedicPausedTooLong or"
            " MLXMedicCircuitOpenTooLong warns after 4h.",
            mappings=hold_mappings(),
            steps=(("transparent", None),),
            width=24,
            height=4,
        ),
        row("Activity"),
        timeseries(
            "Alerts received per minute by status",
            [
                target(
                    "60 * sum by (status) "
                    "(rate(mlx_medic_alerts_received_total[$__rate_interval]))",
                    "{{status}}",
                )
            ],
            description="Alertmanager's deliveries per minute by alert status. None while"
            " alerts fire: check Alertmanager's route to the remediator; invalid: alerts"
            " not read or deliveries refused, the remediator's log says why.",
            unit="cpm",
            width=12,
        ),
        timeseries(
            "Remediations per minute by model and outcome",
            [
                target(
                    f"60 * sum by (model, outcome) "
                    f"(rate(mlx_medic_remediations_total{{{model}}}[$__rate_interval]))",
                    "{{model}} {{outcome}}",
                )
            ],
            description="How often runs end, by model and outcome; failed, escalated,"
            " misconfigured and unreachable are red: open the run on the on-call page.",
            unit="cpm",
            overrides=failed_outcomes_red(when_any=False),
            width=12,
        ),
        timeseries(
            "Remediation duration",
            [
                target(
                    "sum(rate(mlx_medic_remediation_duration_seconds_sum[$__rate_interval]))"
                    " / sum(rate(mlx_medic_remediation_duration_seconds_count"
                    "[$__rate_interval]))",
                    "mean",
                ),
                target(
                    "histogram_quantile(0.9, sum by (le) "
                    "(rate(mlx_medic_remediation_duration_seconds_bucket"
                    "[$__rate_interval])))",
                    "p90",
                    ref="B",
                ),
            ],
            description="Wall time of runs over all models, mean and 90th percentile. Long"
            " runs: find the model below, then its runs on the on-call page.",
            unit="s",
            width=12,
        ),
        timeseries(
            "Escalations per minute by model and reason",
            [
                target(
                    f"60 * sum by (model, reason) "
                    f"(rate(mlx_medic_escalations_total{{{model}}}[$__rate_interval]))",
                    "{{model}} {{reason}}",
                )
            ],
            description="When escalations happened and why; each opened the model's circuit"
            " until `mlx-medic resume MODEL` (MLXMedicRemediationEscalated's runbook).",
            unit="cpm",
            width=12,
        ),
        stat(
            "Remediation duration per model in range",
            [
                target(
                    "histogram_quantile(0.9, sum by (model, le) "
                    f"(increase(mlx_medic_remediation_duration_seconds_bucket{{{model}}}"
                    "[$__range])))",
                    "{{model}} p90",
                ),
                target(
                    f"sum by (model) (increase(mlx_medic_remediation_duration_seconds_sum"
                    f"{{{model}}}[$__range])) / sum by (model) "
                    f"(increase(mlx_medic_remediation_duration_seconds_count{{{model}}}"
                    "[$__range]))",
                    "{{model}} mean",
                    ref="B",
                ),
            ],
            description="Each model's runs in the time range: 90th percentile and mean wall"
            " time (no runs: none ended; orange from 10m). A model much slower than the"
            " others: read its runs' steps on the on-call page.",
            unit="s",
            mappings=no_runs_mapping(),
            steps=(("green", None), ("orange", 600)),
            width=24,
            height=4,
        ),
    ]
    return dashboard(
        "mlx-medic-remediator",
        "mlx-medic / Remediator",
        "Alerts received, remediation runs and outcomes, escalations, last verified backends,"
        " pauses and open circuits.",
        variables,
        panels,
    )


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard, for every dashboard this project ships."""
    return {
        "mlx-medic-cluster.json": cluster_overview(),
        "mlx-medic-remediator.json": remediator(),
    }


def render(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is out of date")
    args = parser.parse_args(argv)
    stale = []
    for name, board in dashboards().items():
        path, text = OUT_DIR / name, render(board)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            OUT_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date, run python grafana/generate.py: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
