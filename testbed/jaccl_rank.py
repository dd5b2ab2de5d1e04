"""The simulated JACCL backend, as it runs inside a rank (test-only; testbed/README.md).

JACCL does not exist on Linux. In a rank that the simulator's interpreter shim started
with mlx.launch's JACCL environment, testbed/jaccl_site/sitecustomize.py loads this module
(by file path: the `testbed` package would pull in yaml and mlx_medic) as soon as the rank
imports mlx.core, and `install` replaces `mlx.core.distributed.init`:

- The first "any"/"jaccl" call takes one protection domain on each RDMA device of the
  rank's MLX_IBV_DEVICES row, in row order, from its node's finite pool. A device with
  none free gives back what this call took and raises JACCL's own
  `RuntimeError: [jaccl] Couldn't allocate protection domain`.
- Otherwise a side channel on MLX_JACCL_COORDINATOR, then the real ring backend
  underneath, on ports derived from the coordinator's.
- A rank whose peer died without a normal exit does not exit: like a JACCL rank stuck in
  the driver it ignores SIGTERM, stays killable for `killable_for` seconds, then joins
  its node's frozen cgroup (state D, SIGKILL pending until the group is thawed).

Standard library only, and nothing on stdout or stderr but what JACCL itself would say.
The files under the simulator's root are defined here once; testbed/jaccl_sim.py reads
them from the host with the same classes.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

CONFIG_ENV = "MLX_MEDIC_JACCL_SIM"
ALLOCATION_ERROR = "[jaccl] Couldn't allocate protection domain"  # mlx jaccl/rdma.cpp
DEVICE_PREFIX = "rdma_"  # the testbed's jaccl hostfile: rdma_<name of the peer's node>
HOLDER_SUFFIX = ".holder"


class SimConfigError(Exception):
    """The simulator's config cannot be read: the rank must not run unsimulated."""


