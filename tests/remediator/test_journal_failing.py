"""A journal that cannot record stops everything: deliveries get 503 (Alertmanager retries
5xx), nothing acts, and the page and /healthz say the journal is failing; once it records
again, the next delivery acts. Made to fail for real: the journal's disk fills (a tiny
tmpfs in the service's own mount namespace), turns read-only on a file-system error (an
ext4 image on a loop device in the service's own mount namespace), or its directory is
removed while the service runs (its writes would then land where no other process reads)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.auth import CredentialStore
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal, JournalError
from mlx_medic.remediator.webapp import make_app
from tests.remediator.conftest import (
    Service,
    basic,
    bearer,
    http,
    make_alert,
    make_payload,
    post_alerts,
    silent_inventory,
    start_service,
    wait_until,
    write_config,
)
from tests.remediator.engine_fakes import (
    Health,
    alert,
    make_config,
    make_engine,
    make_inventory,
)
from tests.tools import require_root, require_tool

# --- the journal's directory removed under a running service (in-process) -------------


@pytest.fixture
async def app_and_engine(
    tmp_path: Path,
    web_config: Any,
) -> AsyncIterator[tuple[TestClient, Engine]]:
    config = make_config(tmp_path, "succeeding", auth=web_config.auth.model_dump())
    engine = make_engine(config, make_inventory(), health=Health(up=False), tmp_path=tmp_path)
    app = make_app(
        engine, engine.journal, config, CollectorRegistry(), CredentialStore(config.auth)
    )
    async with TestClient(TestServer(app)) as client:
        yield client, engine
    await engine.close()


async def test_a_removed_journal_directory_gets_503_and_nothing_acts(
    app_and_engine: tuple[TestClient, Engine],
) -> None:
    client, engine = app_and_engine
    shutil.rmtree(engine.journal.path.parent)
    response = await client.post(
        "/alerts", json=make_payload(make_alert("glm-4_6-5b", fingerprint="gone")), headers=bearer()
    )
    assert response.status == 503
    reason = (await response.json())["reason"]
    assert reason.startswith("the journal cannot record, so nothing acts: the journal file")
    assert "is gone (removed, or its directory was)" in reason
    await engine.wait_idle(0.1)  # nothing queued, nothing running
    assert engine.journal.list_runs() == []
    assert (await client.get("/healthz")).status == 503
    page = await (await client.get("/", headers=basic())).text()
    assert "The journal is failing: nothing acts" in page and "is gone" in page


def test_a_failed_write_is_a_journal_error_remembered_until_a_write_works(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "j" / "journal.sqlite")
    journal._db.execute("PRAGMA query_only=ON")  # every write now fails in SQLite itself
    with pytest.raises(JournalError, match=r"cannot write the journal .*readonly"):
        journal.add_event("x", now=1.0)
    assert journal.problem() == journal.write_failure and journal.write_failure
    journal._db.execute("PRAGMA query_only=OFF")
    journal.add_event("x", now=2.0)
    assert journal.problem() is None


# --- the real service, its journal on a disk that fills up ----------------------------


def in_private_mount_namespace(mount_point: Path, options: str, source: str) -> tuple[str, ...]:
    """argv prefix: a private mount namespace with `mount OPTIONS SOURCE MOUNT_POINT`
    done in it, then exec the rest (so the service keeps this pid)."""
    unshare = require_tool("unshare")
    become_root = () if os.geteuid() == 0 else ("--map-root-user",)
    return (
        unshare,
        "--mount",
        "--propagation",
        "private",
        *become_root,
        "sh",
        "-c",
        'mount $1 "$2" "$0" && shift 2 && exec "$@"',
        str(mount_point),
        options,
        source,
    )


def fill(directory: Path) -> Path:
    """Write zeros into `directory` until its file system says it is full."""
    filler = directory / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def runs(service: Service) -> list[dict[str, Any]]:
    status, body = http("GET", service.url + "/api/remediations", headers=bearer())
    assert status == 200
    return list(body["runs"])


def silent_service_config(tmp_path: Path, journal_path: Path) -> Path:
    """The service's config: its journal at `journal_path`, one model whose head is silent."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(silent_inventory(tmp_path).model_dump(mode="json")))
    (tmp_path / "token").write_text("s3cret-token-for-tests\n")
    (tmp_path / "password").write_text("basic-pass-for-tests\n")
    return write_config(
        tmp_path / "remediator.yml",
        {
            "inventory": str(inventory),
            "journal": str(journal_path),
            "probe_from": "remediator",
            "auth": {
                "bearer_token_file": str(tmp_path / "token"),
                "basic_username": "alertmanager",
                "basic_password_file": str(tmp_path / "password"),
            },
        },
    )


