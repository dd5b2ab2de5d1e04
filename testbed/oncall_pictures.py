"""The on-call page's pictures at 1280 and 390 px: a real journal holding what on-call
must read at a glance (a pause, an open circuit, a node that did not answer, a node
deployed wrong, a run that worked), the real page serving it, headless Chromium taking it.

    .venv/bin/python -m testbed.oncall_pictures docs/img

No simulated nodes: the runs are written with the journal's own writes, their words
those the engine journals (remediator/runner.py, budget.py, cli_pause.py).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from mlx_medic.remediator.alerts import AlertEvent, Disposition, InvalidAlert
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.outcomes import RunOutcome, StepOutcome
from mlx_medic.remediator.webapp import make_app
from testbed.browser import screenshot_whole_page

# (file name, window width): a laptop's and a phone's; each picture is the page's whole
# length at that width.
PICTURES = (("oncall-1280.png", 1280), ("oncall-390.png", 390))
OWNER = "ai001:4242"
LOCKS = "/var/lib/mlx-medic/locks"
RUNBOOKS = "https://github.com/mlx-medic/mlx-medic/blob/main/alerting-rules/runbooks"


class PageOnly:
    """The engine as the page needs it: it asks only whether the journal records."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def journal_problem(self) -> str | None:
        return self.journal.problem()

    async def submit(self, event: AlertEvent) -> Disposition:
        raise RuntimeError("this page is served for pictures; it takes no alerts")

    def reject(self, invalid: InvalidAlert) -> Disposition:
        raise RuntimeError("this page is served for pictures; it takes no alerts")

    def note(self, kind: str, detail: str) -> None:
        raise RuntimeError("this page is served for pictures; it takes no alerts")


def _alert_run(
    journal: Journal, model: str, alertname: str, node: str, at: float, address: str = ""
) -> int:
    """A run of `alertname` that re-checked `model` and acted: probed on its head `node`
    over SSH, or at `address` from the remediator's host (ai001)."""
    fingerprint = hashlib.sha256(f"{model}/{alertname}".encode()).hexdigest()[:16]
    run_id = journal.create_alert_run(
        model=model,
        playbook="recover",
        owner=OWNER,
        now=at,
        alertname=alertname,
        fingerprint=fingerprint,
        starts_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at - 90)),
        labels={"model": model, "node": node, "severity": "page"},
        dry_run=False,
        # one run's links are enough to show them (the pictures stay under 600 KB)
        links=None
        if address
        else {
            "runbook_url": f"{RUNBOOKS}/{alertname.lower()}.md",
            "generator_url": "http://prometheus.example:9090/graph?g0.expr=mlx_model_up%3D%3D0",
            "external_url": "http://alertmanager.example:9093",
        },
    )
    assert run_id is not None
    probed = (
        f"{address} from this remediator's host (ai001)"
        if address
        else f"`mlx-medic node probe {model}` on the head {node}, over SSH"
    )
    said = "connection refused" if address else f"on {node}: connection refused"
    journal.record_recheck(run_id, f"act: {model} is still down: {said} (probed {probed})")
    journal.add_event(
        Disposition.STARTED, now=at, model=model, fingerprint=fingerprint, run_id=run_id
    )
    journal.start_run(run_id, at + 1)
    return run_id


def _steps(journal: Journal, run_id: int, model: str, node: str, at: float) -> float:
    """The preflight and start-service steps on `node`, each ok; the time after them."""
    for seq, name in enumerate(("preflight", "start-service"), start=1):
        step = journal.begin_step(
            run_id,
            seq=seq,
            name=name,
            node=node,
            command=["mlx-medic", "node", name, "--model", model],
            description="",
            targets=[node],
            now=at,
        )
        at += 4.5
        journal.end_step(step, StepOutcome.OK, at, exit_status=0)
    return at


