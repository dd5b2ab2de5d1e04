"""Over SSH the remediator runs nothing but `mlx-medic node ...` (its probe is one too):
every command its transport runs during an engine run and a full lock round-trip (take,
judge a stale holder on its own node, break, renew, release) starts with the node's
medic_command and then `node`. That is what lets a forced command pin its key."""

from __future__ import annotations

import json
from pathlib import Path

from mlx_medic.model_lock import LockHandle, ModelLocks
from tests.remediator.engine_fakes import (
    MODEL,
    alert,
    dead_pid,
    make_config,
    make_engine,
    make_inventory,
)
from tests.transport_fakes import RecordingTransport


async def test_every_command_on_a_node_is_a_node_helper(tmp_path: Path) -> None:
    inventory = make_inventory()
    transport = RecordingTransport()  # records (node, argv) of every command it runs
    engine = make_engine(make_config(tmp_path), inventory, transport=transport)
    await engine.submit(alert("r1"))
    await engine.wait_idle()
    await engine.close()

    lock = inventory.state_dir / "locks" / f"{MODEL}.lock"
    lock.write_text(
        json.dumps(
            {
                "node": "ai002",
                "pid": dead_pid(),
                "host": "gone",
                "time": 0.0,
                "holder": "serve",
                "run_id": "old",
                "expires": 2e9,
            }
        )
    )
    locks = ModelLocks(inventory, transport, this_node=None, hostname="replica-a")
    handle = await locks.acquire(MODEL, "remediator", "7", renew=False)
    assert isinstance(handle, LockHandle), handle
    assert await locks.renew(handle)
    assert (await locks.current(MODEL)) is not None
    await locks.release(handle)
    assert not lock.exists()

    helpers = [argv[2] for _, argv in transport.commands]
    assert {"lock", "pid-alive"} <= set(helpers)  # the holder was asked about on ai002
    assert ("ai002", "pid-alive") in {(node, argv[2]) for node, argv in transport.commands}
    for node, argv in transport.commands:
        assert argv[0] == inventory.node(node).medic_command, argv
        assert argv[1] == "node", argv
