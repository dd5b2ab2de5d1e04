"""The whole loop's own testbed: three nodes in the three-user mode (the loop runs as
`mlx-medic render` deploys it), whatever MLX_MEDIC_TESTBED_USERS says, and the simulated
JACCL seam in each of its modes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import Cluster, start_cluster
from testbed.jaccl_sim import JacclSim, OnSigkill, start_jaccl_sim
from testbed.node_users import NodeUser
from tests.tools import require_root, require_tool

TOOLS = (
    "sshd",
    "ssh",
    "unshare",
    "nsenter",
    "supervisord",
    "supervisorctl",
    "sudo",
    "setpriv",
    "prometheus",
    "prometheus-alertmanager",
    "lsof",
    "pgrep",
)


@pytest.fixture(scope="module")
def loop_cluster(testbed_workdir: Path) -> Iterator[Cluster]:
    require_root()
    for tool in TOOLS:
        require_tool(tool)
    cluster = start_cluster(3, testbed_workdir / "loop-cluster", node_user=NodeUser())
    try:
        yield cluster
    finally:
        cluster.close()


def simulator(cluster: Cluster, on_sigkill: OnSigkill) -> Iterator[JacclSim]:
    """The loop's simulated JACCL: 3 domains per device, orphans killable for 20 s."""
    sim = start_jaccl_sim(cluster, on_sigkill=on_sigkill, capacity=3, killable_for=20.0)
    try:
        yield sim
    finally:
        sim.close()


@pytest.fixture(scope="module")
def release_sim(loop_cluster: Cluster) -> Iterator[JacclSim]:
    """Mode (a): a domain comes back when its holder dies, however it dies."""
    yield from simulator(loop_cluster, "release")


@pytest.fixture(scope="module")
def keep_sim(loop_cluster: Cluster) -> Iterator[JacclSim]:
    """Mode (b): a holder killed by SIGKILL keeps its domains until its node reboots."""
    yield from simulator(loop_cluster, "keep")


@pytest.fixture
def fresh_release_sim(loop_cluster: Cluster) -> Iterator[JacclSim]:
    """Mode (a) with pools, worlds and frozen groups of this test's own."""
    yield from simulator(loop_cluster, "release")
