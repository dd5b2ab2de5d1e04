"""How much of an alert's labels and annotations the remediator keeps.

Label values come from whoever can post an alert; kept whole, one 500 KB label was
stored in every run row, rendered on the on-call page every 30 s and echoed in the
webhook's answer. So every label and annotation is bounded where the alert is read
(`payload.to_events`), again where a run is stored (`runs.labels`) and where a stored
run is read back (older journals hold whole labels), so the page, `/api/remediations`,
`mlx-medic log` and the 202 answer show the bounded text.

Routing is unaffected: inventory names are at most 63 characters, so a value that had
to be cut could never name a model or a node, and a cut value (it ends in the marker)
cannot either.

A link an alert brings (its `runbook_url`, `generatorURL`, Alertmanager's `externalURL`;
`links.py`) is bounded the same way to URL_BYTES: a Prometheus graph URL carries its
expression, so it gets more room than a label. A cut URL is shown as text, never as a
link (`is_cut`): it would lead somewhere else.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

LABEL_VALUE_BYTES = 1024  # UTF-8 bytes kept of each label or annotation value
LABEL_NAME_BYTES = 128  # UTF-8 bytes kept of each label or annotation name
MAX_LABELS = 32  # entries kept of an alert's labels (and of its annotations), the `…` one included
MORE_LABELS = "…"  # the name of the entry that says how many more were left out
URL_BYTES = 4096  # UTF-8 bytes kept of each link (links.py)
_CUT_MARKER = re.compile(r"…\[cut, \d+ bytes\]\Z")


def cut(text: str, limit: int) -> str:
    """`text` if it has at most `limit` UTF-8 bytes; else its start (whole characters) and
    a marker saying how long it was, `…[cut, 512000 bytes]`, within `limit` bytes all
    told (so cutting again changes nothing)."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    marker = f"…[cut, {len(data)} bytes]"
    room = max(0, limit - len(marker.encode()))
    return data[:room].decode("utf-8", "ignore") + marker  # a character cut in two is dropped


def is_cut(text: str) -> bool:
    """`text` ends in the marker `cut` leaves."""
    return _CUT_MARKER.search(text) is not None


def bounded_labels(
    labels: Mapping[str, str], keep: Collection[str] = ("alertname",)
) -> dict[str, str]:
    """At most MAX_LABELS entries, each name and value cut to its limit: those named in
    `keep` (what routing reads: the alert name, the model label) and then the others in
    name order; when there are more, the last entry, `…`, says how many were left out.
    Bounding what is bounded changes nothing."""
    names = [n for n in dict.fromkeys(keep) if n in labels]
    names += sorted(n for n in labels if n not in names)
    if len(names) <= MAX_LABELS:
        return {cut(n, LABEL_NAME_BYTES): cut(labels[n], LABEL_VALUE_BYTES) for n in names}
    kept = {
        cut(n, LABEL_NAME_BYTES): cut(labels[n], LABEL_VALUE_BYTES) for n in names[: MAX_LABELS - 1]
    }
    kept[MORE_LABELS] = f"[cut, {len(names) - MAX_LABELS + 1} more]"
    return kept
