"""A cluster on one machine: simulated nodes that are PID + mount namespaces running real sshd.

Each node is `unshare --pid --fork --kill-child --mount-proc --mount` whose pid 1 is
`sshd -D` listening on its own loopback address (127.0.0.2, 127.0.0.3, ...). Inside, `ps`
sees only that node's processes; /tmp and a few dirs are private bind mounts. The host keeps
one ssh_config/known_hosts/key set so the real ssh client (and mlx.launch, through the `ssh`
wrapper in `bin_dir`) reaches the nodes with pinned host keys, never touching ~/.ssh.

Teardown is total: each `unshare` dies with the Python thread that started it
(PR_SET_PDEATHSIG), `--kill-child` takes the namespace down with it, and close() thaws
frozen testbed processes first because a frozen task keeps a namespace alive.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlx_medic.state.node_identity import write_node_id
from testbed import freezer, node_users, processes
from testbed.closing import ClosedOnExit
from testbed.net import wait_listening
from testbed.node_users import NodeUser

SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"
LOCK_DIR = Path("/var/tmp/mlx-medic-testbed-locks")
# Private per-node dirs other than /tmp: mounted at <workdir>/node-local/<name> inside
# every node, so an inventory can name one path that means "this node's own dir".
PRIVATE_DIRS = ("cache", "state", "log")
NODE_AUTHORIZED_KEYS = "authorized_keys"  # in the node's root: keys only this node accepts
# Every node shares the host's kernel, hence its boot id; each node gets its own, a file in
# its root bound over the kernel's inside the node's mount namespace, new at every start.
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
NODE_BOOT_ID = "boot_id"  # in the node's root
_PR_SET_PDEATHSIG = 1


class TestbedError(RuntimeError):
    """The testbed could not be built or torn down; the message says which step failed."""


def _die_with_parent(parent_pid: int) -> Any:
    """A preexec_fn: SIGKILL this child when the thread that forked it ends."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class SimNode:
    name: str
    address: str
    ssh_port: int
    unshare_pid: int
    init_pid: int
    root: Path
    tmp: Path
    cache: Path
    cluster_ssh_config: Path = field(repr=False)
    local_dirs: dict[str, Path] = field(default_factory=dict, repr=False)
    pid_namespace: str = field(default="", repr=False)
    user: NodeUser | None = field(default=None, repr=False)  # the three-user mode's
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    # --- paths ---------------------------------------------------------------
    @property
    def cache_mount(self) -> Path:
        """Where `cache` appears inside the node (the same path on every node)."""
        return self.local_dirs["cache"]

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def state_mount(self) -> Path:
        return self.local_dirs["state"]

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def log_mount(self) -> Path:
        return self.local_dirs["log"]

    @property
    def sshd_log(self) -> Path:
        return self.root / "sshd.log"

    @property
    def boot_id(self) -> str:
        """The boot id processes in this node read from /proc/sys/kernel/random/boot_id:
        its own, not the host's, and a new one after `Cluster.reboot`. A test that writes
        or reads this node's per-boot records from the host passes it (`boot_id=`)."""
        return (self.root / NODE_BOOT_ID).read_text(encoding="ascii").strip()

    def host_path(self, inside: str | Path) -> Path:
        """The host path of a path as this node sees it (/tmp and the private dirs differ)."""
        path = Path(inside)
        mounts = {Path("/tmp"): self.tmp}
        mounts |= {self.local_dirs[name]: self.root / name for name in PRIVATE_DIRS}
        for mount, source in mounts.items():
            if path == mount or mount in path.parents:
                return source / path.relative_to(mount)
        return path

    # --- running things ------------------------------------------------------
    @property
    def authorized_keys(self) -> Path:
        """This node's own authorized_keys (sshd reads it after the cluster's shared one)."""
        return self.root / NODE_AUTHORIZED_KEYS

    def ssh_argv(self, *command: str, identity: Path | None = None) -> list[str]:
        """argv for the real ssh client with the testbed config; `command`: a remote shell line.
        With `identity`, that key is offered first (e.g. one `install_forced_key` made)."""
        key = ["-o", f"IdentityFile={identity}"] if identity is not None else []
        return [SSH, "-F", str(self.cluster_ssh_config), *key, self.name, *command]

    def install_forced_key(self, forced_command: str) -> Path:
        """A second key that this node (only) accepts with `command="forced_command",restrict`;
        returns its private key, for `ssh_argv(identity=...)`. Replaces an earlier one."""
        if '"' in forced_command or "\n" in forced_command:
            raise ValueError("a forced command may not contain '\"' or a newline")
        key = self.root / "forced_ed25519"
        for path in (key, key.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        public = _keygen(key, f"{self.name}-forced")
        self.authorized_keys.write_text(f'command="{forced_command}",restrict {public}\n')
        self.authorized_keys.chmod(0o600)
        return key

    def remove_forced_key(self) -> None:
        self.authorized_keys.write_text("")

    def user_ssh_argv(self, *command: str, identity: Path | None = None) -> list[str]:
        """ssh as the node's login user (three-user mode) with `identity`, by default the
        user's own key (what mlx.launch uses between nodes)."""
        if self.user is None:
            raise TestbedError(f"{self.name}: no login user (start_cluster(node_user=...))")
        key = identity or self.cluster_ssh_config.parent / "user_ed25519"
        return [
            SSH,
            "-F",
            str(self.cluster_ssh_config),
            "-o",
            f"User={self.user.name}",
            "-o",
            f"IdentityFile={key}",
            self.name,
            *command,
        ]

    def install_rendered(self, rendered: Path) -> list[str]:
        """Install `mlx-medic render`'s authorized_keys and sudoers file for this node
        (three-user mode); `visudo -c` must accept the node's whole sudo policy."""
        if self.user is None:
            raise TestbedError(f"{self.name}: no login user (start_cluster(node_user=...))")
        installed = node_users.install_rendered(self.root, self.user, rendered, self.name)
        checked = node_users.visudo_check(self.nsenter_argv(cwd="/"))
        if checked.returncode != 0:
            raise TestbedError(f"{self.name}: visudo -c: {checked.stdout}{checked.stderr}")
        return installed

    def run(
        self, command: str, timeout: float = 30, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command on the node through sshd, like any remote node."""
        result = subprocess.run(
            self.ssh_argv(command),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            raise TestbedError(
                f"{self.name}: {command!r} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def nsenter_argv(self, *argv: str, cwd: str | Path | None = None) -> list[str]:
        """argv that runs `argv` inside the node's PID and mount namespaces (no ssh).

        Entering a mount namespace resets the cwd to its root; `cwd` (default: ours) is
        restored with nsenter --wd.
        """
        wd = str(cwd) if cwd is not None else os.getcwd()
        return ["nsenter", "-t", str(self.init_pid), "-p", "-m", f"--wd={wd}", "--", *argv]

    def spawn(self, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        """Start `argv` inside the node without ssh; the Popen is the host-side nsenter.

        The process itself is `spawned_pid(popen)`. Its orphans are adopted by the node's
        pid 1 (sshd), as on a real node where they go to init/launchd.
        """
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        popen_kwargs.setdefault("start_new_session", True)
        cwd = popen_kwargs.pop("cwd", None)
        return subprocess.Popen(self.nsenter_argv(*argv, cwd=cwd), **popen_kwargs)

    @staticmethod
    def spawned_pid(popen: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
        """The host pid of the process `spawn` started (nsenter's child; nsenter waits for it)."""
        deadline = time.monotonic() + timeout
        while True:
            kids = processes.children(popen.pid)
            if kids:
                return kids[0]
            if popen.poll() is not None:
                raise TestbedError(f"nsenter exited {popen.returncode} before its child started")
            if time.monotonic() >= deadline:
                raise TestbedError(f"nsenter {popen.pid} started no child in {timeout:.0f}s")
            time.sleep(0.01)

    # --- processes -----------------------------------------------------------
    def host_pids(self) -> list[int]:
        """Host pids of every process in this node, sshd (pid 1 inside) included."""
        return processes.pids_in_namespace(self.pid_namespace)

    def ns_pid_of(self, host_pid: int) -> int:
        """The pid as seen inside the node."""
        if processes.pid_namespace(host_pid) != self.pid_namespace:
            raise ProcessLookupError(f"pid {host_pid} is not a process of {self.name}")
        return processes.ns_pid(host_pid)

    def host_pid_of(self, ns_pid: int) -> int:
        """The host pid of the process the node calls `ns_pid`."""
        for pid in self.host_pids():
            if processes.ns_pid(pid) == ns_pid:
                return pid
        raise ProcessLookupError(f"{self.name} has no pid {ns_pid}")

    def find_pids(self, needle: str) -> list[int]:
        """Host pids of this node's processes whose command line contains `needle`."""
        return [pid for pid in self.host_pids() if needle in " ".join(processes.cmdline(pid))]

    def kill_all_but_sshd(self, timeout: float = 10.0) -> None:
        """SIGKILL every process in the node except its sshd listener (pid 1 inside).

        Frozen testbed processes are thawed first so the kill lands.
        """
        deadline = time.monotonic() + timeout
        while True:
            victims = [pid for pid in self.host_pids() if pid != self.init_pid]
            victims = [pid for pid in victims if processes.is_alive(pid)]
            if not victims:
                return
            for pid in victims:
                group = processes.freezer_cgroup(pid)
                if group not in (None, "/"):
                    freezer.thaw_group_of(group)
            for pid in victims:
                processes.kill_quietly(pid)
            processes.wait_gone(victims, 2.0)
            if time.monotonic() >= deadline:
                left = [pid for pid in victims if processes.is_alive(pid)]
                if left:
                    raise TestbedError(f"{self.name}: processes survive SIGKILL: {left}")
                return

    def is_up(self) -> bool:
        return processes.is_alive(self.init_pid) and processes.is_alive(self.unshare_pid)

    def wipe_private_dirs(self) -> None:
        """Empty /tmp and the private dirs (never following symlinks out of them); the
        node keeps its identity (`<state>/node-id`)."""
        _empty_dir(self.tmp, keep=_kept_tmp_names())
        for name in PRIVATE_DIRS:
            _empty_dir(self.root / name)
        self.record_identity()

    def record_identity(self) -> None:
        """Write the node's name to its state dir's `node-id`, as a deployment does once
        per node: every node shares the machine's host name and addresses, so a name is
        the only way `mlx-medic` run inside knows which inventory node it is."""
        write_node_id(self.state_dir, self.name)

    def _stop(self) -> None:
        # pid 1 first: the kernel then ends everything in the namespace, and unshare reaps
        # pid 1 and exits (killing unshare first would leave pid 1 to the host's init).
        # Only while it is still ours: a reaped pid 1's number may already be someone else's.
        if self.init_pid and processes.pid_namespace(self.init_pid) == self.pid_namespace:
            processes.kill_quietly(self.init_pid)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=10)
            if self._popen.poll() is None:
                self._popen.kill()
                self._popen.wait(timeout=10)
        else:
            processes.kill_quietly(self.unshare_pid)


def _empty_dir(directory: Path, keep: frozenset[str] = frozenset()) -> None:
    if not directory.is_dir() or directory.is_symlink():
        return
    for entry in directory.iterdir():
        if entry.name in keep:
            continue  # a mount point of a shared path: removing it would detach the mount
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


@dataclass
class Cluster(ClosedOnExit):
    nodes: list[SimNode]
    workdir: Path
    ssh_config: Path
    known_hosts: Path
    identity: Path
    bin_dir: Path
    # Called with the node after `reboot` started it again, e.g. a simulated JACCL
    # backend forgetting what the node's killed processes held (testbed/jaccl_sim.py).
    reboot_hooks: list[Callable[[SimNode], None]] = field(default_factory=list, repr=False)
    node_user: NodeUser | None = None  # the three-user mode (testbed/node_users.py)
    _locks: list[int] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def head(self) -> SimNode:
        return self.nodes[0]

    @property
    def remediator_identity(self) -> Path:
        """The remediator's key (three-user mode): only the rendered authorized_keys
        accepts it."""
        return self.workdir / "ssh" / "remediator_ed25519"

    @property
    def python(self) -> str:
        """The interpreter ranks run with: this one (under /tmp it is bound into every node)."""
        return sys.executable

    def node(self, name: str) -> SimNode:
        for node in self.nodes:
            if node.name == name or node.address == name:
                return node
        raise KeyError(f"no node {name!r}; nodes: {[n.name for n in self.nodes]}")

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ with the ssh wrapper and this Python's scripts (mlx.launch) first on PATH."""
        env = dict(os.environ)
        python_bin = str(Path(sys.executable).parent)
        rest = [p for p in env.get("PATH", "").split(os.pathsep) if p]
        env["PATH"] = os.pathsep.join([str(self.bin_dir), python_bin, *rest])
        env.update(extra)
        return env

    def hostfile(
        self,
        path: Path,
        nodes: list[str] | None = None,
        backend: str = "ring",
        head_local: bool = True,
    ) -> Path:
        """Write an mlx.launch hostfile for `nodes` (rank order, head first).

        mlx.launch runs a rank without ssh only when its host is the literal `127.0.0.1`;
        with `head_local` the head is written that way (its ring address stays its own
        127.0.0.N), so launched inside the head node (see `testbed.launch`) rank 0 is a
        local child of mlx.launch and the peers go through ssh, as on a real head node.
        """
        names = nodes if nodes is not None else [n.name for n in self.nodes]
        members = [self.node(name) for name in names]
        entries: list[dict[str, Any]] = []
        for index, member in enumerate(members):
            ssh_host = "127.0.0.1" if (index == 0 and head_local) else member.address
            entry: dict[str, Any] = {"ssh": ssh_host, "ips": [member.address]}
            if backend in ("jaccl", "jaccl-ring"):
                entry["rdma"] = [
                    None if j == index else f"rdma_{other.name}" for j, other in enumerate(members)
                ]
            elif backend != "ring":
                raise ValueError(f"backend {backend!r}: the testbed writes ring or jaccl hostfiles")
            entries.append(entry)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entries, indent=2) + "\n")
        return path

    def inventory_yaml(
        self, models: list[dict[str, Any]], *, login_user: str = "root", **top_level: Any
    ) -> str:
        """An inventory naming these nodes, ssh key and pinned known_hosts, and `models`.

        Each model is a dict in the inventory's model format plus its `name`. Every node
        logs in as `login_user`, written out (the inventory's default is not root); root,
        the testbed's own, is allowed explicitly (`ssh.allow_root_login`).
        """
        unnamed = [index for index, model in enumerate(models) if "name" not in model]
        if unnamed:
            raise ValueError(f"models {unnamed} have no 'name' (the alert's model label)")
        data: dict[str, Any] = {
            "state_dir": str(self.head.state_mount),
            "ssh": {
                "identity_file": str(self.identity),
                "known_hosts": str(self.known_hosts),
                "connect_timeout": "5s",
                **({"allow_root_login": True} if login_user == "root" else {}),
            },
            "nodes": {
                node.name: {"ssh": node.address, "user": login_user, "port": node.ssh_port}
                for node in self.nodes
            },
            "models": {
                model["name"]: {k: v for k, v in model.items() if k != "name"} for model in models
            },
        }
        data.update(top_level)
        return yaml.safe_dump(_plain(data), sort_keys=False)

    def deploy(
        self, inventory: Path, targets: tuple[str, ...] = ("authorized-keys", "sudoers")
    ) -> Path | None:
        """Three-user mode: `mlx-medic render` the inventory's `targets` (with the
        remediator's and the serve wrapper's public keys) and install its authorized_keys
        and sudoers files on every node, as a deployment does; the render dir. Root mode:
        nothing (None)."""
        if self.node_user is None:
            return None
        out = Path(inventory).parent / f"rendered-{Path(inventory).stem}"
        shutil.rmtree(out, ignore_errors=True)
        keys = self.workdir / "ssh"
        models = (yaml.safe_load(Path(inventory).read_text()) or {}).get("models") or {}
        serve_key = any((m.get("serve") or {}).get("identity_file") for m in models.values())
        for target in targets:
            argv = [
                str(Path(sys.executable).parent / "mlx-medic"),
                "render",
                target,
                "--inventory",
                str(inventory),
                "--out",
                str(out),
                "--ssh.public-key",
                str(keys / "remediator_ed25519.pub"),
            ]
            if serve_key:
                argv += ["--serve.public-key", str(keys / "serve_ed25519.pub")]
            result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
            if result.returncode != 0:
                raise TestbedError(f"mlx-medic render {target}: {result.stderr.strip()}")
        for node in self.nodes:
            node.install_rendered(out)
        return out

    def reboot(self, name: str, timeout: float = 30.0) -> SimNode:
        """End everything in one node (frozen processes too) and start it again.

        Same name, address, host key and private dirs (their content survives, except that
        /tmp is emptied, as a reboot does), a new boot id; the SimNode object is updated in
        place. Then each of `reboot_hooks` runs with the node.
        """
        node = self.node(name)
        for pid in node.host_pids():
            group = processes.freezer_cgroup(pid)
            if group not in (None, "/"):
                freezer.thaw_group_of(group)
        node._stop()
        left = processes.wait_gone(processes.pids_in_namespace(node.pid_namespace), 10.0)
        if left:
            raise TestbedError(f"{name}: processes survive the reboot: {left}")
        _empty_dir(node.tmp, keep=_kept_tmp_names())
        fresh = _start_node(
            node.name,
            node.address,
            node.ssh_port,
            self.workdir,
            self.ssh_config,
            self.workdir / "ssh" / "authorized_keys",
            node.user,
        )
        for attribute in ("unshare_pid", "init_pid", "pid_namespace", "_popen"):
            setattr(node, attribute, getattr(fresh, attribute))
        _wait_listening(node.address, node.ssh_port, node, timeout)
        for hook in list(self.reboot_hooks):
            hook(node)
        return node

    def close(self) -> None:
        """End every node and everything in it; no process survives. Idempotent."""
        if self._closed:
            return
        self._closed = True
        freezer.thaw_all()
        for node in self.nodes:
            # Thaw anything a test froze in a group this process does not know about.
            for pid in node.host_pids():
                group = processes.freezer_cgroup(pid)
                if group not in (None, "/"):
                    freezer.thaw_group_of(group)
        for node in self.nodes:
            node._stop()
        leftovers: list[int] = []
        for node in self.nodes:
            if node.pid_namespace:
                leftovers += processes.wait_gone(node.host_pids(), 10.0)
        for fd in self._locks:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._locks.clear()
        _live_clusters.discard(self)
        if leftovers:
            raise TestbedError(f"testbed processes survived teardown: {leftovers}")

    def __hash__(self) -> int:
        return id(self)


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


