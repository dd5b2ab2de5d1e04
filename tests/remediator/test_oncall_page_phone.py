"""The on-call page on a phone, in Debian's headless Chromium at 390 px: nothing scrolls
sideways however long the words a run, a pause or an alert's labels and links carry, and each
decision is a card whose cells name their column; at 1280 px the decisions stay a table."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.outcomes import RunOutcome
from testbed.browser import evaluate
from testbed.oncall_pictures import serving_page, write_oncall_scene
from tests.tools import require_tool

LONG_WORD = "x" * 400  # no place to break but anywhere
LAYOUT = """({
  scrollWidth: document.documentElement.scrollWidth,
  viewport: window.innerWidth,
  cell: getComputedStyle(document.querySelector('table.decisions td')).display,
  cellLabel: getComputedStyle(document.querySelector('table.decisions td'), '::before').content,
})"""


def write_long_content(journal: Journal, now: float) -> None:
    """The scene, then a run (its links too), a pause and decisions whose words are too
    long for any line."""
    write_oncall_scene(journal, now - 60)
    model = "model-" + LONG_WORD
    run = journal.create_alert_run(
        model=model,
        playbook="recover",
        owner="ai001:4242",
        now=now,
        alertname="MLXModelDown",
        fingerprint="f" * 16,
        starts_at="2026-12-03T03:00:00Z",
        labels={"model": model, "node": "node-" + LONG_WORD, "team": LONG_WORD},
        dry_run=False,
        links={
            "runbook_url": "https://runbooks.example/" + LONG_WORD,
            "generator_url": "javascript:" + LONG_WORD,
        },
    )
    assert run is not None
    journal.end_run(run, RunOutcome.FAILED, now, "reason " + LONG_WORD, "next " + LONG_WORD)
    journal.set_pause(model, reason="because " + LONG_WORD, by_whom=LONG_WORD, now=now)
    for index in range(40):
        journal.add_event(
            f"kind-{index}-{LONG_WORD}",
            now=now + index,
            model=model,
            fingerprint=LONG_WORD,
            run_id=run,
            detail="detail " + LONG_WORD,
        )


async def layout_at(width: int, tmp_path: Path) -> dict[str, Any]:
    require_tool("chromium")
    journal = Journal(tmp_path / "journal.sqlite")
    try:
        write_long_content(journal, time.time())
        async with serving_page(journal, tmp_path) as url:
            layout: dict[str, Any] = await evaluate(url, tmp_path, width, LAYOUT)
    finally:
        journal.close()
    assert layout["viewport"] == width, "Chromium's viewport is not the width asked for"
    return layout


async def test_at_390_px_nothing_scrolls_sideways_and_each_decision_names_its_columns(
    tmp_path: Path,
) -> None:
    layout = await layout_at(390, tmp_path)
    assert layout["scrollWidth"] <= 390, f"the page is {layout['scrollWidth']} px wide at 390"
    assert layout["cell"] == "grid"
    assert layout["cellLabel"] == '"Time (last)"'


async def test_at_1280_px_the_decisions_stay_a_table_without_sideways_scrolling(
    tmp_path: Path,
) -> None:
    layout = await layout_at(1280, tmp_path)
    assert layout["scrollWidth"] <= 1280
    assert layout["cell"] == "table-cell"
