"""The room check before a start: memory on every node, staging space on each node that
receives the weights, every shortfall named with its node; and the node's reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_medic.node.replies import Fields, RoomReply
from mlx_medic.node.room import MEMORY_SEAM, memory_needed, room, weights_manifest
from mlx_medic.platform.commands import ParseError
from mlx_medic.platform.macos_memory import WIRED_LIMIT_ARGV, parse_wired_limit_bytes
from mlx_medic.serve.nodes import StartRefused
from mlx_medic.serve.preseed import judge_rooms, share_hostfile
from tests.exporter.macos_commands import macos_output
from tests.serve.inventories import inventory

GIB = 2**30
WEIGHTS = {"config.json": 1000, "model.safetensors": 9 * GIB}


def tiny(tmp_path: Path, serve: str = "{preseed: {enabled: true}}", more: str = ""):
    return inventory(
        tmp_path,
        backends=f"{{ring: {{hostfile: {tmp_path / 'ring.json'}}}}}",
        serve=serve,
        more=f"    cache_dirs: [/models]\n{more}",
    ).model("tiny")


def reply(available: int, weights: dict[str, int] | None, free: int = 100 * GIB, **more):
    return RoomReply(available, weights=weights, staging_dir="/models", free_bytes=free, **more)


def test_a_rank_needs_its_share_of_the_weights_plus_a_fifth_unless_the_inventory_says(
    tmp_path: Path,
) -> None:
    model = tiny(tmp_path)
    assert memory_needed(model, 10 * GIB) == round(10 * GIB / 2 * 1.2)
    assert memory_needed(model, None) is None
    assert memory_needed(tiny(tmp_path, "{memory_needed: 40GiB}"), 10 * GIB) == 40 * GIB


def test_a_peer_without_the_weights_receives_them_and_one_with_the_same_manifest_is_skipped(
    tmp_path: Path,
) -> None:
    model = tiny(tmp_path)
    verdict = judge_rooms(
        model, {"ai001": reply(64 * GIB, WEIGHTS), "ai002": reply(64 * GIB, None)}
    )
    assert verdict.receivers == ["ai002"] and verdict.shortfalls == []
    assert verdict.weights_bytes == sum(WEIGHTS.values())
    same = judge_rooms(
        model, {"ai001": reply(64 * GIB, WEIGHTS), "ai002": reply(64 * GIB, WEIGHTS)}
    )
    assert same.receivers == [] and same.shortfalls == []


def test_each_shortfall_names_its_node_and_the_bytes_short(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    needed = memory_needed(model, sum(WEIGHTS.values()))
    assert needed is not None
    verdict = judge_rooms(
        model,
        {"ai001": reply(64 * GIB, WEIGHTS), "ai002": reply(GIB, None, free=GIB)},
    )
    size = sum(WEIGHTS.values())
    assert verdict.shortfalls == [
        f"ai002: {GIB} bytes of memory available, the model needs {needed} ({needed - GIB} short)",
        f"ai002: /models has {GIB} bytes free, the weights need {size} ({size - GIB} short)",
    ]


def test_the_gpu_wired_limit_caps_the_memory_a_rank_may_take(tmp_path: Path) -> None:
    capped = reply(64 * GIB, WEIGHTS, wired_limit_bytes=GIB)
    assert capped.usable_memory == GIB
    verdict = judge_rooms(tiny(tmp_path), {"ai001": capped, "ai002": reply(64 * GIB, WEIGHTS)})
    assert verdict.shortfalls[0].startswith(
        f"ai001: {GIB} bytes of memory available (the GPU's wired limit)"
    )


def test_other_weights_in_place_or_no_staging_dir_or_none_on_the_head_stop_the_start(
    tmp_path: Path,
) -> None:
    model = tiny(tmp_path)
    other = judge_rooms(
        model, {"ai001": reply(64 * GIB, WEIGHTS), "ai002": reply(64 * GIB, {"x": 1})}
    )
    assert "ai002: holds weights at /models/tiny that differ from the head's" in other.shortfalls[0]
    missing = RoomReply(64 * GIB, staging_dir="/models", staging_exists=False, free_bytes=GIB)
    nodir = judge_rooms(model, {"ai001": reply(64 * GIB, WEIGHTS), "ai002": missing})
    assert nodir.shortfalls == [
        "ai002: /models does not exist: make it"
        " (share stages the weights in it, beside where they go)"
    ]
    headless = judge_rooms(model, {"ai001": reply(64 * GIB, None), "ai002": reply(64 * GIB, None)})
    assert headless.shortfalls == [
        "ai001: the head holds no weights at /models/tiny: nothing to stage from"
    ]


def test_without_preseed_only_memory_is_judged(tmp_path: Path) -> None:
    model = tiny(tmp_path, "{}")
    verdict = judge_rooms(
        model, {"ai001": reply(64 * GIB, WEIGHTS), "ai002": reply(64 * GIB, None, free=0)}
    )
    assert verdict.receivers == [] and verdict.shortfalls == []


def test_preseed_is_refused_where_a_killed_shares_dir_would_escape_the_clean(
    tmp_path: Path,
) -> None:
    with pytest.raises(Exception, match="list it in tmp_dirs or cache_dirs"):
        inventory(tmp_path, serve="{preseed: {enabled: true}}")
    with pytest.raises(Exception, match="needs the ring backend"):
        inventory(
            tmp_path, backends="{jaccl: {hostfile: /j.json}}", serve="{preseed: {enabled: true}}"
        )


def test_the_share_hostfile_holds_the_ring_rows_of_the_head_and_the_receivers(
    tmp_path: Path,
) -> None:
    (tmp_path / "ring.json").write_text('[{"ssh": "a", "ips": ["1"]}, {"ssh": "b", "ips": ["2"]}]')
    model = tiny(tmp_path)
    path = share_hostfile(model, ["ai001", "ai002"], tmp_path / "share.json")
    assert path.read_text() == '[{"ssh": "a", "ips": ["1"]}, {"ssh": "b", "ips": ["2"]}]'
    (tmp_path / "ring.json").write_text('[{"ssh": "a", "ips": ["1"]}]')
    with pytest.raises(StartRefused, match="has 1 rows for 2 nodes"):
        share_hostfile(model, ["ai001"], tmp_path / "share.json")


def test_the_wired_limit_of_the_default_policy_is_no_cap_and_garbage_is_an_error() -> None:
    assert parse_wired_limit_bytes(macos_output("sysctl_iogpu_wired_limit_mb_default.txt")) is None
    with pytest.raises(ParseError, match=r"iogpu\.wired_limit_mb: N"):
        parse_wired_limit_bytes("sysctl: unknown oid 'iogpu.wired_limit_mb'")


def test_the_node_reads_its_weights_its_staging_space_and_the_memory_seam(tmp_path: Path) -> None:
    weights = tmp_path / "hub" / "tiny"
    (weights / "sub").mkdir(parents=True)
    (weights / "a.bin").write_bytes(b"12345")
    (weights / "sub" / "b.json").write_bytes(b"{}")
    (weights / "link").symlink_to("a.bin")
    assert weights_manifest(weights) == {"a.bin": 5, "sub/b.json": 2}
    assert weights_manifest(tmp_path / "absent") is None

    def no_tools(argv, timeout):  # Linux: sysctl is never asked
        raise AssertionError(argv)

    (tmp_path / MEMORY_SEAM).parent.mkdir()
    (tmp_path / MEMORY_SEAM).write_text("1000\n")
    found = room(tmp_path, weights, no_tools, "linux")
    assert found["memory"] == {
        "available_bytes": 1000,
        "seam": str(tmp_path / MEMORY_SEAM),
        "wired_limit_bytes": None,
    }
    assert found["weights"]["bytes"] == 7
    assert found["staging"]["dir"] == str(tmp_path / "hub") and found["staging"]["exists"]
    parsed = RoomReply.parse("ai002", Fields.of(found))
    assert parsed.available_bytes == 1000 and parsed.weights == {"a.bin": 5, "sub/b.json": 2}
    (tmp_path / MEMORY_SEAM).write_text("lots")
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        room(tmp_path, weights, no_tools, "linux")
    assert WIRED_LIMIT_ARGV == ("sysctl", "iogpu.wired_limit_mb")
