"""`serve.preseed` and the room check for real: the tiny model's weights in each node's own
cache dir (the testbed's per-node `cache`), only the head holding them at first, staged
with the real `mlx_lm share` over real mlx.launch (ring) by `mlx-medic serve`, or with an
inventory-named `serve.preseed.command` (a script run as a rank on each node)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlx_medic.node.room import MEMORY_SEAM, weights_manifest
from testbed import Cluster, processes
from tests.serve.scenario import NODES, Served, prepare, wait_until

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


PADDING = 512 * 1024 * 1024  # a sparse file: a transfer of some seconds, to stop mid-way


@pytest.fixture
def preseeded(clean_cluster: Cluster, tiny_model: Path) -> Iterator[Served]:
    served = preseed_scenario(clean_cluster, tiny_model, {"enabled": True})
    yield served
    served.close()


def preseed_scenario(cluster: Cluster, tiny_model: Path, preseed: dict[str, Any]) -> Served:
    """The model at `<cache>/hub/tiny` on every node, present on the head only; share
    stages in `<cache>/hub`, a cache dir of the model whose stale age is 1s. Ring only:
    each start here is about the weights, not the fallback from JACCL."""
    clean_cluster = cluster
    hub = clean_cluster.node("ai001").cache_mount / "hub"
    ring = clean_cluster.workdir / f"preseed-ring-{uuid.uuid4().hex[:8]}.json"
    clean_cluster.hostfile(ring, list(NODES))
    served = prepare(
        clean_cluster,
        tiny_model,
        ring_hostfile=ring,
        serve={"preseed": preseed},
        checkout_on_nodes=True,
        extra_model={
            "model": str(hub / "tiny"),
            "backends": {"ring": {"hostfile": str(ring), "pipeline": True}},  # no JACCL try
            "cache_dirs": [str(hub)],
            "policy": {
                "kill_grace": "3s",
                "stop_timeout": "40s",
                "start_timeout": "5m",
                "stale_tmp_age": "1s",
            },
        },
    )
    for node in clean_cluster.nodes:
        node_hub = node.host_path(hub)
        node_hub.mkdir()
        if clean_cluster.node_user is not None:
            os.chown(node_hub, clean_cluster.node_user.uid, clean_cluster.node_user.gid)
    shutil.copytree(tiny_model, served.head.host_path(hub / "tiny"))
    if clean_cluster.node_user is not None:
        for path in [
            served.head.host_path(hub / "tiny"),
            *served.head.host_path(hub / "tiny").rglob("*"),
        ]:
            os.chown(path, clean_cluster.node_user.uid, clean_cluster.node_user.gid)
    return served


def weights_on(served: Served, node: str) -> Path:
    return served.cluster.node(node).host_path(served.head.cache_mount / "hub" / "tiny")


def staged_dirs(served: Served, node: str) -> list[str]:
    hub = served.cluster.node(node).host_path(served.head.cache_mount / "hub")
    return sorted(p.name for p in hub.iterdir() if p.name.startswith("tmp"))


def share_ranks(served: Served) -> list[int]:
    return [
        pid
        for node in ("ai001", "ai002")
        for pid in served.cluster.node(node).find_pids(" share ")
        if "mlx_lm" in processes.cmdline(pid)
    ]


def staged_to_ai002(output: str) -> bool:
    return "preseed: staged " in output and " bytes to ai002 in " in output


def start_until_mid_share(served: Served) -> tuple[subprocess.Popen[bytes], int]:
    """A wrapper started with a padding file in the head's weights, once share's `tmp*`
    dir is on ai002 (the transfer under way)."""
    with (weights_on(served, "ai001") / "padding.bin").open("wb") as out:
        out.truncate(PADDING)
    popen, wrapper = served.start_direct()
    wait_until(lambda: staged_dirs(served, "ai002") != [], 120, "share's tmp dir on ai002")
    return popen, wrapper


def share_launcher(served: Served) -> int:
    launchers = [
        pid
        for pid in served.launchers()
        if "share" in processes.cmdline(pid) and processes.is_alive(pid)
    ]
    assert len(launchers) == 1, launchers
    return launchers[0]


def serve_until_serving(served: Served) -> str:
    """One wrapper until it serves, then SIGTERM; its run's output."""
    before = len(served.output())
    record = served.record()
    popen, wrapper = served.start_direct()
    try:
        served.wait_serving(timeout=270, run_id=record.run_id if record else None)
    finally:
        processes.kill_quietly(wrapper, signal.SIGTERM)
        popen.wait(timeout=60)
    return served.output()[before:]


@pytest.mark.timeout(600)  # two starts, each up to wait_serving's limit on a busy machine
def test_a_peer_without_the_weights_receives_them_with_mlx_lm_share_and_a_second_start_skips(
    preseeded: Served,
):
    assert not weights_on(preseeded, "ai002").exists()
    first = serve_until_serving(preseeded)
    assert "preseed: staging" in first and "with mlx_lm.share" in first, first[-3000:]
    assert staged_to_ai002(first), first[-3000:]
    assert "preseed: mlx_lm.share: Files:" in first  # share's own progress, in the log
    assert weights_manifest(weights_on(preseeded, "ai002")) == weights_manifest(
        weights_on(preseeded, "ai001")
    )
    assert staged_dirs(preseeded, "ai002") == []

    second = serve_until_serving(preseeded)
    assert "preseed skipped: every node holds the head's weights" in second, second[-3000:]
    assert "preseed: staging" not in second
    assert share_ranks(preseeded) == []


