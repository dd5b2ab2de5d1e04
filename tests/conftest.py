"""Fixtures shared by every test: the simulated cluster and the tiny model.

The session's files live in /var/tmp/mlx-medic-testbed-<token>/ (not /tmp: every node has
its own /tmp, and ranks on every node must read the model and the scripts).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import Cluster, free_port, start_cluster
from testbed.jaccl_sim import JacclSim, start_jaccl_sim
from testbed.node_users import NodeUser
from testbed.tiny_model import make_tiny_model
from tests.tools import require_root, require_tool, three_users

__all__ = ["free_port"]

CLUSTER_NODES = 3


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What the tests' helpers cache (inventory snapshots) goes to a dir of the session's,
    never the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(autouse=True)
def terminal_100_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands that fit their output to the terminal (`mlx-medic log`) see one 100
    columns wide, whether pytest runs in a terminal, a pipe or an xdist worker; a test
    that needs another width sets COLUMNS itself."""
    monkeypatch.setenv("COLUMNS", "100")


@pytest.fixture(scope="session")
def testbed_workdir() -> Iterator[Path]:
    """A per-session directory outside /tmp, removed at the end."""
    path = Path("/var/tmp") / f"mlx-medic-testbed-{uuid.uuid4().hex[:10]}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model(testbed_workdir: Path) -> Path:
    """A tiny qwen2 model directory that real mlx_lm.server serves (generated, never downloaded)."""
    return make_tiny_model(testbed_workdir / "tiny-model")


@pytest.fixture(scope="session")
def cluster(testbed_workdir: Path) -> Iterator[Cluster]:
    """Three simulated nodes ai001..ai003, each a PID+mount namespace with sshd on 127.0.0.N.

    ai001 is the head: `testbed.launch.start_launch` runs mlx.launch inside it. With
    MLX_MEDIC_TESTBED_USERS=three every node has the rendered non-root login user.
    """
    require_root()
    for tool in ("sshd", "ssh", "ssh-keygen", "unshare", "nsenter", "mount"):
        require_tool(tool)
    node_user = NodeUser() if three_users() else None
    started = start_cluster(CLUSTER_NODES, testbed_workdir / "cluster", node_user=node_user)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def clean_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """The session cluster; afterwards every process a test left in a node is killed
    (sshd's listener excepted) and each node's /tmp and private dirs are emptied.
    A node that a test ended is started again."""
    for node in cluster.nodes:
        if not node.is_up():
            cluster.reboot(node.name)
    yield cluster
    for node in cluster.nodes:
        if node.is_up():
            node.kill_all_but_sshd()
        else:
            cluster.reboot(node.name)
        node.wipe_private_dirs()


@pytest.fixture
def releasing_sim(clean_cluster: Cluster) -> Iterator[JacclSim]:
    """The simulated JACCL on the cluster with 4 protection domains per device, a rank's
    given back when it is SIGKILLed (`release`: only a frozen survivor keeps its own),
    ranks killable after 3 s; closed after the test."""
    simulated = start_jaccl_sim(clean_cluster, on_sigkill="release", capacity=4, killable_for=3.0)
    try:
        yield simulated
    finally:
        simulated.close()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this test's own that lives until the test ends (a survivor's stand-in
    where only its pid and start time matter)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()
