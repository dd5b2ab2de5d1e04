"""The three-user mode: every node has the rendered non-root login user, as deployed.

`start_cluster(..., node_user=NodeUser())` gives each node, inside its own mount
namespace only, a private `/etc/passwd`, `/etc/group`, `/etc/shadow` and
`/etc/sudoers.d` (bind mounts of files under the node's root; this machine's /etc is
never written) and a `/home` holding the user's home. The user owns the node's state,
cache and log dirs; root keeps running sshd, the exporter and supervisord.

Keys (all generated in `<workdir>/ssh/`):
- `user_ed25519`: the login user's own key, the one mlx.launch's ssh uses between nodes
  (copied into each home as `~/.ssh/id_ed25519`, accepted for that user only, by an sshd
  `Match User` block): the service user can always reach its peers, as on a real cluster.
- `remediator_ed25519`: the remediator's key; accepted only through the rendered
  `authorized_keys` that `install_rendered` puts in the user's home.
- `serve_ed25519`: the serve wrapper's key (copied into each home as
  `~/.ssh/serve_ed25519`, the inventory's `serve.identity_file`), also accepted only
  through the rendered file.

Directories the user must traverse to reach this Python (a pyenv under /root, mode 0700)
are opened inside the node only: a tmpfs with mode 0755 over the closed directory, with
the needed child bound back.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ETC_FILES = ("passwd", "group", "shadow")
SUDOERS_NAME = "mlx-medic"
KEYS = ("user_ed25519", "remediator_ed25519", "serve_ed25519")


@dataclass(frozen=True)
class NodeUser:
    """The login user every node gets (the inventory's `nodes.<name>.user`)."""

    name: str = "mlx-medic"
    uid: int = 61001
    group: str = "mlx-medic"
    gid: int = 61001

    @property
    def home(self) -> Path:
        return Path("/home") / self.name

    @property
    def serve_identity(self) -> Path:
        """The serve wrapper's key as the node sees it (`serve.identity_file`)."""
        return self.home / ".ssh" / "serve_ed25519"


def run_as(user: NodeUser | None) -> list[str]:
    """The argv prefix that runs a command inside a node as `user` (its groups, its
    HOME); none for root mode."""
    if user is None:
        return []
    return [
        "setpriv",
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        "--init-groups",
        "env",
        f"HOME={user.home}",
        f"USER={user.name}",
        f"LOGNAME={user.name}",
    ]


def make_keys(ssh_dir: Path, keygen: Callable[[Path, str], str]) -> None:
    """The three keys of the mode, once per workdir."""
    for name in KEYS:
        if not (ssh_dir / name).exists():
            keygen(ssh_dir / name, f"mlx-medic-testbed-{name.partition('_')[0]}")


def _etc_text(name: str, user: NodeUser) -> str:
    host = Path("/etc") / name
    text = host.read_text() if host.exists() else ""
    lines = [
        line for line in text.splitlines() if line.partition(":")[0] not in (user.name, user.group)
    ]
    added = {
        # bash: mlx.launch's remote script is bash (`[[ -d DIR ]]`)
        "passwd": f"{user.name}:x:{user.uid}:{user.gid}:node user:{user.home}:/bin/bash",
        "group": f"{user.group}:x:{user.gid}:",
        "shadow": f"{user.name}:*:20000:0:99999:7:::",  # `*`: no password, not locked
    }
    return "\n".join([*lines, added[name]]) + "\n"


def prepare_node_root(root: Path, user: NodeUser, ssh_dir: Path, owned: Iterable[Path]) -> None:
    """Write the node's private /etc files and the user's home; `owned`: the node's dirs
    (state, cache, log) the user owns."""
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    for name in ETC_FILES:
        (etc / name).write_text(_etc_text(name, user))
        (etc / name).chmod(0o640 if name == "shadow" else 0o644)
    sudoers = etc / "sudoers.d"
    sudoers.mkdir(exist_ok=True)
    sudoers.chmod(0o755)
    home = root / "home" / user.name
    dot_ssh = home / ".ssh"
    dot_ssh.mkdir(parents=True, exist_ok=True)
    keys = {"id_ed25519": ssh_dir / "user_ed25519", "serve_ed25519": ssh_dir / "serve_ed25519"}
    for target, source in keys.items():
        shutil.copyfile(source, dot_ssh / target)
        shutil.copyfile(source.with_suffix(".pub"), dot_ssh / f"{target}.pub")
        (dot_ssh / target).chmod(0o600)
    (dot_ssh / "authorized_keys").touch(mode=0o600)
    for path in (root / "home", home):
        path.chmod(0o755 if path == root / "home" else 0o700)
    for path in [home, *home.rglob("*"), *owned]:
        os.chown(path, user.uid, user.gid)


def mount_commands(root: Path) -> list[str]:
    """Shell commands, run inside the node's mount namespace, that put the private files
    in place."""
    binds = [(root / "etc" / name, Path("/etc") / name) for name in ETC_FILES]
    binds += [(root / "etc" / "sudoers.d", Path("/etc/sudoers.d")), (root / "home", Path("/home"))]
    made = ("/home",)  # a minimal root file system may lack it
    return [
        ("mkdir -p /home && " if str(target) in made else "") + "mount --bind"
        f" {shlex.quote(str(source))} {shlex.quote(str(target))}"
        for source, target in binds
    ]


def closed_ancestors(paths: Iterable[Path]) -> dict[Path, set[str]]:
    """For each directory others may not traverse on the way to `paths`: the children of it
    the user must reach."""
    found: dict[Path, set[str]] = {}
    for path in paths:
        resolved = Path(os.path.realpath(path))
        for parent in [*reversed(resolved.parents)][1:]:
            if not os.stat(parent).st_mode & 0o001:
                child = resolved.relative_to(parent).parts[0]
                found.setdefault(parent, set()).add(child)
                break
    return found


def python_paths() -> list[Path]:
    """What the user runs: this interpreter, its base installation and the checkout."""
    repo = Path(__file__).resolve().parents[1]
    return [Path(sys.executable), Path(sys.base_prefix), Path(sys.prefix), repo]


def open_closed_dirs(root: Path, closed: dict[Path, set[str]]) -> list[str]:
    """Shell commands that, inside the node only, open each closed dir: its needed
    children staged, a 0755 tmpfs over it, the children bound back."""
    commands = []
    for index, (parent, children) in enumerate(sorted(closed.items())):
        stage = root / "opened" / str(index)
        staged = []
        for child in sorted(children):
            (stage / child).mkdir(parents=True, exist_ok=True)
            commands.append(
                f"mount --bind {shlex.quote(str(parent / child))} {shlex.quote(str(stage / child))}"
            )
            staged.append(child)
        commands.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(parent))}")
        for child in staged:
            commands.append(
                f"mkdir -p {shlex.quote(str(parent / child))} && mount --bind"
                f" {shlex.quote(str(stage / child))}"
                f" {shlex.quote(str(parent / child))}"
            )
    return commands