def write_oncall_scene(journal: Journal, now: float) -> None:
    """Newest last: a run that worked, one that escalated and opened its model's
    circuit, one stopped by a node that did not answer, one by a node deployed wrong,
    and on-call's pause of a model under maintenance."""
    at = now - 3 * 3600
    run = _alert_run(journal, "tiny", "LLMModelDown", "ai001", at)
    at = _steps(journal, run, "tiny", "ai001", at + 1)
    verify = journal.begin_step(
        run, seq=3, name="verify", node="ai001", command=None, description="", targets=[], now=at
    )
    at += 6.2
    journal.end_step(verify, StepOutcome.OK, at, detail="tiny answered a completion on jaccl")
    journal.end_run(run, RunOutcome.SUCCEEDED, at, "tiny verified healthy on jaccl")

    at = now - 2 * 3600
    run = _alert_run(journal, "llama-70b", "LLMModelDown", "ai004", at, "10.0.0.4:8080")
    at = _steps(journal, run, "llama-70b", "ai004", at + 1)
    verify = journal.begin_step(
        run, seq=3, name="verify", node="ai004", command=None, description="", targets=[], now=at
    )
    detail = "llama-70b did not answer its health check within 300 s"
    at += 300
    journal.end_step(verify, StepOutcome.FAILED, at, detail=detail)
    next_action = (
        "look at llama-70b's logs on ai004 (`mlx-medic log llama-70b`), fix it by hand,"
        " then `mlx-medic resume llama-70b`"
    )
    journal.open_circuit(
        "llama-70b",
        reason=f"verify failed: {detail}",
        next_action=next_action,
        by_whom="remediator@ai001",
        now=at,
    )
    journal.add_event(
        "escalation",
        now=at,
        model="llama-70b",
        run_id=run,
        detail=f"verify failed: {detail}. Next: {next_action}",
    )
    journal.end_run(run, RunOutcome.ESCALATED, at, f"verify: {detail}", next_action)

    at = now - 50 * 60
    run = _alert_run(journal, "qwen-32b", "LLMModelDown", "ai003", at, "10.0.0.3:8080")
    journal.end_run(
        run,
        RunOutcome.UNREACHABLE,
        at + 12,
        "ai003 did not answer over SSH (preflight: ssh: connect to host 10.0.0.3 port 22:"
        " Connection timed out)",
        "nothing was done to qwen-32b: check that ai003 is up and its mlx-medic answers over"
        " SSH as the remediator connects (`ssh -F none -i /var/lib/mlx-medic/.ssh/id_ed25519"
        " -o UserKnownHostsFile=/var/lib/mlx-medic/.ssh/known_hosts -o"
        " StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 -p 22"
        " medic@10.0.0.3 /opt/mlx-medic/bin/mlx-medic node facts --inventory"
        " /etc/mlx-medic/inventory.yaml --node ai003 --json` as the remediator's user: a JSON"
        " document of the node's facts) and that"
        f" {LOCKS} there is writable; the next"
        " notification of the alert starts a new run, or run `mlx-medic remediate qwen-32b`",
    )

    at = now - 20 * 60
    run = _alert_run(journal, "mistral-7b", "LLMModelDown", "ai002", at, "10.0.0.2:8080")
    fix = "put the inventory at /etc/mlx-medic/inventory.yaml on ai002"
    journal.end_run(
        run,
        RunOutcome.MISCONFIGURED,
        at + 2,
        "taking the model lock: mlx-medic on ai002 cannot read its inventory"
        f" /etc/mlx-medic/inventory.yaml: No such file or directory; fix: {fix}",
        f"nothing was done to mistral-7b: {fix}; then the next notification of the alert"
        " starts a new run, or run `mlx-medic remediate mistral-7b`",
    )

    at = now - 10 * 60
    reason = "firmware upgrade on ai007 and ai008 until 06:00 UTC"
    journal.set_pause("deepseek-v3", reason=reason, by_whom="alice", now=at)
    journal.add_event(
        "paused", now=at, model="deepseek-v3", detail=f"deepseek-v3 paused by alice: {reason}"
    )


@asynccontextmanager
async def serving_page(journal: Journal, directory: Path) -> AsyncIterator[str]:
    """The real web app on `journal` at 127.0.0.1 (a free port, no auth); its URL."""
    config = RemediatorConfig.model_validate(
        {"inventory": str(directory / "inventory.yaml"), "journal": str(journal.path)}
    )
    app = make_app(PageOnly(journal), journal, config, CollectorRegistry())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


async def take_pictures(directory: Path) -> list[Path]:
    """The scene's page at each width into `directory`; the files written."""
    with tempfile.TemporaryDirectory(prefix="oncall-pictures-") as scratch:
        work = Path(scratch)
        journal = Journal(work / "journal.sqlite")
        try:
            write_oncall_scene(journal, time.time())
            async with serving_page(journal, work) as url:
                taken = []
                for name, width in PICTURES:
                    await screenshot_whole_page(url, work, width, directory / name)
                    taken.append(directory / name)
                return taken
        finally:
            journal.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.oncall_pictures",
        description="Screenshot the on-call page (/) at 1280 and 390 px with headless"
        " Chromium, on a journal with a pause, an open circuit, an unreachable node,"
        " a misconfigured node and a run that succeeded.",
    )
    parser.add_argument("directory", type=Path, help="where the PNGs go (docs/img)")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        parser.error(f"{args.directory}: not a directory")
    for picture in asyncio.run(take_pictures(args.directory)):
        print(picture)
    return 0


if __name__ == "__main__":
    sys.exit(main())