_live_clusters: weakref.WeakSet[Cluster] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for cluster in list(_live_clusters):
        with contextlib.suppress(Exception):
            cluster.close()
    freezer.thaw_all()


# --- building ----------------------------------------------------------------


def _check_workdir(workdir: Path) -> Path:
    workdir = Path(workdir).absolute()
    if workdir == Path("/tmp") or Path("/tmp") in workdir.parents:
        raise ValueError(
            f"workdir {workdir} is under /tmp, but every node has its own /tmp; "
            "use a path such as /var/tmp/mlx-medic-testbed-<token>"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def _claim_address(address: str, port: int) -> int | None:
    """An flock on the address (against other testbeds) and a bind test (against anyone)."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{address}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                os.close(fd)
                raise
            os.close(fd)
            return None
    return fd


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def _sshd_config(
    node_root: Path, address: str, port: int, authorized_keys: Path, user: NodeUser | None = None
) -> str:
    match = node_users.sshd_match_block(user, authorized_keys.parent) if user else []
    return "\n".join(
        [
            f"ListenAddress {address}:{port}",
            f"HostKey {node_root / 'ssh_host_ed25519_key'}",
            "PidFile none",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # The cluster's key, then this node's own keys (a test's forced-command key).
            f"AuthorizedKeysFile {authorized_keys} {node_root / NODE_AUTHORIZED_KEYS}",
            # The workdir may sit under /var/tmp (mode 1777), which StrictModes rejects;
            # the key files themselves are 0600 and root's.
            "StrictModes no",
            "PermitUserEnvironment no",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            "X11Forwarding no",
            "MaxStartups 200",
            "MaxSessions 100",
            "LogLevel INFO",
            "Subsystem sftp /usr/lib/openssh/sftp-server",
            # Root's helpers keep their cache (inventory snapshots) in the node, not in the
            # host's ~/.cache (a node user's home is the node's own already).
            *([] if user else [f"SetEnv XDG_CACHE_HOME={node_root / 'xdg-cache'}"]),
            *match,
            "",
        ]
    )


def _ssh_config(
    nodes: list[tuple[str, str, int]], identity: Path, known_hosts: Path, users: bool = False
) -> str:
    lines = ["# mlx-medic testbed: client side. Used only through `ssh -F`.", ""]
    for name, address, port in nodes:
        lines += [f"Host {name} {address}", f"  HostName {address}", f"  Port {port}", ""]
    if users:
        lines += node_users.ssh_client_block(identity)
    lines += [
        "Host *",
        *([] if users else ["  User root", f"  IdentityFile {identity}"]),
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {known_hosts}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
        "  BatchMode yes",
        "  CheckHostIP no",
        "  ConnectTimeout 10",
        "  LogLevel ERROR",
        "",
    ]
    return "\n".join(lines)


def _known_host_line(address: str, port: int, public_key: str) -> str:
    host = address if port == 22 else f"[{address}]:{port}"
    key_type, key, *_ = public_key.split()
    return f"{host} {key_type} {key}"


def _wait_listening(address: str, port: int, node: SimNode, timeout: float) -> None:
    def node_alive() -> None:
        if node._popen is not None and node._popen.poll() is not None:
            raise TestbedError(
                f"{node.name}: the node exited ({node._popen.returncode}) before sshd listened;"
                f" sshd log {node.sshd_log}:\n{_tail(node.sshd_log)}"
            )

    try:
        wait_listening(address, port, timeout, check=node_alive)
    except TimeoutError:
        raise TestbedError(
            f"{node.name}: sshd did not listen on {address}:{port} within {timeout:.0f}s;"
            f" log:\n{_tail(node.sshd_log)}"
        ) from None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _wait_init(unshare: subprocess.Popen[bytes], name: str, timeout: float = 10.0) -> int:
    """The namespace's pid 1: unshare's child, once it has exec'd sshd."""
    deadline = time.monotonic() + timeout
    while True:
        kids = processes.children(unshare.pid)
        if kids and _exe(kids[0]) == SSHD:
            return kids[0]
        if unshare.poll() is not None or time.monotonic() >= deadline:
            raise TestbedError(
                f"{name}: the namespace's sshd did not start (unshare {unshare.pid})"
            )
        time.sleep(0.01)


def _shared_under_tmp() -> list[Path]:
    """The checkout and the Python environment, where they live under /tmp (topmost only)."""
    here = Path(__file__).resolve().parents[1]
    candidates = {here, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    under = sorted(p for p in candidates if Path("/tmp") in p.parents)
    topmost: list[Path] = []
    for path in under:
        if not any(path == top or top in path.parents for top in topmost):
            topmost.append(path)
    return topmost


def _kept_tmp_names() -> frozenset[str]:
    return frozenset(p.relative_to("/tmp").parts[0] for p in _shared_under_tmp())


def _start_node(
    name: str,
    address: str,
    port: int,
    workdir: Path,
    ssh_config: Path,
    authorized_keys: Path,
    user: NodeUser | None = None,
) -> SimNode:
    root = workdir / "nodes" / name
    for sub in ("tmp", *PRIVATE_DIRS):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    local_dirs = {sub: workdir / "node-local" / sub for sub in PRIVATE_DIRS}
    for mount_point in local_dirs.values():
        mount_point.mkdir(parents=True, exist_ok=True)
    (root / NODE_AUTHORIZED_KEYS).touch(mode=0o600)
    boot_id = root / NODE_BOOT_ID
    boot_id.write_text(f"{uuid.uuid4()}\n", encoding="ascii")
    config = root / "sshd_config"
    config.write_text(_sshd_config(root, address, port, authorized_keys, user))
    if not (root / "ssh_host_ed25519_key").exists():
        _keygen(root / "ssh_host_ed25519_key", f"{name}-host")
    mounts = [("tmp", "/tmp")] + [(sub, str(local_dirs[sub])) for sub in PRIVATE_DIRS]
    binds = [
        f"mount --bind {shlex.quote(str(root / sub))} {shlex.quote(target)}"
        for sub, target in mounts
    ]
    binds.append(f"mount --bind {shlex.quote(str(boot_id))} {shlex.quote(str(BOOT_ID))}")
    # Paths under the host's /tmp that ranks need (a checkout or venv there, as in a CI
    # clone): staged before the private /tmp hides them, then bound back at the same path.
    stage, restore = [], []
    for index, shared in enumerate(_shared_under_tmp()):
        staging = root / "shared" / str(index)
        staging.mkdir(parents=True, exist_ok=True)
        stage.append(f"mount --bind {shlex.quote(str(shared))} {shlex.quote(str(staging))}")
        restore.append(
            f"mkdir -p {shlex.quote(str(shared))}"
            f" && mount --bind {shlex.quote(str(staging))} {shlex.quote(str(shared))}"
        )
    # A node is a clean machine: the host user's shell start-up files do not run in its ssh
    # sessions (pyenv's rehash there waits forever on a lock that a killed node left behind).
    empty_rc = root / "empty-rc"
    empty_rc.write_text("")
    hide_rc = [
        f"mount --bind {shlex.quote(str(empty_rc))} {shlex.quote(str(rc))}"
        for rc in (Path.home() / n for n in (".bashrc", ".bash_profile", ".bash_login", ".profile"))
        if rc.is_file()
    ]
    if user is not None:
        node_users.prepare_node_root(
            root, user, authorized_keys.parent, [root / sub for sub in PRIVATE_DIRS]
        )
        closed = node_users.closed_ancestors(node_users.python_paths())
        binds += node_users.mount_commands(root) + node_users.open_closed_dirs(root, closed)
        hide_rc = [
            line
            for line in hide_rc  # the opened dirs no longer hold them
            if not any(str(parent) in line for parent in closed)
        ]
    script = " && ".join([*stage, *binds, *restore, *hide_rc])
    script += f" && exec {SSHD} -D -e -f {shlex.quote(str(config))}"
    argv = [
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        script,
    ]
    log = (root / "sshd.log").open("ab")
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd="/",
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
    finally:
        log.close()
    node = SimNode(
        name=name,
        address=address,
        ssh_port=port,
        unshare_pid=popen.pid,
        init_pid=0,
        root=root,
        tmp=root / "tmp",
        cache=root / "cache",
        cluster_ssh_config=ssh_config,
        local_dirs=local_dirs,
        user=user,
        _popen=popen,
    )
    node.record_identity()
    try:
        node.init_pid = _wait_init(popen, name)
        node.pid_namespace = processes.pid_namespace(node.init_pid) or ""
        if not node.pid_namespace or node.pid_namespace == processes.pid_namespace(os.getpid()):
            raise TestbedError(f"{name}: sshd is not in a PID namespace of its own")
    except BaseException:
        node._stop()
        raise
    return node


def start_cluster(
    n: int,
    workdir: Path,
    first_address: int = 2,
    ssh_port: int = 22,
    names: list[str] | None = None,
    timeout: float = 30.0,
    node_user: NodeUser | None = None,
) -> Cluster:
    """Start `n` nodes named ai001.. on free loopback addresses from 127.0.0.<first_address>.

    Addresses held by another testbed (an flock under /var/tmp) or by any listener on
    `ssh_port` are skipped, so concurrent test sessions each get their own.
    Must be called from the main thread: a node dies with the thread that started it.
    `node_user`: the three-user mode (testbed/node_users.py).
    """
    if n < 1:
        raise ValueError("a cluster needs at least one node")
    if threading.current_thread() is not threading.main_thread():
        raise TestbedError("start_cluster must run in the main thread (nodes die with it)")
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (namespaces, mounts, sshd)")
    names = names or [f"ai{i:03d}" for i in range(1, n + 1)]
    if len(names) != n:
        raise ValueError(f"{n} nodes but {len(names)} names")
    workdir = _check_workdir(workdir)
    freezer.sweep_stale()
    # sshd's privilege-separation dir; Debian's unit creates it at service start.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    locks: list[int] = []
    addresses: list[str] = []
    octet = first_address
    while len(addresses) < n:
        if octet > 254:
            for held in locks:
                os.close(held)
            raise TestbedError(f"no {n} free loopback addresses from 127.0.0.{first_address}")
        address = f"127.0.0.{octet}"
        claimed = _claim_address(address, ssh_port)
        if claimed is not None:
            locks.append(claimed)
            addresses.append(address)
        octet += 1

    ssh_dir = workdir / "ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    identity = ssh_dir / "id_ed25519"
    if not identity.exists():
        _keygen(identity, "mlx-medic-testbed")
    authorized_keys = ssh_dir / "authorized_keys"
    authorized_keys.write_text(identity.with_suffix(".pub").read_text())
    authorized_keys.chmod(0o600)
    known_hosts = ssh_dir / "known_hosts"
    ssh_config = ssh_dir / "ssh_config"
    ssh_config.write_text(
        _ssh_config(
            [(name, addr, ssh_port) for name, addr in zip(names, addresses, strict=True)],
            identity,
            known_hosts,
            users=node_user is not None,
        )
    )
    if node_user is not None:
        # The user's ssh reads the config and known_hosts; the private keys stay root's.
        node_users.make_keys(ssh_dir, _keygen)
        user_keys = ssh_dir / "user_authorized_keys"
        user_keys.write_text((ssh_dir / "user_ed25519.pub").read_text())
        ssh_dir.chmod(0o711)
        for shared in (ssh_config, user_keys):
            shared.chmod(0o644)
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "ssh"
    wrapper.write_text(
        f"#!/bin/sh\n# testbed ssh: the testbed config, never ~/.ssh\nexec {SSH} -F"
        f' {shlex.quote(str(ssh_config))} "$@"\n'
    )
    wrapper.chmod(0o755)

    cluster = Cluster(
        nodes=[],
        workdir=workdir,
        ssh_config=ssh_config,
        known_hosts=known_hosts,
        identity=identity,
        bin_dir=bin_dir,
        node_user=node_user,
        _locks=locks,
    )
    _live_clusters.add(cluster)
    try:
        known_lines = []
        for name, address in zip(names, addresses, strict=True):
            node = _start_node(
                name, address, ssh_port, workdir, ssh_config, authorized_keys, node_user
            )
            cluster.nodes.append(node)
            public = (node.root / "ssh_host_ed25519_key.pub").read_text()
            known_lines.append(_known_host_line(address, ssh_port, public))
        known_hosts.write_text("\n".join(known_lines) + "\n")
        known_hosts.chmod(0o644)
        for node in cluster.nodes:
            _wait_listening(node.address, node.ssh_port, node, timeout)
    except BaseException:
        cluster.close()
        raise
    return cluster
