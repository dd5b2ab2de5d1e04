"""The testbed's simulated JACCL backend, host side (test-only; testbed/README.md).

JACCL (RDMA over Thunderbolt) does not exist on Linux, and the cascade this project
fights is JACCL's: ranks that hold protection domains from a finite per-device pool, and
orphans that hang in the driver instead of exiting. `start_jaccl_sim(cluster)` makes one
simulator: an interpreter shim (`sim.python`, what an inventory's `serve.python` or
`mlx.launch --python` names) under which a rank that mlx.launch started with
`--backend jaccl` allocates its domains and dies as a JACCL rank does
(testbed/jaccl_rank.py), while everything else (mlx.launch, ssh, the ring backend that
carries the traffic, mlx_lm.server) is real. The pools are files under the simulator's
root in the cluster's workdir; this module reads them from the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from testbed import freezer, processes
from testbed.closing import ClosedOnExit
from testbed.cluster import Cluster, SimNode, TestbedError
from testbed.jaccl_rank import (
    CONFIG_ENV,
    DEVICE_PREFIX,
    Config,
    DevicePool,
    read_json,
    start_ticks,
)

REPO = Path(__file__).resolve().parents[1]
SITE_DIR = Path(__file__).resolve().parent / "jaccl_site"  # holds the sitecustomize.py

OnSigkill = Literal["release", "keep"]

_SHIM = """\
#!/bin/sh
# mlx-medic testbed: a Python whose JACCL backend is simulated. TEST-ONLY: never on a real
# cluster (testbed/README.md, "Simulated JACCL"; written by testbed/jaccl_sim.py).
config={config}
if [ ! -f "$config" ] || [ ! -r "$config" ]; then
    echo "mlx-medic testbed: refusing to simulate JACCL: its config $config is missing or" \\
        "unreadable" >&2
    exit 2
