"""`mlx-medic node probe MODEL`: the probe `mlx-medic probe` makes, at the model's own
address and port on its head, under the node's probe locks, as a helper's document (its
verdict whatever it is, exit 0); no probe and no document when those locks are unusable."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mlx_medic.health import _lock_file_name
from testbed import free_port
from tests.exporter.probe_servers import CountingCompletionServer
from tests.node.helper_runner import Helpers
from tests.node.inventories import two_models


def helpers(tmp_path: Path, port: int, state: Path | None = None) -> Helpers:
    config = tmp_path / "inventory.yaml"
    state = state or tmp_path / "state"
    config.write_text(two_models(str(state)).replace("port: 8080", f"port: {port}"))
    return Helpers(config, state)


def test_a_serving_model_is_up_in_the_helpers_document(tmp_path: Path) -> None:
    with CountingCompletionServer() as server:
        document = helpers(tmp_path, server.port).document("probe", "m1", "--timeout", "5")
    assert {k: document[k] for k in ("model", "host", "port", "up", "conclusive")} == {
        "model": "m1",
        "host": "127.0.0.1",
        "port": server.port,
        "up": True,
        "conclusive": True,
    }
    assert "completed a 1-token request" in document["reason"]
    assert document["latency_seconds"] >= 0
    assert server.requests == 1


def test_a_closed_port_is_down_and_the_helper_still_exits_0(tmp_path: Path) -> None:
    port = free_port()
    document = helpers(tmp_path, port).document("probe", "m1", "--timeout", "5")
    assert (document["up"], document["conclusive"]) == (False, True)
    assert document["reason"] == f"connection refused: nothing listens on 127.0.0.1:{port}"


def test_it_waits_for_the_nodes_probe_lock_as_the_exporters_probe_does(tmp_path: Path) -> None:
    with CountingCompletionServer() as server:
        locks = tmp_path / "state" / "locks"
        locks.mkdir(parents=True)
        fd = os.open(locks / _lock_file_name("127.0.0.1", server.port), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the exporter probes this server right now
            document = helpers(tmp_path, server.port).document("probe", "m1", "--timeout", "0.2")
        finally:
            os.close(fd)
        assert server.requests == 0
    assert (document["up"], document["conclusive"]) == (False, False)
    assert document["reason"].startswith("not probed: another probe of 127.0.0.1:")


def test_unusable_probe_locks_are_a_failure_with_no_document(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = helpers(tmp_path, free_port(), state=blocker).run("probe", "m1", "--timeout", "5")
    assert result.returncode == 1 and result.stdout == ""
    assert "mlx-medic node probe: cannot use the probe locks:" in result.stderr


def test_only_the_models_head_probes_it(tmp_path: Path) -> None:
    result = helpers(tmp_path, free_port()).run("probe", "m1", "--timeout", "5", node="n2")
    assert result.returncode == 2
    assert "keeps this on its head n1, not on n2" in result.stderr