def service_with_journal_on_its_own_disk(
    tmp_path: Path, services: list[Service]
) -> tuple[Service, Path, Path]:
    """The real service, its journal on a 2 MiB tmpfs at MOUNT in its own mount namespace;
    (the service, MOUNT, the tmpfs as seen from here)."""
    mount = tmp_path / "journal-disk"
    mount.mkdir()
    journal_path = mount / "journal.sqlite"
    config = silent_service_config(tmp_path, journal_path)
    service = start_service(
        config,
        journal_path,
        tmp_path,
        wrapper=in_private_mount_namespace(mount, "-t tmpfs -o size=2m", "tmpfs"),
    )
    services.append(service)
    # The tmpfs exists only in the service's namespace; reach it through its root.
    disk = Path(f"/proc/{service.proc.pid}/root") / mount.relative_to("/")
    assert (disk / "journal.sqlite").is_file() and not journal_path.exists()
    return service, mount, disk


def test_a_full_journal_disk_gets_503_acts_on_nothing_and_the_page_says_so(
    tmp_path: Path,
    services: list[Service],
) -> None:
    service, _, disk = service_with_journal_on_its_own_disk(tmp_path, services)
    filler = fill(disk)
    firing = make_payload(make_alert("m1", fingerprint="full"))
    status, body = post_alerts(service, firing)
    assert status == 503, body
    assert body["reason"].startswith(
        "the journal cannot record, so nothing acts: cannot write the journal"
    )
    assert "database or disk is full" in body["reason"]
    assert runs(service) == []  # nothing was queued, nothing ran
    _, metrics = http("GET", service.url + "/metrics", headers=bearer())
    assert "mlx_medic_remediations_total{" not in metrics
    assert "\nmlx_medic_journal_failing 1.0\n" in metrics  # MLXMedicJournalFailing's series
    _, api = http("GET", service.url + "/api/remediations", headers=bearer())
    assert "database or disk is full" in api["journal_problem"]
    health_status, health = http("GET", service.url + "/healthz")
    assert (health_status, health["status"]) == (503, "failing")
    _, page = http("GET", service.url + "/", headers=basic())
    assert "The journal is failing: nothing acts" in page and "database or disk is full" in page
    assert [
        line
        for line in service.log_lines()
        if line.get("level") == "error"
        and line["msg"].startswith("the journal cannot record, nothing acts until it can")
    ]

    filler.unlink()  # the disk has room again: Alertmanager's retry now acts
    status, body = post_alerts(service, firing)
    assert (status, body["alerts"][0]["disposition"]) == (202, "started")
    wait_until(
        lambda: [r for r in runs(service) if r["outcome"] == "unreachable"],
        what="the run, after the journal recovered",
    )  # its head is silent
    assert http("GET", service.url + "/healthz")[0] == 200
    _, page = http("GET", service.url + "/", headers=basic())
    assert "The journal is failing" not in page and "journal_recovered" in page
    _, api = http("GET", service.url + "/api/remediations", headers=bearer())
    assert api["journal_problem"] is None
    _, metrics = http("GET", service.url + "/metrics", headers=bearer())
    assert "\nmlx_medic_journal_failing 0.0\n" in metrics


# --- the same, with writes refused by SQLite itself (in addition to the real ones) -------


async def test_the_first_write_that_fails_ends_the_delivery_with_503_and_no_run(
    app_and_engine: tuple[TestClient, Engine],
) -> None:
    client, engine = app_and_engine
    engine.journal._db.execute("PRAGMA query_only=ON")  # nobody knows yet: no write failed
    response = await client.post(
        "/alerts",
        json=make_payload(make_alert("glm-4_6-5b", fingerprint="first")),
        headers=bearer(),
    )
    assert response.status == 503
    assert "attempt to write a readonly database" in (await response.json())["reason"]
    await engine.wait_idle(0.1)
    engine.journal._db.execute("PRAGMA query_only=OFF")
    assert engine.journal.list_runs() == []
    retried = await client.post(
        "/alerts",
        json=make_payload(make_alert("glm-4_6-5b", fingerprint="first")),
        headers=bearer(),
    )
    assert retried.status == 202  # Alertmanager's retry acts
    await engine.wait_idle()
    assert [r.outcome for r in engine.journal.list_runs()] == ["succeeded"]
    assert engine.journal.list_events(kind="journal_recovered")