@pytest.mark.timeout(600)  # a failed start, then one that serves
def test_a_share_whose_launcher_is_sigkilled_leaves_no_rank_and_no_partial_dir_after_the_next_start(
    preseeded: Served,
):
    # A weights file large enough that the transfer is under way when it is killed.
    popen, _ = start_until_mid_share(preseeded)
    processes.kill_quietly(share_launcher(preseeded), signal.SIGKILL)
    popen.wait(timeout=120)
    assert popen.returncode == 1
    assert "preseed: mlx_lm.share failed" in preseeded.output()

    time.sleep(1.5)  # past the model's stale_tmp_age: what the share left is stale
    after = serve_until_serving(preseeded)
    assert staged_to_ai002(after), after[-3000:]
    assert share_ranks(preseeded) == []
    assert staged_dirs(preseeded, "ai002") == []


@pytest.mark.timeout(300)
def test_a_sigterm_to_the_wrapper_mid_share_ends_the_launcher_and_every_rank(
    preseeded: Served,
):
    popen, wrapper = start_until_mid_share(preseeded)
    launcher = share_launcher(preseeded)
    assert share_ranks(preseeded), "no share rank under way"
    processes.kill_quietly(wrapper, signal.SIGTERM)  # a person stops the service
    popen.wait(timeout=120)
    output = preseeded.output()
    assert popen.returncode == 0 and "preseed: stopped after" in output, output[-3000:]
    assert not processes.is_alive(launcher)
    assert share_ranks(preseeded) == [] and preseeded.launchers() == []
    assert not weights_on(preseeded, "ai002").exists()


@pytest.mark.timeout(300)
def test_an_inventory_named_command_stages_the_weights_as_a_rank_and_the_model_serves(
    clean_cluster: Cluster, tiny_model: Path
):
    """A script run as a rank on the head (rank 0: nothing to do) and on ai002, which
    copies the head's weights through the host's view of its cache into a `tmp*` dir
    beside the weights, then renames it into place; compared by SHA-256."""
    hub = clean_cluster.node("ai001").cache_mount / "hub"
    source = clean_cluster.node("ai001").host_path(hub / "tiny")
    script = clean_cluster.workdir / f"stage-{uuid.uuid4().hex[:8]}.sh"
    script.write_text(
        "#!/bin/sh\n"
        "# stage.sh SOURCE PATH TMPDIR\n"
        "set -e\n"
        '[ "$MLX_RANK" = 0 ] && exit 0\n'
        'echo "rank $MLX_RANK of run $MLX_MEDIC_RUN_ID copying $1 to $2"\n'
        'tmp=$(mktemp -d "$3/tmpstage.XXXXXX")\n'
        'cp -R "$1/." "$tmp/"\n'
        'mv "$tmp" "$2"\n'
    )
    script.chmod(0o755)
    command = [str(script), str(source), "{path}", "{tmpdir}"]
    served = preseed_scenario(
        clean_cluster, tiny_model, {"enabled": True, "command": command, "compare": "sha256"}
    )
    try:
        output = serve_until_serving(served)
        assert f"with {script.name}: " in output, output[-3000:]
        assert "rank 1 of run " in output and "copying" in output, output[-3000:]
        assert staged_to_ai002(output), output[-3000:]
        assert "(same file names and sizes and SHA-256)" in output
        assert weights_manifest(weights_on(served, "ai002")) == weights_manifest(source)
        assert staged_dirs(served, "ai002") == []
    finally:
        served.close()


def test_too_little_space_on_a_peer_stops_the_start_before_any_transfer_or_rank(
    preseeded: Served,
):
    peer = preseeded.cluster.node("ai002")
    hub = str(preseeded.head.cache_mount / "hub")
    subprocess.run(
        peer.nsenter_argv("mount", "-t", "tmpfs", "-o", "size=64k,mode=1777", "tmpfs", hub),
        check=True,
    )
    try:
        result = preseeded.run_direct(timeout=180)
    finally:
        subprocess.run(peer.nsenter_argv("umount", hub), check=True)
    assert result.returncode == 1, result.stderr
    needed = sum((weights_manifest(weights_on(preseeded, "ai001")) or {}).values())
    assert f"ai002: {hub} has 65536 bytes free, the weights need {needed}" in result.stderr
    assert f"({needed - 65536} short)" in result.stderr
    nothing_started(preseeded, result.stdout + result.stderr)


def test_too_little_memory_on_a_peer_stops_the_start_before_any_transfer_or_rank(
    preseeded: Served,
):
    seam = preseeded.cluster.node("ai002").state_dir / MEMORY_SEAM
    seam.parent.mkdir(exist_ok=True)
    seam.write_text("1000\n")
    try:
        result = preseeded.run_direct(timeout=180)
    finally:
        seam.unlink()
    assert result.returncode == 1, result.stderr
    assert "ai002: 1000 bytes of memory available, the model needs" in result.stderr
    assert "memory read from the testbed's seam" in result.stdout + result.stderr
    nothing_started(preseeded, result.stdout + result.stderr)
    assert not weights_on(preseeded, "ai002").exists()


def nothing_started(served: Served, output: str) -> None:
    """No share, no smoke test, no rank: no mlx.launch ran, so no domain was spent."""
    assert "too little room, so nothing is transferred or started" in output
    for never in ("preseed: staging", "smoke test:", "launching on"):
        assert never not in output, output[-3000:]
    assert share_ranks(served) == [] and served.launchers() == []
    assert staged_dirs(served, "ai002") == []