fi
export {env}="$config"
export PYTHONPATH={path}${{PYTHONPATH:+:$PYTHONPATH}}
exec {python} "$@"
"""


@dataclass(frozen=True)
class Holder:
    """A process holding (or, in mode "keep", having held) one domain of a device."""

    node: str
    device: str
    slot: int
    pid: int  # as the node sees it
    start_ticks: int
    rank: int
    alive: bool  # its process still holds the domain's lock
    host_pid: int | None  # None once it is gone


@dataclass(frozen=True)
class SimOrphan:
    """A rank that did not exit because a peer died without a normal exit."""

    node: str
    world: str
    rank: int
    pid: int  # as the node sees it
    start_ticks: int
    since: float  # when it decided (time.time()); it freezes `killable_for` later
    stuck: bool  # it has gone to join the node's frozen group
    host_pid: int | None  # None once it is gone


@dataclass
class JacclSim(ClosedOnExit):
    """One simulator on a cluster. Make it with `start_jaccl_sim`; close it (a fixture)."""

    cluster: Cluster
    root: Path
    config: Config
    groups: dict[str, freezer.FreezerGroup] = field(default_factory=dict)
    _closed: bool = field(default=False, repr=False)

    # --- what a test hands the product -----------------------------------------------
    @property
    def python(self) -> Path:
        """The interpreter shim: `mlx.launch --python` / the inventory's `serve.python`."""
        return self.root / "python"

    @property
    def config_path(self) -> Path:
        return self.root / "config.json"

    def serve_settings(self) -> dict[str, Any]:
        """The inventory's `serve:` keys that make a model's ranks run on this simulator."""
        return {"python": str(self.python), "simulated_jaccl": True}

    @property
    def on_sigkill(self) -> OnSigkill:
        return "keep" if self.config.keep_on_sigkill else "release"

    # --- the pools, as the truth a test reads -----------------------------------------
    def devices(self, node: str) -> list[str]:
        """The node's simulated RDMA devices: one per other node of the cluster."""
        self.cluster.node(node)
        return [f"{DEVICE_PREFIX}{n.name}" for n in self.cluster.nodes if n.name != node]

    def pool(self, node: str, device: str) -> DevicePool:
        return DevicePool(
            self.root,
            node,
            device,
            self.config.capacity_of(node, device),
            self.config.keep_on_sigkill,
        )

    def usage(self, node: str) -> dict[str, int]:
        """Domains in use per device of the node."""
        return {device: self.in_use(node, device) for device in self.devices(node)}

    def in_use(self, node: str, device: str | None = None) -> int:
        """Domains in use on one device of the node, or on all of them."""
        devices = [device] if device is not None else self.devices(node)
        total = 0
        for name in devices:
            pool = self.pool(node, name)
            total += sum(pool.in_use(slot) for slot in pool.slots())
        return total

    def holders(self, node: str) -> list[Holder]:
        """Who holds the node's domains in use (mode "keep": the SIGKILLed ones too)."""
        found = []
        for device in self.devices(node):
            pool = self.pool(node, device)
            for slot in pool.slots():
                if not pool.in_use(slot) or slot.record is None:
                    continue
                record = slot.record
                pid, ticks = int(record["pid"]), int(record["start_ticks"])
                found.append(
                    Holder(
                        node,
                        device,
                        slot.index,
                        pid,
                        ticks,
                        int(record["rank"]),
                        slot.held,
                        self._host_pid(node, pid, ticks),
                    )
                )
        return found

    def orphans(self, node: str | None = None) -> list[SimOrphan]:
        """The ranks that stayed as orphans (alive or not: see `host_pid`)."""
        found = []
        for marker in sorted((self.root / "worlds").glob("*/rank-*.orphan")):
            record = read_json(marker)
            if record is None or (node is not None and record.get("node") != node):
                continue
            rank = int(marker.name.removeprefix("rank-").removesuffix(".orphan"))
            pid, ticks = int(record["pid"]), int(record["start_ticks"])
            found.append(
                SimOrphan(
                    str(record["node"]),
                    marker.parent.name,
                    rank,
                    pid,
                    ticks,
                    float(record["at"]),
                    marker.with_suffix(".stuck").exists(),
                    self._host_pid(record["node"], pid, ticks),
                )
            )
        return found

    def wait_for_orphan(self, node: str, timeout: float = 60.0) -> SimOrphan:
        """The first live orphan on the node, waiting for one."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [o for o in self.orphans(node) if o.host_pid is not None]
            if alive:
                return alive[0]
            if time.monotonic() >= deadline:
                raise TestbedError(f"{node}: no simulated JACCL orphan within {timeout:.0f}s")
            time.sleep(0.05)

    def _host_pid(self, node: str, pid: int, ticks: int) -> int | None:
        """The host pid of the node's process `pid`, if it is still the one that wrote it."""
        sim_node = self.cluster.node(node)
        for host_pid in sim_node.host_pids():
            with contextlib.suppress(OSError, ProcessLookupError, ValueError, IndexError):
                if (
                    processes.ns_pid(host_pid) == pid
                    and start_ticks(host_pid) == ticks
                    and processes.is_alive(host_pid)
                ):
                    return host_pid
        return None

    # --- the freeze and the reboot ----------------------------------------------------
    def freezer_group(self, node: str) -> freezer.FreezerGroup:
        """The node's frozen group, which its orphans join once no longer killable."""
        return self.groups[node]

    def thaw(self, node: str, timeout: float = 5.0) -> None:
        """Let the pending kills of the node's stuck orphans land (as a reboot would, without
        one); a survivor with none is moved out, killable again; the group freezes again."""
        group = self.groups[node]
        members = group.members()
        group.thaw()
        deadline = time.monotonic() + timeout
        while any(processes.state(pid) == "D" for pid in members):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        processes.wait_gone(members, 0.2)
        for pid in group.members():
            with contextlib.suppress(OSError):
                (freezer.FREEZER_ROOT / "cgroup.procs").write_text(str(pid))
        group.freeze()

    def clear(self, node: str) -> None:
        """Forget every domain the node's pools hold: what a reboot does to RDMA state."""
        pools = self.root / "pools" / node
        if not pools.is_dir():
            return
        for device in sorted(p.name for p in pools.iterdir() if p.is_dir()):
            self.pool(node, device).clear()

    def _on_reboot(self, node: SimNode) -> None:
        """Cluster.reboot killed (thawed first) every process of the node: empty its pools
        and freeze its group again for the orphans of its new boot."""
        if self._closed or node.name not in self.groups:
            return
        self.clear(node.name)
        group = self.groups[node.name]
        if group.path.exists():
            group.freeze()

    def close(self) -> None:
        """Thaw and remove the frozen groups (their members become killable); idempotent.
        The ranks themselves are the nodes' cleanup's (clean_cluster, Cluster.close)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError):
            self.cluster.reboot_hooks.remove(self._on_reboot)
        for group in self.groups.values():
            freezer.remove_group(group.path)


def start_jaccl_sim(
    cluster: Cluster,
    *,
    on_sigkill: OnSigkill = "release",
    capacity: int = 3,
    capacities: dict[str, dict[str, int]] | None = None,
    killable_for: float = 5.0,
    settle: float = 1.0,
) -> JacclSim:
    """A simulator for `cluster`: its config, its interpreter shim, a frozen group per node.

    `on_sigkill`: "release" (mode a: a domain returns when its holder dies, however it
    dies) or "keep" (mode b: a holder that dies without Python's exit path, SIGKILL above
    all, keeps its domains until `cluster.reboot(node)`). `capacity`: domains per device;
    `capacities`: {node: {device: n}} exceptions. `killable_for`: seconds an orphan stays
    killable before it freezes. `settle`: how long a leaving rank waits to see whether a
    live peer is dying.
    """
    if on_sigkill not in ("release", "keep"):
        raise ValueError(f"on_sigkill {on_sigkill!r}: 'release' or 'keep'")
    if not freezer.available():
        raise TestbedError(f"no cgroup v1 freezer at {freezer.FREEZER_ROOT}: orphans cannot freeze")
    token = uuid.uuid4().hex[:8]
    root = cluster.workdir / "jaccl-sim" / token
    (root / "pools").mkdir(parents=True)
    (root / "worlds").mkdir()
    groups: dict[str, freezer.FreezerGroup] = {}
    try:
        for node in cluster.nodes:
            groups[node.name] = freezer.make_group(f"jaccl-{token}-{node.name}", freeze=True)
    except BaseException:
        for group in groups.values():
            freezer.remove_group(group.path)
        raise
    config = Config(
        root=root,
        keep_on_sigkill=on_sigkill == "keep",
        capacity=capacity,
        capacities=dict(capacities or {}),
        ips={node.name: node.address for node in cluster.nodes},
        freezer={name: str(group.path) for name, group in groups.items()},
        killable_for=killable_for,
        settle=settle,
    )
    if cluster.node_user is not None:  # ranks run as the node's login user (test-only)
        for shared in (root / "pools", root / "worlds"):
            shared.chmod(0o777)
        for group in groups.values():  # a rank freezes itself: it writes its own pid
            for name in ("cgroup.procs", "freezer.state"):
                os.chown(group.path / name, cluster.node_user.uid, cluster.node_user.gid)
    sim = JacclSim(cluster, root, config, groups)
    sim.config_path.write_text(json.dumps(config.to_json(), indent=1) + "\n")
    sim.python.write_text(
        _SHIM.format(
            config=shlex.quote(str(sim.config_path)),
            env=CONFIG_ENV,
            path=shlex.quote(f"{SITE_DIR}:{REPO}"),
            python=shlex.quote(cluster.python),
        )
    )
    sim.python.chmod(0o755)
    cluster.reboot_hooks.append(sim._on_reboot)
    return sim


__all__ = ["Holder", "JacclSim", "OnSigkill", "SimOrphan", "start_jaccl_sim"]
