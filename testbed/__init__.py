"""A cluster on one machine for mlx-medic's tests: simulated nodes, mlx.launch, a tiny model."""

from testbed.cluster import Cluster, SimNode, TestbedError, start_cluster
from testbed.net import free_port, wait_listening

__all__ = ["Cluster", "SimNode", "TestbedError", "free_port", "start_cluster", "wait_listening"]
