"""`mlx-medic serve` on this machine as the head, with a peer that cannot be reached:
what it refuses before any rank starts. A held model lock: exit 3 at once, nothing
touched. An unreachable node in the start sweep: exit 1 naming it, nothing started."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.model_lock import LockHandle, ModelLocks
from mlx_medic.serve.record import read_serve_record
from mlx_medic.state.runs import read_lease
from mlx_medic.transport import LocalTransport
from testbed import free_port

MEDIC = str(Path(sys.executable).parent / "mlx-medic")


def write_inventory(tmp_path: Path) -> Path:
    """n1 is this machine (the head); n2 is an address where nothing answers SSH."""
    path = tmp_path / "inventory.yaml"
    token = uuid.uuid4().hex[:8]
    path.write_text(f"""\
state_dir: {tmp_path / "state"}
ssh: {{connect_timeout: 3s, known_hosts: {tmp_path / "known_hosts"}}}
nodes:
  n1: {{ssh: 127.0.0.1, medic_command: {MEDIC}, medic_config: {path}}}
  n2: {{ssh: 127.0.0.1, port: {free_port()}, medic_command: {MEDIC}, medic_config: {path}}}
models:
  m1:
    model: /models/serve-refusal-{token}
    nodes: [n1, n2]
    port: {free_port()}
    service: {{manager: supervisord, label: m1-{token}}}
    backends: {{ring: {{hostfile: {tmp_path / "ring.json"}, pipeline: true}}}}
    policy: {{kill_grace: 1s}}
""")
    (tmp_path / "known_hosts").write_text("")
    return path


def serve(inventory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MEDIC, "serve", "m1", "--inventory", str(inventory)],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_held_model_lock_refuses_the_start_at_once_and_touches_nothing(tmp_path: Path):
    inventory_path = write_inventory(tmp_path)
    inventory = parse_inventory(inventory_path.read_text())
    locks = ModelLocks(inventory, LocalTransport(), this_node="n1")

    async def hold_and_serve() -> subprocess.CompletedProcess[str]:
        handle = await locks.acquire("m1", "remediator", "remediation 7", renew=False)
        assert isinstance(handle, LockHandle)
        try:
            return await asyncio.to_thread(serve, inventory_path)
        finally:
            await locks.release(handle)

    result = asyncio.run(hold_and_serve())
    assert result.returncode == 3, result.stderr
    assert (
        "already being started or served: locked by remediator (run remediation 7" in result.stderr
    )
    assert "supervisorctl restart m1-" in result.stderr
    assert read_serve_record(inventory.state_dir, "m1") is None  # no record written
    assert not (inventory.state_dir / "runs").exists()  # no run recorded anywhere


def test_an_unreachable_node_stops_the_start_and_is_named(tmp_path: Path):
    inventory_path = write_inventory(tmp_path)
    state = tmp_path / "state"
    result = serve(inventory_path)
    assert result.returncode == 1, result.stderr
    assert (
        "the start sweep is incomplete, so nothing is started on top of possible"
        " orphans: n2: unreachable" in result.stderr
    )
    assert "smoke test" not in result.stderr and "launching" not in result.stderr
    record = read_serve_record(state, "m1")
    assert record is not None and (record.state, record.failed_starts) == ("failed", 1)
    # The run, recorded beside the sweep, was ended by the teardown: its lease is over.
    lease = read_lease(state, "m1")
    assert lease is None or lease.expired(time.time())
    # The lock is released: the next start is refused by the node, not by the lock.
    assert not (state / "locks" / "m1.lock").exists()
    again = serve(inventory_path)
    assert again.returncode == 1 and "n2: unreachable" in again.stderr
    assert json.loads((state / "serve" / "m1.json").read_text())["failed_starts"] == 2


def test_a_lock_helper_that_fails_refuses_the_start_as_a_failure_not_as_already_served(
    tmp_path: Path,
):
    """A lock file the helper will not follow (a symlink) is no holder: exit 1, saying so."""
    inventory_path = write_inventory(tmp_path)
    locks = tmp_path / "state" / "locks"
    locks.mkdir(parents=True)
    (locks / "m1.lock").symlink_to(tmp_path / "elsewhere.lock")
    result = serve(inventory_path)
    assert result.returncode == 1, result.stderr
    assert "cannot take the model lock: the lock helper failed on n1" in result.stderr
    assert "already being started or served" not in result.stderr
    assert not (tmp_path / "elsewhere.lock").exists()
