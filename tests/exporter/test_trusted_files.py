"""No escalation through files: a root exporter refuses to run from an interpreter,
virtualenv, package or inventory another user could change, naming the path, its owner
and its mode; and whatever a user may put at a path root reads (a FIFO at a log's path,
in a tmp dir, at a tmp dir's path) is reported, never read, so the exporter never hangs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_medic.exporter.trusted_files import Checked, refusal, running_paths, untrusted
from tests.tools import require_root

OTHER = 4_000_123  # a uid with no passwd entry: "another user"


@pytest.fixture
def root_dir(tmp_path: Path) -> Path:
    """A directory only root may write, on a way to it only root may change."""
    require_root()
    for directory in (tmp_path, *tmp_path.parents):
        st = directory.stat()
        if st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & 0o1000):
            pytest.skip(f"{directory} is not root's alone: nothing below it can be trusted")
    base = tmp_path / "root"
    base.mkdir(mode=0o755)
    return base


def faults(*checks: Checked) -> list[tuple[str, str]]:
    return [(u.path, u.why) for u in untrusted(checks)]


def venv(base: Path) -> Path:
    path = base / "venv"
    (path / "lib" / "site-packages" / "pkg").mkdir(parents=True)
    (path / "lib" / "site-packages" / "pkg" / "__init__.py").write_text("")
    (path / "bin").mkdir()
    (path / "bin" / "python").symlink_to(sys.executable)
    return path


def test_a_virtualenv_only_root_may_write_is_trusted(root_dir: Path):
    assert faults(Checked("virtualenv", venv(root_dir), tree=True)) == []


def test_a_world_writable_virtualenv_is_refused_naming_the_path_and_its_mode(root_dir: Path):
    path = venv(root_dir)
    path.chmod(0o777)
    (found,) = untrusted([Checked("virtualenv", path, tree=True)])
    assert (found.path, found.why) == (str(path), "is world-writable")
    said = found.describe()
    assert said.startswith(
        f"the virtualenv {path} is world-writable (owner root, mode drwxrwxrwx 0777)"
    )
    assert "could gain root through it" in said


def test_anything_below_the_virtualenv_another_user_may_change_is_refused(root_dir: Path):
    path = venv(root_dir)
    module = path / "lib" / "site-packages" / "pkg" / "__init__.py"
    os.chown(module, OTHER, OTHER)
    sticky = path / "lib" / "site-packages" / "drop"
    sticky.mkdir()
    sticky.chmod(0o1777)  # sticky or not: anyone may add a module to it
    group = path / "bin" / "activate"
    group.write_text("")
    group.chmod(0o664)
    assert sorted(faults(Checked("virtualenv", path, tree=True))) == sorted(
        [
            (str(module), f"is owned by {OTHER} (uid {OTHER}), not root"),
            (str(sticky), "is world-writable"),
            (str(group), "is group-writable (gid 0)"),
        ]
    )


def test_a_world_writable_inventory_or_a_dir_on_its_way_is_refused(root_dir: Path):
    loose = root_dir / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    inventory = loose / "inventory.yaml"
    inventory.write_text("nodes: {}\n")
    assert faults(Checked("inventory", inventory, regular_file=True)) == [
        (str(loose), "is world-writable")
    ]
    inventory.chmod(0o666)
    assert [why for _, why in faults(Checked("inventory", inventory))] == [
        "is world-writable",
        "is world-writable",
    ]
    os.chown(inventory, OTHER, OTHER)
    inventory.chmod(0o644)
    assert (str(inventory), f"is owned by {OTHER} (uid {OTHER}), not root") in faults(
        Checked("inventory", inventory)
    )


def test_a_sticky_dir_on_the_way_is_fine_but_a_link_into_another_users_dir_is_not(
    root_dir: Path,
):
    sticky = root_dir / "sticky"  # as /tmp or /var/tmp: root's entry in it is root's
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "etc").mkdir()
    inventory = sticky / "etc" / "inventory.yaml"
    inventory.write_text("nodes: {}\n")
    assert faults(Checked("inventory", inventory)) == []
    theirs = root_dir / "theirs"  # a user's dir, root's file in it: the user may swap it
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    (theirs / "python").write_text("")
    link = root_dir / "python"
    link.symlink_to(theirs / "python")
    assert faults(Checked("interpreter", link)) == [
        (str(theirs), f"is owned by {OTHER} (uid {OTHER}), not root")
    ]


def test_a_fifo_given_as_the_inventory_is_refused_before_it_is_read(root_dir: Path):
    fifo = root_dir / "inventory.yaml"
    os.mkfifo(fifo, 0o600)
    (found,) = untrusted([Checked("inventory", fifo, regular_file=True)])
    assert found.why.startswith("is not a regular file")


def test_only_root_is_refused_and_the_check_covers_what_this_interpreter_runs_from(
    tmp_path: Path,
):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    (loose / "inventory.yaml").write_text("nodes: {}\n")
    assert refusal(loose / "inventory.yaml", euid=1000) == []  # no one's rights to gain
    checks = {(c.what, str(c.path)) for c in running_paths(loose / "inventory.yaml")}
    import mlx_medic

    assert {
        ("interpreter", sys.executable),
        ("virtualenv", sys.prefix),
        ("inventory", str(loose / "inventory.yaml")),
    } <= checks
    assert ("package", mlx_medic.__path__[0]) in checks
    assert {path for what, path in checks if what == "import path"} >= {p for p in sys.path if p}


def exporter(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-m", "mlx_medic.cli", "exporter", "--once", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_the_root_exporter_refuses_an_inventory_in_a_0777_dir_and_says_why(root_dir: Path):
    loose = root_dir / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    inventory = loose / "inventory.yaml"
    inventory.write_text("nodes: {n1: {ssh: 127.0.0.2}}\nmodels: {}\n")
    result = exporter(
        "--inventory", str(inventory), "--node", "n1", "--state-dir", str(root_dir / "state")
    )
    assert result.returncode == 2 and result.stdout == ""
    assert (
        f"refusing to run as root: the inventory {inventory}: {loose} is world-writable"
        " (owner root, mode drwxrwxrwx 0777)"
    ) in result.stderr


def test_a_fifo_at_a_log_path_in_a_tmp_dir_or_as_a_tmp_dir_is_reported_never_read(
    root_dir: Path,
):
    """Each would block a read for ever: O_NONBLOCK, no link followed, a type check first."""
    logs, tmp, launch, state = (root_dir / n for n in ("logs", "tmp", "launch", "state"))
    for directory in (logs, tmp, launch, state):
        directory.mkdir()
    os.mkfifo(logs / "m.err.log")  # the service's user owns its log dir: anything may be here
    os.mkfifo(tmp / "tmpfifo")
    os.mkfifo(launch / "tmp.Fifo000001")
    os.mkfifo(root_dir / "tmpdir")  # a tmp dir's path holding a FIFO
    os.mkfifo(state / "logs-positions.json")
    inventory = root_dir / "inventory.yaml"
    inventory.write_text(f"""\
state_dir: {state}
nodes: {{n1: {{ssh: 127.0.0.2}}}}
models:
  m:
    model: /models/m
    nodes: [n1]
    port: 18081
    service: {{manager: supervisord, label: m}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
    tmp_dirs: [{tmp}, {root_dir / "tmpdir"}]
    log_files: [{logs / "m.err.log"}]
launch_temp_dirs: [{launch}]
""")
    result = exporter("--inventory", str(inventory), "--node", "n1")
    assert result.returncode == 0, result.stderr
    metrics = result.stdout
    assert f'mlx_log_file_readable{{file="{logs / "m.err.log"}",node="n1"}} 0.0' in metrics
    assert f'mlx_stale_tmp_dir_readable{{dir="{root_dir / "tmpdir"}",node="n1"}} 0.0' in metrics
    assert f'mlx_stale_tmp_dir_readable{{dir="{tmp}",node="n1"}} 1.0' in metrics
    assert "not a regular file" in result.stderr
