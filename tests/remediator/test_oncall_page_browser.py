"""The on-call page in a real browser (Debian's headless Chromium): the runs, their steps
and outcomes, the escalation's next action; a screenshot is kept under artifacts/."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

from testbed.browser import chromium
from tests.remediator.conftest import (
    BASIC_PASSWORD,
    BASIC_USER,
    REPO,
    Stack,
    make_alert,
    make_payload,
    post_alerts,
    runs_of,
    wait_until,
)
from tests.tools import require_tool

ARTIFACTS = REPO / "artifacts"


def test_the_page_in_headless_chromium_shows_runs_steps_outcomes_and_the_next_action(
    stack: Stack,
    tmp_path: Path,
) -> None:
    require_tool("chromium")
    service = stack.start()
    # m1: recover escalates (the head has no supervisord program for m1 to start).
    post_alerts(service, make_payload(make_alert("m1", fingerprint="a1b2c3d4e5f60718")))
    # m2: a long run, still holding the model.
    post_alerts(
        service,
        make_payload(make_alert("m2", alertname="SlowDown", fingerprint="0f1e2d3c4b5a6978")),
    )
    # and an alert for a model nobody knows, with a hostile name.
    post_alerts(
        service, make_payload(make_alert("<b>evil</b>; $(reboot)", fingerprint="deadbeefdeadbeef"))
    )
    wait_until(
        lambda: [r for r in runs_of(stack, "m1") if r["outcome"] == "escalated"],
        what="m1's run to escalate",
    )
    wait_until(
        lambda: any(s["outcome"] == "running" for r in runs_of(stack, "m2") for s in r["steps"]),
        what="m2's run to hold",
    )

    url = f"http://{BASIC_USER}:{BASIC_PASSWORD}@127.0.0.1:{service.port}/"
    dom = chromium(url, tmp_path, "--dump-dom").stdout
    text = unescape(re.sub(r"<[^>]+>", " ", dom))
    for expected in (
        "mlx-medic: remediations",
        "m1",
        "escalated",
        "preflight",
        "Next action for on-call",
        "m2",
        "running",
        "hold",
        "a1b2c3d4e5f60718",
        "unknown_model",
    ):
        assert expected in text, f"{expected!r} is not on the page"
    assert "<b>evil</b>" not in dom and "&lt;b&gt;evil&lt;/b&gt;" in dom

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "oncall-page.png"
    screenshot.unlink(missing_ok=True)
    chromium(url, tmp_path, f"--screenshot={screenshot}")
    assert screenshot.stat().st_size > 10_000
    narrow = ARTIFACTS / "oncall-page-phone.png"  # long commands wrap: no sideways scrolling
    narrow.unlink(missing_ok=True)
    chromium(url, tmp_path, f"--screenshot={narrow}", size="390,844")
    assert narrow.stat().st_size > 10_000
