"""A node's state dir has one layout (docs/state-layout.md): everything in it belongs to the
node's login user with group `mlx-medic`, dirs 2750, files 0640, whichever component
makes it and in whichever order they start; what root makes is the login user's, so the
node helpers can always take the locks the root exporter made; what an older version
left wrong is corrected by root and named to whoever cannot use it.

The three-user tests run the real components as three users in a private mount namespace
(tests/private_state_dir.py); the rest runs here as root, with a uid no user has.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlx_medic.node.record_lock import exclusive
from mlx_medic.state.files import read_text_nofollow, write_text_atomic
from mlx_medic.state.layout import (
    DIR_MODE,
    DIRS,
    FILE_MODE,
    Owner,
    StateFileError,
    ensure_dir,
    node_owner,
    open_lock_file,
    prepare_state_dir,
)
from tests.remediator.private_etc import in_private_etc
from tests.tools import require_tool

NODE_USER = Owner(4242, 4243)  # no user of this machine: ownership by number alone
LAYOUT = {"dir": "medic:mlx-medic 2750", "file": "medic:mlx-medic 0640"}


def scenario(tmp_path_factory: pytest.TempPathFactory, name: str) -> dict[str, Any]:
    return in_private_etc(tmp_path_factory.mktemp(name), name, 240, "tests.private_state_dir")


def normalized(layout: dict[str, str], port: int) -> dict[str, str]:
    """A layout with the probe lock's port taken out, to compare two runs."""
    return {name.replace(f"-{port}.lock", "-PORT.lock"): said for name, said in layout.items()}


def as_the_layout_says(layout: dict[str, str]) -> bool:
    return all(
        said == LAYOUT["file" if name.endswith((".lock", ".guard", ".current")) else "dir"]
        for name, said in layout.items()
    )


# --- three users: the exporter (root), the node's login user, the remediator's user -----


@pytest.fixture(scope="module")
def exporter_first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return scenario(tmp_path_factory, "exporter_first")


@pytest.fixture(scope="module")
def remediator_first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return scenario(tmp_path_factory, "remediator_first")