async def test_a_run_end_the_journal_refused_is_written_once_it_records_again(
    tmp_path: Path,
) -> None:
    health = Health(up=False)
    health.gate = asyncio.Event()  # the run waits in its re-check
    engine = make_engine(
        make_config(tmp_path, "unrecoverable"), make_inventory(), health=health, tmp_path=tmp_path
    )
    same = alert("held")
    try:
        assert await engine.submit(same) == Disposition.STARTED
        engine.journal._db.execute("PRAGMA query_only=ON")
        health.gate.set()
        await engine.wait_idle()  # it could not journal its start: it stopped, unrecorded
        assert engine.journal_problem() is not None
        engine.journal._db.execute("PRAGMA query_only=OFF")
        assert engine.journal_problem() is None
        (run,) = engine.journal.list_runs()
        assert run.outcome == "failed" and "JournalError" in run.detail
        assert run.steps == []  # nothing acted without a record
        assert await engine.submit(same) == Disposition.STARTED  # the end let go of it
        await engine.wait_idle()
    finally:
        await engine.close()


# --- the real service, its journal's disk turned read-only by a file-system error ----------


def loop_device_of(pid: int, mount_point: Path) -> str:
    """The loop device (`loop3`) behind `mount_point` in the mount namespace of `pid`."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mount_point):
            source = fields[fields.index("-") + 2]
            return Path(source).name
    raise AssertionError(f"{mount_point} is not mounted in process {pid}")


def test_a_journal_disk_gone_read_only_gets_503_and_its_records_survive_the_repair(
    tmp_path: Path,
    services: list[Service],
) -> None:
    """The kernel turns an ext4 file system read-only on an error (`errors=remount-ro`, as
    the journal's disk is mounted here: an image on a loop device that goes with the
    service's mount namespace); made so here with ext4's own `trigger_fs_error`. Such a
    disk cannot be remounted read-write until it is checked, so the repair is: stop, fsck,
    start; no record made before the error is lost."""
    require_root()
    mkfs, fsck = require_tool("mkfs.ext4"), require_tool("e2fsck")
    image, mount = tmp_path / "journal-disk.img", tmp_path / "journal-disk"
    mount.mkdir()
    with image.open("wb") as out:
        out.truncate(16 * 1024 * 1024)
    subprocess.run([mkfs, "-q", "-F", str(image)], check=True)
    journal_path = mount / "journal.sqlite"
    config = silent_service_config(tmp_path, journal_path)

    def start() -> Service:
        service = start_service(
            config,
            journal_path,
            tmp_path,
            wrapper=in_private_mount_namespace(mount, "-o loop,errors=remount-ro", str(image)),
        )
        services.append(service)
        return service

    service = start()
    status, _ = post_alerts(service, make_payload(make_alert("m1", fingerprint="before")))
    assert status == 202
    wait_until(
        lambda: [r for r in runs(service) if r["outcome"] == "unreachable"], what="the run before"
    )  # its head is silent
    device = loop_device_of(service.proc.pid, mount)
    Path(f"/sys/fs/ext4/{device}/trigger_fs_error").write_text("1")

    status, body = post_alerts(service, make_payload(make_alert("m1", fingerprint="after")))
    assert status == 503, body
    assert body["reason"].startswith("the journal cannot record, so nothing acts:")
    assert body["reason"].endswith("journal.sqlite: disk I/O error")
    _, metrics = http("GET", service.url + "/metrics", headers=bearer())
    assert "\nmlx_medic_journal_failing 1.0\n" in metrics
    _, api = http("GET", service.url + "/api/remediations", headers=bearer())
    assert api["journal_problem"] and [r["outcome"] for r in api["runs"]] == ["unreachable"]
    assert http("GET", service.url + "/healthz")[0] == 503
    _, page = http("GET", service.url + "/", headers=basic())
    assert "The journal is failing: nothing acts" in page

    # The repair: stop (the namespace and its loop device go with it), check, start.
    service.stop()
    subprocess.run([fsck, "-f", "-y", str(image)], capture_output=True)
    service = start()
    assert http("GET", service.url + "/healthz")[0] == 200
    assert [r["outcome"] for r in runs(service)] == ["unreachable"]  # the record survived
    status, _ = post_alerts(service, make_payload(make_alert("m1", fingerprint="after")))
    assert status == 202