def sshd_match_block(user: NodeUser, ssh_dir: Path) -> list[str]:
    """The user's keys: its own (mlx.launch), then the rendered file in its home."""
    return [
        f"Match User {user.name}",
        f"  AuthorizedKeysFile {ssh_dir / 'user_authorized_keys'} .ssh/authorized_keys",
    ]


def ssh_client_block(identity: Path) -> list[str]:
    """Client side: root logs in as root with the testbed key, the node user as itself
    with its own key (`Host *` follows and adds what both share)."""
    return [
        "Match localuser root",
        "  User root",
        f"  IdentityFile {identity}",
        "Match localuser *,!root",
        "  IdentityFile ~/.ssh/id_ed25519",
        "",
    ]


def install_rendered(node_root: Path, user: NodeUser, rendered: Path, node: str) -> list[str]:
    """Install what `mlx-medic render` wrote for `node`: its authorized_keys in the user's
    home, its sudoers file (if the node heads a model whose service goes through sudo) in
    the private /etc/sudoers.d. Returns the installed paths as the node sees them."""
    installed = []
    keys = rendered / "authorized-keys" / node / "authorized_keys"
    target = node_root / "home" / user.name / ".ssh" / "authorized_keys"
    shutil.copyfile(keys, target)
    target.chmod(0o600)
    os.chown(target, user.uid, user.gid)
    installed.append(str(user.home / ".ssh" / "authorized_keys"))
    sudoers_dir = node_root / "etc" / "sudoers.d"
    rule = rendered / "sudoers" / node / SUDOERS_NAME
    for old in sudoers_dir.iterdir():
        old.unlink()
    if rule.exists():
        shutil.copyfile(rule, sudoers_dir / SUDOERS_NAME)
        (sudoers_dir / SUDOERS_NAME).chmod(0o440)
        installed.append(f"/etc/sudoers.d/{SUDOERS_NAME}")
    return installed


def visudo_check(nsenter: list[str]) -> subprocess.CompletedProcess[str]:
    """`visudo -c` inside the node: the whole policy, the installed file included."""
    return subprocess.run(
        [*nsenter, "visudo", "-c"], capture_output=True, text=True, timeout=30, check=False
    )