@pytest.fixture(scope="module")
def older_version(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return scenario(tmp_path_factory, "after_an_older_version")


def test_the_node_user_takes_the_model_lock_and_the_probe_lock_the_root_exporter_made(
    exporter_first: dict[str, Any],
) -> None:
    """The root exporter's service collector makes locks/ and probes (its probe lock);
    then the node's login user takes the model lock and the probe lock in that dir."""
    probe, lock = exporter_first["probe"], exporter_first["lock"]
    assert probe["code"] == 1 and '"conclusive": true' in probe["out"], probe  # down, locked
    assert lock["take"]["code"] == 0 and '"done": true' in lock["take"]["out"], lock
    assert lock["release"]["code"] == 0, lock
    state = exporter_first["state_dir"]
    port = exporter_first["host"]["port"]
    assert state[f"locks/probe-127.0.0.1-{port}.lock"] == "medic:mlx-medic 0640"
    assert state["locks"] == state["."] == "medic:mlx-medic 2750"
    assert {".", *DIRS} <= set(state) and as_the_layout_says(state), state


def test_remediator_first_the_node_user_is_told_who_must_make_the_state_dir_then_it_works(
    remediator_first: dict[str, Any],
) -> None:
    refused = remediator_first["probe_before_any_state_dir"]
    assert refused["code"] == 2, refused  # no verdict: the remediator does nothing on it
    assert (
        "cannot create /var/lib/mlx-medic: Permission denied (/var/lib is root:root 0755;"
        " this process runs as medic); /var/lib/mlx-medic should be medic:mlx-medic 2750"
    ) in refused["err"]
    assert "the exporter (root) makes the state dir" in refused["err"]
    assert remediator_first["tmpfiles"]["code"] == 0, remediator_first["tmpfiles"]
    for probe in ("probe", "probe_after_exporter"):
        assert remediator_first[probe]["code"] == 1, remediator_first[probe]
    for lock in ("lock", "lock_after_exporter"):
        assert remediator_first[lock]["take"]["code"] == 0, remediator_first[lock]


def test_the_exporter_started_last_finds_nothing_to_correct(
    remediator_first: dict[str, Any],
) -> None:
    assert not [line for line in remediator_first["exporter"]["logged"] if "correct" in line]
    assert remediator_first["state_dir"] == remediator_first["state_dir_before_exporter"]


def test_either_order_ends_in_the_same_layout(
    exporter_first: dict[str, Any],
    remediator_first: dict[str, Any],
) -> None:
    first = normalized(exporter_first["state_dir"], exporter_first["host"]["port"])
    last = normalized(remediator_first["state_dir"], remediator_first["host"]["port"])
    assert first == last and as_the_layout_says(first), (first, last)


def test_the_remediator_keeps_its_journal_0640_in_its_own_dir_in_either_order(
    exporter_first: dict[str, Any],
    remediator_first: dict[str, Any],
) -> None:
    for seen in (exporter_first, remediator_first):
        assert seen["pause"]["code"] == 0, seen["pause"]
        assert seen["remediator_dir"] == {
            ".": "mlx-medic:mlx-medic 0755",
            "journal.sqlite": "mlx-medic:mlx-medic 0640",
        }
        assert not any("journal" in name for name in seen["state_dir"])


def test_a_node_user_that_cannot_use_a_root_made_lock_dir_is_told_whose_it_is(
    older_version: dict[str, Any],
) -> None:
    """What today's units leave: StateDirectory= (root 0755), locks/ 0700, a probe lock
    0600, root's records 0644."""
    assert older_version["left"]["locks"] == "root:root 0700"
    refused = older_version["lock_before"]["take"]
    assert refused["code"] == 1, refused
    assert (
        "cannot write in /var/lib/mlx-medic/locks: Permission denied"
        " (/var/lib/mlx-medic/locks is root:root 0700; this process runs as medic);"
        " /var/lib/mlx-medic/locks should be medic:mlx-medic 2750"
    ) in refused["err"]
    assert older_version["probe_before"]["code"] == 2, older_version["probe_before"]


def test_the_root_exporter_corrects_what_an_older_version_left_and_says_so(
    older_version: dict[str, Any],
) -> None:
    corrected = [
        line for line in older_version["exporter"]["logged"] if line.startswith("corrected ")
    ]
    wrong = [name for name, said in older_version["left"].items() if said.startswith("root")]
    assert len(corrected) == len(wrong), corrected
    port = older_version["host"]["port"]
    assert (
        f"corrected /var/lib/mlx-medic/locks/probe-127.0.0.1-{port}.lock: root:root 0600"
        " -> medic:mlx-medic 0640"
    ) in "\n".join(corrected)
    assert older_version["lock"]["take"]["code"] == 0, older_version["lock"]
    assert older_version["probe"]["code"] == 1, older_version["probe"]
    assert as_the_layout_says(older_version["state_dir"]), older_version["state_dir"]


def test_the_rendered_tmpfiles_line_gives_back_a_state_dir_another_unit_reowned(
    older_version: dict[str, Any],
) -> None:
    assert older_version["reowned"] == "root:root 2750"
    assert older_version["tmpfiles"]["code"] == 0, older_version["tmpfiles"]
    assert older_version["after_tmpfiles"] == "medic:mlx-medic 2750"


# --- the layout's functions, as root, for a uid no user has -----------------------------


@pytest.fixture
def shared() -> Iterator[Path]:
    """A dir another uid can reach (pytest's own tmp dirs are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="mlx-medic-layout-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def said(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def as_uid(owner: Owner, *argv: str) -> subprocess.CompletedProcess[str]:
    setpriv = require_tool("setpriv")
    return subprocess.run(
        [setpriv, f"--reuid={owner.uid}", f"--regid={owner.gid}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_prepare_makes_the_state_dir_and_its_dirs_for_the_owner_named(tmp_path: Path) -> None:
    state = tmp_path / "deep" / "state"
    prepared = prepare_state_dir(state, NODE_USER)
    assert said(state) == (4242, 4243, DIR_MODE)
    assert all(said(state / part) == (4242, 4243, DIR_MODE) for part in DIRS)
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o755  # above it: as tmpfiles.d
    assert prepared.corrected == prepared.left == []
    again = prepare_state_dir(state, NODE_USER)  # whoever starts next: nothing to do
    assert again.corrected == again.left == []


def test_what_root_writes_in_the_state_dir_belongs_to_the_dirs_owner(tmp_path: Path) -> None:
    state = tmp_path / "state"
    prepare_state_dir(state, NODE_USER)
    record = write_text_atomic(state / "runs" / "m1.current", "r1\n")
    new_dir_record = write_text_atomic(state / "runs" / "ranks" / "deeper" / "x.json", "{}")
    assert said(record) == said(new_dir_record) == (4242, 4243, FILE_MODE)
    assert said(new_dir_record.parent) == (4242, 4243, DIR_MODE)
    fd = open_lock_file(state / "locks" / "probe-127.0.0.1-8080.lock")
    os.close(fd)
    with exclusive(state / "locks" / "m1.lock.guard"):
        pass
    for name in ("probe-127.0.0.1-8080.lock", "m1.lock.guard"):
        assert said(state / "locks" / name) == (4242, 4243, FILE_MODE)


def test_a_record_is_0640_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        path = write_text_atomic(tmp_path / "backend" / "m1.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == FILE_MODE
    assert stat.S_IMODE(path.parent.stat().st_mode) == DIR_MODE


def test_another_uid_can_flock_the_probe_lock_root_made(shared: Path) -> None:
    prepare_state_dir(shared / "state", NODE_USER)
    lock = shared / "state" / "locks" / "probe-127.0.0.1-8080.lock"
    os.close(open_lock_file(lock))
    flock = require_tool("flock")
    taken = as_uid(NODE_USER, flock, "--nonblock", str(lock), "true")
    assert taken.returncode == 0, taken.stderr
    stranger = as_uid(Owner(4244, 4244), flock, "--nonblock", str(lock), "true")
    assert stranger.returncode != 0  # not the owner, not in the group: no access at all


def test_root_gives_a_lock_dir_and_lock_it_once_made_0700_0600_to_the_state_dirs_owner(
    shared: Path,
) -> None:
    state = shared / "state"
    prepare_state_dir(state, NODE_USER)
    shutil.rmtree(state / "locks")
    (state / "locks").mkdir(mode=0o700)  # today's exporter, as root
    lock = state / "locks" / "probe-127.0.0.1-8080.lock"
    lock.touch(0o600)
    os.close(open_lock_file(lock))  # the exporter's next probe
    assert said(state / "locks") == (4242, 4243, DIR_MODE)
    assert said(lock) == (4242, 4243, FILE_MODE)
    assert as_uid(NODE_USER, require_tool("flock"), "-n", str(lock), "true").returncode == 0


def test_the_repair_leaves_links_hard_links_fifos_and_other_users_files_untouched(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.write_text("root's own\n")
    outside.chmod(0o600)
    state = tmp_path / "state"
    state.mkdir()
    (state / "link").symlink_to(outside)
    os.link(outside, state / "hard")
    os.mkfifo(state / "fifo")
    other = state / "theirs.json"
    other.write_text("{}")
    os.chown(other, 5000, 5000)
    root_made = state / "pd-ledger.lock"
    root_made.touch(0o600)
    prepared = prepare_state_dir(state, NODE_USER)
    assert said(outside) == (0, 0, 0o600)  # neither the link nor the hard link led there
    assert said(other)[:2] == (5000, 5000) and said(state / "fifo")[0] == 0
    assert said(root_made) == (4242, 4243, FILE_MODE)
    left = "\n".join(prepared.left)
    assert f"{state / 'hard'}: has 2 links; left as it is" in left
    assert f"{other}: belongs to uid 5000:gid 5000 0644; left as it is" in left
    assert f"{state / 'fifo'}: not a file or a dir" in left
    assert any(line.startswith(f"{root_made}: root:root 0600 -> ") for line in prepared.corrected)


def test_a_lock_that_is_a_fifo_or_a_symlink_is_refused_by_name(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.lock")
    (tmp_path / "link.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateFileError, match=r"fifo\.lock as a lock: not a regular file"):
        open_lock_file(tmp_path / "fifo.lock")
    with pytest.raises(StateFileError, match=r"link\.lock: it is a symlink"):
        open_lock_file(tmp_path / "link.lock")
    assert not (tmp_path / "elsewhere").exists()


def test_a_file_in_the_way_of_a_dir_is_named(tmp_path: Path) -> None:
    (tmp_path / "locks").write_text("")
    with pytest.raises(StateFileError, match=re.escape(f"{tmp_path / 'locks'} is in the way")):
        ensure_dir(tmp_path / "locks" / "deeper")


def test_without_an_mlx_medic_group_the_owner_has_the_login_users_primary_group() -> None:
    assert node_owner("root", group="no-such-group-here") == Owner(0, 0)
    with pytest.raises(StateFileError, match=r"'no-such-user' .* is no user on this machine"):
        node_owner("no-such-user")


def test_a_log_positions_file_that_is_a_fifo_is_not_read(tmp_path: Path) -> None:
    """The root exporter reads its log positions without following what the node user
    may plant in its own dir (a FIFO would hang it)."""
    os.mkfifo(tmp_path / "logs-positions.json")
    with pytest.raises(StateFileError, match="not a regular file"):
        read_text_nofollow(tmp_path / "logs-positions.json")