@dataclass(frozen=True)
class Config:
    """What the simulator (testbed/jaccl_sim.py) wrote for its ranks, as JSON."""

    root: Path
    keep_on_sigkill: bool  # mode (b): a death that skips Python's exit path keeps its domains
    capacity: int  # domains per device, unless `capacities` says otherwise
    ips: dict[str, str]  # node name -> ring address
    freezer: dict[str, str]  # node name -> its frozen cgroup (a directory path)
    killable_for: float
    settle: float
    capacities: dict[str, dict[str, int]] = field(default_factory=dict)

    def capacity_of(self, node: str, device: str) -> int:
        return self.capacities.get(node, {}).get(device, self.capacity)

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "keep_on_sigkill": self.keep_on_sigkill,
            "capacity": self.capacity,
            "capacities": self.capacities,
            "ips": self.ips,
            "freezer": self.freezer,
            "killable_for": self.killable_for,
            "settle": self.settle,
        }

    @classmethod
    def load(cls, path: str | Path) -> Config:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(
                root=Path(data["root"]),
                keep_on_sigkill=bool(data["keep_on_sigkill"]),
                capacity=int(data["capacity"]),
                capacities={
                    n: {d: int(c) for d, c in devs.items()}
                    for n, devs in data.get("capacities", {}).items()
                },
                ips={str(k): str(v) for k, v in data["ips"].items()},
                freezer={str(k): str(v) for k, v in data["freezer"].items()},
                killable_for=float(data["killable_for"]),
                settle=float(data["settle"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SimConfigError(f"{path}: {exc}") from None


def start_ticks(pid: int | str = "self") -> int:
    """The process's start time in clock ticks (/proc/PID/stat field 22): with the pid,
    an identity the host can check (the node's /proc and the host's agree on it)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def _lock_free(path: Path) -> bool:
    """True when nobody holds an flock on `path` (shared probe: probes never collide)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # also drops the probe's lock
    return True


def _shared_dir(path: Path, levels: int) -> None:
    """Make `path` and let every user write it (and the `levels - 1` dirs above it): the
    simulator's files are shared by root on the host and the ranks, which run as the
    node's login user in the three-user mode (test-only, in the test's own workdir)."""
    path.mkdir(parents=True, exist_ok=True)
    for directory in [path, *path.parents][:levels]:
        with contextlib.suppress(OSError):  # not ours: its owner made it writable already
            os.chmod(directory, 0o777)


def _shared_open(path: Path) -> int:
    """Open (creating) a lock or slot file that every user may lock and write."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)
    return fd


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` atomically, so a reader on the host never sees half a record."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --- the pool ------------------------------------------------------------------------


@dataclass
class Domain:
    """One protection domain a live process holds: an flock on its slot file (the kernel
    drops it at the holder's death, however it dies) and a holder record (that only the
    holder's normal exit paths remove: what mode (b) counts after a SIGKILL)."""

    fd: int
    record: Path
    device: str

    def release(self) -> None:
        if self.fd < 0:
            return
        self.record.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = -1


@dataclass(frozen=True)
class Slot:
    index: int
    held: bool  # a live process holds its flock
    record: dict[str, Any] | None  # what its holder wrote, if the record is there


@dataclass(frozen=True)
class DevicePool:
    """The protection domains of one simulated RDMA device of one node, as files under
    `<root>/pools/<node>/<device>/`: `lock` (taken for every allocation and every read,
    so both are atomic), `slot-<k>` (flocked by its holder) and `slot-<k>.holder`."""

    root: Path
    node: str
    device: str
    capacity: int
    keep_on_sigkill: bool

    @property
    def path(self) -> Path:
        return self.root / "pools" / self.node / self.device

    def _slot(self, index: int) -> Path:
        return self.path / f"slot-{index}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        _shared_dir(self.path, 2)  # <node>/<device>
        fd = _shared_open(self.path / "lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def take(self, holder: dict[str, Any]) -> Domain | None:
        """A free domain for this process, or None when the device has none left."""
        with self._locked():
            for index in range(self.capacity):
                slot = self._slot(index)
                record = slot.with_name(slot.name + HOLDER_SUFFIX)
                fd = _shared_open(slot)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                if self.keep_on_sigkill and record.exists():
                    os.close(fd)  # its holder was killed: spent until the node reboots
                    continue
                _write_json(record, {**holder, "device": self.device, "slot": index})
                return Domain(fd, record, self.device)
        return None

    def slots(self) -> list[Slot]:
        """Every slot as it is now (read under the pool's lock, so no allocation races)."""
        if not self.path.is_dir():
            return [Slot(index, False, None) for index in range(self.capacity)]
        found = []
        with self._locked():
            for index in range(self.capacity):
                slot = self._slot(index)
                record = read_json(slot.with_name(slot.name + HOLDER_SUFFIX))
                found.append(Slot(index, not _lock_free(slot), record))
        return found

    def in_use(self, slot: Slot) -> bool:
        return slot.held or (self.keep_on_sigkill and slot.record is not None)

    def clear(self) -> None:
        """Forget every holder record: the node rebooted, its processes are gone."""
        if not self.path.is_dir():
            return
        with self._locked():
            for record in self.path.glob(f"slot-*{HOLDER_SUFFIX}"):
                record.unlink(missing_ok=True)


# --- the launch's ranks ----------------------------------------------------------------


@dataclass
class World:
    """The ranks of one launch, as files under `<root>/worlds/<id>/`: each rank holds an
    flock on `rank-<i>` for its life and writes `rank-<i>.exiting` then `.done` on its
    normal exit path (`.orphan`, `.stuck` when it does not exit). A peer whose lock is
    free without `.done` died without a normal exit: the other ranks are orphans."""

    path: Path
    rank: int
    size: int
    fd: int = -1

    def _file(self, rank: int, suffix: str = "") -> Path:
        return self.path / f"rank-{rank}{suffix}"

    def join(self, info: dict[str, Any]) -> None:
        _shared_dir(self.path, 1)
        self.fd = _shared_open(self._file(self.rank))
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        _write_json(self._file(self.rank, ".json"), info)

    def mark(self, what: str, **data: Any) -> None:
        _write_json(self._file(self.rank, f".{what}"), {"at": time.time(), **data})

    def _peer_left_normally(self, peer: int) -> bool | None:
        """True: done, or on its way out normally. False: died without a normal exit.
        None: alive and running."""
        if _lock_free(self._file(peer)):
            # The lock is dropped only at death, after `.done` was written: read it after.
            return self._file(peer, ".done").exists()
        exiting = self._file(peer, ".exiting").exists()
        return True if exiting and not self._file(peer, ".orphan").exists() else None

    def orphaned(self, settle: float) -> bool:
        """Whether a peer died without a normal exit. A peer still alive gets `settle`
        seconds to show how it ends (its socket may close before its lock is dropped)."""
        pending = {peer for peer in range(self.size) if peer != self.rank}
        deadline = time.monotonic() + settle
        while pending:
            for peer in sorted(pending):
                verdict = self._peer_left_normally(peer)
                if verdict is False:
                    return True
                if verdict:
                    pending.discard(peer)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        return False


# --- the rank ------------------------------------------------------------------------

ORDERLY_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _receive(conn: socket.socket) -> dict[str, Any]:
    """One line of JSON. The socket has a short timeout: waiting in Python, not in one
    long system call, lets a SIGTERM's handler run whichever thread the signal hit."""
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            raise ConnectionError("the side channel closed")
        data += chunk
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ConnectionError(f"the side channel sent {message!r}")
    return message


class SimulatedRank:
    """This process as a JACCL rank: its place (from mlx.launch's environment), the
    domains it holds, its world, and how it leaves."""

    def __init__(self, config: Config, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.config = config
        self.rank = int(env["MLX_RANK"])
        self.matrix: list[list[str | None]] = json.loads(Path(env["MLX_IBV_DEVICES"]).read_text())
        self.coordinator = env["MLX_JACCL_COORDINATOR"]
        self.port = int(self.coordinator.rpartition(":")[2])
        self.size = len(self.matrix)
        row = self.matrix[self.rank]
        if env.get("MLX_JACCL_RING"):  # jaccl-ring: only the neighbours' devices
            peers = sorted({(self.rank - 1) % self.size, (self.rank + 1) % self.size})
        else:
            peers = list(range(self.size))
        self.devices = [d for j in peers if j != self.rank and (d := row[j]) is not None]
        self.node = self.node_of(self.rank) if self.size > 1 else ""
        self.group: Any = None
        self.domains: list[Domain] = []
        self.world: World | None = None
        self._lock = threading.Lock()
        self._leaving = False
        self._exit_paths_installed = False

    def node_of(self, rank: int) -> str:
        """Rank j's node: cell [k][j] of any other row names it (`rdma_<node>`)."""
        for k, row in enumerate(self.matrix):
            cell = row[rank] if k != rank else None
            if isinstance(cell, str) and cell.startswith(DEVICE_PREFIX):
                return cell[len(DEVICE_PREFIX) :]
        raise RuntimeError(f"[jaccl] simulated: no node name for rank {rank} in {self.matrix}")

    # --- init ---------------------------------------------------------------------------
    def init(self, real_init: Callable[..., Any]) -> Any:
        """The group: the first call allocates and connects, later calls return it."""
        with self._lock:
            if self.group is not None:
                return self.group
            if self.size < 2:
                return real_init(strict=False, backend="any")  # no peers: a singleton
            self.domains = self._allocate()
            if not self._exit_paths_installed:  # from here every orderly way out gives
                self._install_signal_handlers()  # the domains back (and says so)
                atexit.register(self._at_exit)
                self._exit_paths_installed = True
            try:
                self._rendezvous()
                group = self._ring(real_init)
            except BaseException:
                self._leave_failed_init()
                raise
            self.group = group
            return group

    def _leave_failed_init(self) -> None:
        """A failed init gives its domains back and leaves its world in order: the rank
        goes on (or exits) as an ordinary process, never an orphan."""
        for domain in self.domains:
            domain.release()
        self.domains = []
        if self.world is not None:
            self.world.mark("exiting")
            self.world.mark("done")
            self.world = None

    def _allocate(self) -> list[Domain]:
        """One domain per device in row order; all or nothing, as MeshGroup's constructor
        (a throw destroys the connections made so far: ~Connection deallocates)."""
        holder = {
            "pid": os.getpid(),
            "start_ticks": start_ticks(),
            "node": self.node,
            "rank": self.rank,
            "coordinator": self.coordinator,
            "argv": list(sys.argv),
            "since": time.time(),
        }
        taken: list[Domain] = []
        for device in self.devices:
            pool = DevicePool(
                self.config.root,
                self.node,
                device,
                self.config.capacity_of(self.node, device),
                self.config.keep_on_sigkill,
            )
            domain = pool.take(holder)
            if domain is None:
                for given_back in taken:
                    given_back.release()
                raise RuntimeError(ALLOCATION_ERROR)
            taken.append(domain)
        return taken

    def _ring(self, real_init: Callable[..., Any]) -> Any:
        """The real ring backend: a hostfile in rank order, ports after the coordinator's
        (a second launch of one model reuses them; another starting port does not collide)."""
        hosts = []
        for rank in range(self.size):
            node = self.node_of(rank)
            if node not in self.config.ips:
                raise RuntimeError(f"[jaccl] simulated: node {node!r} has no address")
            hosts.append([f"{self.config.ips[node]}:{self.port + 1 + rank}"])
        fd, path = tempfile.mkstemp(prefix="mlx-medic-jaccl-sim-", suffix=".json")
        before = os.environ.get("MLX_HOSTFILE")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(hosts, out)
            os.environ["MLX_HOSTFILE"] = path
            return real_init(strict=True, backend="ring")
        finally:
            os.unlink(path)
            if before is None:
                os.environ.pop("MLX_HOSTFILE", None)
            else:
                os.environ["MLX_HOSTFILE"] = before

    def _join(self, world_id: int, info: dict[str, Any]) -> None:
        world = World(
            self.config.root / "worlds" / f"{self.port}-{world_id:08x}", self.rank, self.size
        )
        world.join(info)
        self.world = world

    def _rendezvous(self) -> None:
        """JACCL's side channel on MLX_JACCL_COORDINATOR (rank 0 listens there): every rank
        is allocated and holds its world lock before any starts the real ring, whose init
        waits for its peers in C++ with the GIL held (no signal handler runs there, and a
        peer that never comes would keep it there for ever)."""
        host, _, port = self.coordinator.rpartition(":")
        address = (host, int(port))
        info = {"node": self.node, "pid": os.getpid(), "start_ticks": start_ticks()}
        if self.rank == 0:
            self._coordinate(address, info)
            return
        while True:
            try:
                conn = socket.create_connection(address, timeout=1.0)
            except OSError:
                time.sleep(0.1)  # rank 0 is not listening yet
                continue
            with conn:
                conn.settimeout(0.2)
                try:
                    _send(conn, {"rank": self.rank, "start_ticks": info["start_ticks"]})
                    world_id = int(_receive(conn)["world"])
                except (OSError, ValueError, KeyError):
                    time.sleep(0.1)  # not (or no longer) our launch's coordinator: again
                    continue
                self._join(world_id, info)
                try:
                    _send(conn, {"joined": self.rank})
                    _receive(conn)  # go
                except (OSError, ValueError) as exc:
                    raise RuntimeError(
                        f"[jaccl] simulated side channel: rank 0 left during initialization ({exc})"
                    ) from None
                return

    def _coordinate(self, address: tuple[str, int], info: dict[str, Any]) -> None:
        """Rank 0's side: wait for one peer per rank. A peer older than our launcher (a
        rank of an earlier launch of the model, left waiting when that launch died) is
        not ours; of two for one rank, the younger is."""
        try:
            launched = start_ticks(os.getppid())  # mlx.launch started this rank
        except (OSError, ValueError, IndexError):
            launched = 0
        peers: dict[int, tuple[int, socket.socket]] = {}
        with socket.create_server(address) as listener:
            listener.settimeout(0.2)
            try:
                while len(peers) < self.size - 1:
                    try:
                        conn, _ = listener.accept()
                    except TimeoutError:
                        continue
                    try:
                        conn.settimeout(0.2)
                        hello = _receive(conn)
                        rank, started = int(hello["rank"]), int(hello["start_ticks"])
                    except (OSError, ValueError, KeyError):
                        conn.close()  # a peer that died on the way in: it will not be ours
                        continue
                    if started < launched or started < peers.get(rank, (0, conn))[0]:
                        conn.close()
                        continue
                    if rank in peers:
                        peers[rank][1].close()
                    peers[rank] = (started, conn)
                world_id = secrets.randbelow(2**31 - 2) + 1
                self._join(world_id, info)
                ordered = [conn for _, (_, conn) in sorted(peers.items())]
                for conn in ordered:
                    _send(conn, {"world": world_id})
                for conn in ordered:
                    _receive(conn)  # joined: it holds its world lock
                for conn in ordered:
                    _send(conn, {"go": True})
            except (OSError, ValueError) as exc:
                raise RuntimeError(
                    f"[jaccl] simulated side channel: a peer left during initialization ({exc})"
                ) from None
            finally:
                for _, conn in peers.values():
                    conn.close()

    # --- leaving ------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        """SIGTERM, and SIGHUP (what ends a peer rank when mlx.launch's teardown ends its
        `ssh -tt`), are orderly exits: the domains go back. Not where the program has a
        handler of its own (it then leads to the atexit path itself), nor from a thread
        other than the main one (Python allows none there)."""
        with contextlib.suppress(ValueError):
            for sig in ORDERLY_SIGNALS:
                if signal.getsignal(sig) is signal.SIG_DFL:
                    signal.signal(sig, self._on_orderly_signal)

    def _on_orderly_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._leaving:
            return
        self._leave()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of it, as without the handler

    def _at_exit(self) -> None:
        if not self._leaving:
            self._leave()

    def _leave(self) -> None:
        """The normal exit path: an orphan stays (never returns); else done, domains back."""
        self._leaving = True
        world = self.world
        if world is not None:
            world.mark("exiting")
            if world.orphaned(self.config.settle):
                self._stay_as_orphan(world)
            world.mark("done")
        for domain in self.domains:
            domain.release()

    def _stay_as_orphan(self, world: World) -> None:
        """Stuck in the driver: deaf to SIGTERM (SIGHUP, SIGINT), killable for a while,
        then uninterruptible in the node's frozen group until it is thawed."""
        for sig in (*ORDERLY_SIGNALS, signal.SIGINT):
            with contextlib.suppress(ValueError):
                signal.signal(sig, signal.SIG_IGN)
        world.mark("orphan", node=self.node, pid=os.getpid(), start_ticks=start_ticks())
        deadline = time.monotonic() + self.config.killable_for
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))
        world.mark("stuck")
        group = self.config.freezer.get(self.node)
        if group:
            with contextlib.suppress(OSError):
                state = Path(group, "freezer.state")
                if state.read_text().strip() != "FROZEN":  # thawed by a cleanup: again
                    state.write_text("FROZEN")
                Path(group, "cgroup.procs").write_text("0")  # frozen from here until thawed
        while True:
            time.sleep(3600)


# --- installing -----------------------------------------------------------------------


def _patch(module: Any, config: Config) -> None:
    """Replace mlx.core.distributed.init; backends other than any/jaccl go straight through.
    The rank is read from the environment at the first call, where JACCL reads it."""
    distributed = module.distributed
    real_init = distributed.init
    ranks: list[SimulatedRank] = []
    lock = threading.Lock()

    def init(strict: bool = False, backend: str = "any", **kwargs: Any) -> Any:
        if backend not in ("any", "jaccl"):
            return real_init(strict=strict, backend=backend, **kwargs)
        with lock:
            if not ranks:
                try:
                    ranks.append(SimulatedRank(config))
                except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                    raise RuntimeError(
                        f"[jaccl] simulated: this rank's JACCL environment cannot be read ({exc})"
                    ) from None
        return ranks[0].init(real_init)

    init.__doc__ = real_init.__doc__
    distributed.init = init


def install(module: Any, config_path: str) -> None:
    """Called by testbed/jaccl_site/sitecustomize.py once a JACCL rank has imported
    mlx.core: refuse (exit 2) without a readable config, else patch its distributed.init."""
    try:
        config = Config.load(config_path)
    except SimConfigError as exc:
        print(
            f"mlx-medic testbed: refusing to simulate JACCL: the simulator's config "
            f"cannot be read ({exc})",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)
    _patch(module, config)
