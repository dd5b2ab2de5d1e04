"""Label values are data only: shell and path tricks in any label, annotation,
fingerprint or alert name never run, never create a file, never escape a directory;
through the full service (real engine, journal, SSH lock on the head node)."""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml

from mlx_medic.state.node_identity import NODE_ID_FILE
from tests.remediator.conftest import (
    Stack,
    basic,
    events_of,
    http,
    make_alert,
    make_payload,
    post_alerts,
    runs_of,
    wait_until,
)


def hostile_values(canary_dir: Path, token: str) -> list[str]:
    c = canary_dir
    return [
        f"; touch {c}/semicolon",
        f"$(touch {c}/dollar)",
        f"`touch {c}/backtick`",
        f"| touch {c}/pipe",
        f"&& touch {c}/and #",
        f"m1\n touch {c}/newline",
        f"m1\x00; touch {c}/nul",
        f"'; touch {c}/quote; '",
        f'"; touch {c}/dquote; "',
        f"../../../../../../..{c}/escape",
        f"; touch CANARY-{token}",
        f"$(touch CANARY-{token}-dollar)",
        f"`touch CANARY-{token}-backtick`",
    ]


def test_hostile_label_values_never_run_never_create_files_and_stay_exact_data(
    stack: Stack,
    tmp_path: Path,
) -> None:
    token = uuid.uuid4().hex[:12]
    canary_dir = tmp_path / "canaries"
    canary_dir.mkdir()
    hostile = hostile_values(canary_dir, token)
    service = stack.start()

    # As the model label: no such model, journaled and ignored.
    for n, value in enumerate(hostile):
        alert = make_alert(value, fingerprint=f"{n:016x}")
        assert post_alerts(service, make_payload(alert))[1]["alerts"][0]["disposition"] == (
            "unknown_model"
        )
    # As the alert name: no playbook, journaled and ignored.
    for n, value in enumerate(hostile):
        alert = make_alert("m1", alertname=value, fingerprint=f"a{n:015x}")
        assert post_alerts(service, make_payload(alert))[1]["alerts"][0]["disposition"] == (
            "unrouted"
        )
    # In every other label, the annotations and the fingerprint of a real alert for m1:
    # the run goes all the way (health re-check, SSH lock on the head, playbook).
    labels = {f"h{n}": value for n, value in enumerate(hostile)}
    alert = make_alert("m1", fingerprint=hostile[0], labels=labels)
    alert["annotations"] = {f"a{n}": value for n, value in enumerate(hostile)}
    assert post_alerts(service, make_payload(alert))[1]["alerts"][0]["disposition"] == "started"
    run = wait_until(
        lambda: [r for r in runs_of(stack, "m1") if r["outcome"] not in ("queued", "running")],
        what="the run to end",
    )[0]
    assert run["steps"], "the run reached the playbook"
    wait_until(lambda: not stack.lock_file("m1").exists(), what="the lock released")

    # Kept exactly as sent: data, not mangled and not executed.
    assert run["fingerprint"] == hostile[0]
    assert {k: run["labels"][k] for k in labels} == labels
    unknown = events_of(stack, kind="unknown_model")
    assert len(unknown) == len(hostile)

    # No canary anywhere a shell could have run: the canary dir, the service's cwd,
    # root's home (ssh sessions start there), every node's /tmp and state dir.
    assert list(canary_dir.iterdir()) == []
    places = [stack.workdir, Path.home(), Path.cwd(), Path("/tmp"), Path("/var/tmp")]
    for node in stack.cluster.nodes:
        places += [node.tmp, node.state_dir, node.cache]
    for place in places:
        assert not list(place.glob(f"CANARY-{token}*")), f"a canary appeared in {place}"
    assert not list(tmp_path.rglob("escape")) and not Path(f"{canary_dir}/escape").exists()
    # Only the model lock, the lock of the re-check's probe of m1 on its head, and the
    # record that m1's run stopped its service (written before the stop): all named by the
    # inventory's model, none by a label.
    port = yaml.safe_load(stack.inventory.read_text())["models"]["m1"]["port"]
    for node in stack.cluster.nodes:
        created = sorted(
            p.name for p in node.state_dir.rglob("*") if p.is_file() and p.name != NODE_ID_FILE
        )  # node-id: there before
        assert all(
            name.startswith("m1.lock")
            or name == f"probe-127.0.0.1-{port}.lock"
            or name == "m1.stopped"
            for name in created
        ), created

    # And the on-call page shows them escaped.
    status, page = http("GET", service.url + "/?limit=50", headers=basic())
    assert status == 200
    assert f"; touch {canary_dir}/semicolon" in page
    assert "<script" not in page.lower()
