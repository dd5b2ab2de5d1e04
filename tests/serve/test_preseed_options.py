"""`serve.preseed.command` (an argv launched instead of mlx_lm share, its placeholders
whole words), `serve.preseed.compare: sha256` (the room helper's digests, judged on a real
dir) and the staging's progress in the log, at most every few seconds."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mlx_medic.node.replies import Fields, RoomReply
from mlx_medic.node.room import room, weights_manifest
from mlx_medic.serve.launch import launch_argv
from mlx_medic.serve.preseed import Progress, judge_rooms, stage_command
from tests.serve.inventories import inventory

RING = "{ring: {hostfile: /etc/ring.json}}"
MORE = "    cache_dirs: [/models]\n"


def tiny(tmp_path: Path, preseed: str):
    return inventory(
        tmp_path, backends=RING, serve=f"{{preseed: {{enabled: true, {preseed}}}}}", more=MORE
    )


@pytest.mark.parametrize(
    ("preseed", "error"),
    [
        ("command: [cp, '{path}']", "its first word 'cp' must be an absolute executable"),
        ("command: ['/bin/cp', '{paths}']", "'{paths}' holds {paths}: a placeholder is a whole"),
        ("command: ['/bin/cp', '--from={path}']", "'--from={path}' holds {path}"),
        ("command: []", "at least 1 item"),
        ("compare: md5", "Input should be 'sizes' or 'sha256'"),
    ],
)
def test_a_bad_command_or_compare_is_refused_naming_the_field(
    tmp_path: Path, preseed: str, error: str
) -> None:
    with pytest.raises(Exception) as refused:
        tiny(tmp_path, preseed)
    text = str(refused.value)
    assert error in text and "preseed" in text, text
    assert ("compare" if "compare" in preseed else "command") in text


def test_the_command_runs_as_its_own_argv_under_the_rank_guard_with_whole_word_placeholders(
    tmp_path: Path,
) -> None:
    inv = tiny(
        tmp_path,
        "command: ['/opt/stage', --from, '{head}', '{path}', '{tmpdir}', '{\"k\": 1}']",
    )
    model = inv.model("tiny")
    command, python_args, name = stage_command(inv, model)
    assert command == [
        "/opt/stage",
        "--from",
        "127.0.0.2",
        "/models/tiny",
        "/models",
        '{"k": 1}',  # braces that are no placeholder's shape stay as they are
    ] and (python_args, name) == (False, "stage")
    from mlx_medic.inventory.model import Backend

    argv = launch_argv(
        inv, model, "ring", Backend(hostfile=Path("/s.json")), "R", command, python_args
    )
    rank = argv[argv.index("--", argv.index("--") + 1) + 1 :]  # after mlx.launch's `--`
    assert rank[-len(command) - 1 :] == ["--", *command]
    assert "--python-args" not in rank and "--run" in rank  # the guard execs it directly
    assert "--env" in argv and "MLX_MEDIC_RUN_ID=R" in argv

    default = tiny(tmp_path, "compare: sizes")
    share, python_args, name = stage_command(default, default.model("tiny"))
    assert share == ["-m", "mlx_lm", "share", "--path", "/models/tiny", "--tmpdir", "/models"]
    assert (python_args, name) == (True, "mlx_lm.share")


def test_with_sha256_a_copy_of_the_same_sizes_but_other_content_is_not_the_heads(
    tmp_path: Path,
) -> None:
    head, peer = tmp_path / "head" / "tiny", tmp_path / "peer" / "tiny"
    for where, content in ((head, b"weights-1"), (peer, b"weights-2")):
        (where / "sub").mkdir(parents=True)
        (where / "model.safetensors").write_bytes(content)
        (where / "sub" / "config.json").write_bytes(b"{}")
    assert weights_manifest(head) == weights_manifest(peer)

    def no_tools(argv, timeout):
        raise AssertionError(argv)

    def read(weights: Path, sha256: bool) -> RoomReply:
        found = room(tmp_path, weights, no_tools, "linux", sha256=sha256)
        return RoomReply.parse("node", Fields.of(found))

    assert read(head, False).digests is None  # hashing only when asked
    digests = read(head, True).digests
    assert digests is not None and set(digests) == {"model.safetensors", "sub/config.json"}
    assert digests["sub/config.json"] == (
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )

    by_sizes = tiny(tmp_path, "compare: sizes").model("tiny")
    same = judge_rooms(by_sizes, {"ai001": read(head, False), "ai002": read(peer, False)})
    assert same.receivers == [] and same.shortfalls == []  # sizes cannot tell them apart

    by_digest = tiny(tmp_path, "compare: sha256").model("tiny")
    verdict = judge_rooms(by_digest, {"ai001": read(head, True), "ai002": read(peer, True)})
    assert verdict.shortfalls == [
        "ai002: holds weights at /models/tiny that differ from the head's (SHA-256 of"
        " model.safetensors): remove them, and the next start stages the head's"
    ]
    (peer / "model.safetensors").write_bytes(b"weights-1")
    again = judge_rooms(by_digest, {"ai001": read(head, True), "ai002": read(peer, True)})
    assert again.receivers == [] and again.shortfalls == []
    missing = judge_rooms(by_digest, {"ai001": read(head, True), "ai002": read(peer / "x", True)})
    assert missing.receivers == ["ai002"]


def test_progress_reaches_the_log_at_most_every_few_seconds_and_its_last_line_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    progress = Progress("mlx_lm.share", every=5.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, "mlx_medic.serve")
    for second, line in enumerate(
        [
            "w.bin:   0%|   | 0.00/1.61G [00:00<?, ?B/s]\x1b[A",
            "\rw.bin:   7%|▋  | 105M/1.61G [00:01<00:16, 89.5MB/s]\x1b[A",
            "",
            "w.bin:  13%|█▎ | 210M/1.61G [00:02<00:15, 92.8MB/s]\x1b[A",
            "w.bin:  20%|█▉ | 315M/1.61G [00:03<00:13, 93.1MB/s]\x1b[A",
            "w.bin:  26%|██▌| 419M/1.61G [00:04<00:12, 97.7MB/s]\x1b[A",
            "w.bin:  33%|███▎| 524M/1.61G [00:05<00:11, 98.1MB/s]\x1b[A",
            "w.bin:  39%|███▉| 629M/1.61G [00:06<00:09, 102MB/s]\x1b[A",
        ]
    ):
        now[0] = float(second)
        progress.line(line)
    progress.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "preseed: mlx_lm.share: w.bin:   0%|   | 0.00/1.61G [00:00<?, ?B/s]",
        "preseed: mlx_lm.share: w.bin:  26%|██▌| 419M/1.61G [00:04<00:12, 97.7MB/s]",
        "preseed: mlx_lm.share: w.bin:  39%|███▉| 629M/1.61G [00:06<00:09, 102MB/s]",
    ]
